package agentapi

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"
)

// socketMode is the API socket's permission: the agent's user and group.
const socketMode = 0o660

// maxSocketPathLen is the longest path a unix socket can be bound to
// (sun_path is 108 bytes with the terminating NUL).
const maxSocketPathLen = 107

// liveCheckTimeout bounds the dial that tells a live socket from a stale one.
const liveCheckTimeout = time.Second

// Listen creates the API socket at path and listens on it. The socket is
// made in a fresh directory only the agent can enter (0700), given mode
// 0660 there, and then renamed into place, so at no moment can another
// user connect to it with looser permissions, whatever the process umask.
// A stale socket left by a dead agent is replaced; a socket another
// process still serves is not: Listen fails and says so.
//
// Closing the listener removes the socket only if path is still the file
// this call created (same device and inode), so an agent that stops never
// removes a socket that another agent made since.
func Listen(path string) (net.Listener, error) {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("create API socket directory: %w", err)
	}
	if err := checkReplaceable(path); err != nil {
		return nil, err
	}
	tmpDir, err := os.MkdirTemp(dir, ".s")
	if err != nil {
		return nil, fmt.Errorf("create temporary directory for the API socket: %w", err)
	}
	defer os.RemoveAll(tmpDir)
	tmp := filepath.Join(tmpDir, "s")
	if len(tmp) > maxSocketPathLen {
		return nil, fmt.Errorf("API socket path %s is too long: the socket is first made at %s, %d bytes, and a unix socket path may have %d; choose a shorter --socket-path",
			path, tmp, len(tmp), maxSocketPathLen)
	}
	ln, err := net.Listen("unix", tmp)
	if err != nil {
		return nil, fmt.Errorf("listen on API socket %s (--socket-path): %w", path, err)
	}
	// The file moves to path: closing must not unlink the temporary name
	// (or anything else); ownedListener.Close removes path itself.
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	owned, err := publish(ln, tmp, path)
	if err != nil {
		ln.Close()
		return nil, err
	}
	return owned, nil
}

// publish gives the socket at tmp its mode and renames it to path.
func publish(ln net.Listener, tmp, path string) (*ownedListener, error) {
	if err := os.Chmod(tmp, socketMode); err != nil {
		return nil, fmt.Errorf("chmod API socket: %w", err)
	}
	dev, ino, err := fileID(tmp)
	if err != nil {
		return nil, fmt.Errorf("stat API socket: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return nil, fmt.Errorf("move API socket into place at %s: %w", path, err)
	}
	return &ownedListener{Listener: ln, path: path, dev: dev, ino: ino}, nil
}

// checkReplaceable returns nil when path is absent or a socket nobody
// listens on, and an error saying what to do otherwise.
func checkReplaceable(path string) error {
	fi, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("check API socket %s: %w", path, err)
	}
	if fi.Mode().Type() != fs.ModeSocket {
		return fmt.Errorf("API socket path %s exists and is not a socket: remove it or choose another --socket-path", path)
	}
	conn, err := net.DialTimeout("unix", path, liveCheckTimeout)
	if err == nil {
		conn.Close()
		return fmt.Errorf("another process is serving the agent API on %s: stop it, or give this agent its own --socket-path and --state-dir", path)
	}
	return nil // stale: nobody accepts on it
}

// fileID returns the device and inode of path (not following symlinks).
func fileID(path string) (dev, ino uint64, err error) {
	var st syscall.Stat_t
	if err := syscall.Lstat(path, &st); err != nil {
		return 0, 0, err
	}
	return uint64(st.Dev), st.Ino, nil //nolint:unconvert // Dev is not uint64 on every platform
}

// ownedListener removes its socket file at Close, if it is still its own.
type ownedListener struct {
	net.Listener
	path     string
	dev, ino uint64
	once     sync.Once
}

// Addr is the socket's final path, not the temporary one it was bound at.
func (l *ownedListener) Addr() net.Addr { return &net.UnixAddr{Name: l.path, Net: "unix"} }

// Close closes the listener and removes the socket file if path still
// names the file Listen created.
func (l *ownedListener) Close() error {
	err := l.Listener.Close()
	l.once.Do(func() {
		if dev, ino, serr := fileID(l.path); serr == nil && dev == l.dev && ino == l.ino {
			_ = os.Remove(l.path)
		}
	})
	return err
}
