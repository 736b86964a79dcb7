package observer

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"time"
)

// socketMode is the Hubble socket's mode: root and, when it exists, the
// group cilium (as Cilium's agent does).
const socketMode = 0o660

// socketGroup is the group given access to the socket when it exists.
const socketGroup = "cilium"

// listenUnix creates the Hubble socket at path: bound in a private
// directory, given its mode (and group), then renamed into place, so no
// one connects to it with looser permissions. A stale socket is replaced;
// one another process serves is not.
func listenUnix(path string) (net.Listener, error) {
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode().Type() != fs.ModeSocket {
			return nil, fmt.Errorf("hubble socket path %s exists and is not a socket: remove it or choose another --hubble-socket-path", path)
		}
		if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
			c.Close()
			return nil, fmt.Errorf("another process serves the Hubble API on %s: stop it or choose another --hubble-socket-path", path)
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("check hubble socket %s: %w", path, err)
	}
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("create hubble socket directory: %w", err)
	}
	tmpDir, err := os.MkdirTemp(dir, ".hubble")
	if err != nil {
		return nil, fmt.Errorf("create hubble socket: %w", err)
	}
	defer os.RemoveAll(tmpDir)
	tmp := filepath.Join(tmpDir, "s")
	ln, err := net.Listen("unix", tmp)
	if err != nil {
		return nil, fmt.Errorf("listen on hubble socket %s (--hubble-socket-path): %w", path, err)
	}
	ul := ln.(*net.UnixListener)
	ul.SetUnlinkOnClose(false)
	fail := func(err error) (net.Listener, error) {
		ln.Close()
		return nil, err
	}
	if g, err := user.LookupGroup(socketGroup); err == nil {
		if gid, err := strconv.Atoi(g.Gid); err == nil {
			if err := os.Chown(tmp, -1, gid); err != nil {
				return fail(fmt.Errorf("give hubble socket to group %s: %w", socketGroup, err))
			}
		}
	}
	if err := os.Chmod(tmp, socketMode); err != nil {
		return fail(fmt.Errorf("chmod hubble socket: %w", err))
	}
	if err := os.Rename(tmp, path); err != nil {
		return fail(fmt.Errorf("move hubble socket into place at %s: %w", path, err))
	}
	return &unixListener{UnixListener: ul, path: path}, nil
}

// unixListener removes its socket when closed.
type unixListener struct {
	*net.UnixListener
	path string
}

// Addr is the socket's final path.
func (l *unixListener) Addr() net.Addr { return &net.UnixAddr{Name: l.path, Net: "unix"} }

// Close closes the listener and removes the socket.
func (l *unixListener) Close() error {
	err := l.UnixListener.Close()
	_ = os.Remove(l.path)
	return err
}

// serverTLS is the TCP listener's TLS configuration: the certificate is
// read again at each handshake (so a renewed one is used without a
// restart); with client CAs, clients must present a certificate they
// signed.
//
// Errors: a file that cannot be read or parsed now.
func serverTLS(c Config) (*tls.Config, error) {
	load := func() (*tls.Certificate, error) {
		cert, err := tls.LoadX509KeyPair(c.HubbleTLSCertFile, c.HubbleTLSKeyFile)
		if err != nil {
			return nil, fmt.Errorf("load --hubble-tls-cert-file %s and --hubble-tls-key-file %s: %w", c.HubbleTLSCertFile, c.HubbleTLSKeyFile, err)
		}
		return &cert, nil
	}
	if _, err := load(); err != nil {
		return nil, err
	}
	cfg := &tls.Config{
		MinVersion:     tls.VersionTLS13,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return load() },
	}
	if len(c.HubbleTLSClientCAFiles) > 0 {
		pool := x509.NewCertPool()
		for _, f := range c.HubbleTLSClientCAFiles {
			pem, err := os.ReadFile(f)
			if err != nil {
				return nil, fmt.Errorf("read --hubble-tls-client-ca-files: %w", err)
			}
			if !pool.AppendCertsFromPEM(pem) {
				return nil, fmt.Errorf("--hubble-tls-client-ca-files: %s holds no PEM certificate", f)
			}
		}
		cfg.ClientCAs = pool
		cfg.ClientAuth = tls.RequireAndVerifyClientCert
	}
	return cfg, nil
}
