package kvstore

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strings"
	"time"

	"sigs.k8s.io/yaml"
)

// keyPairFiles are the client certificate entries of an etcd.config file
// (the names etcd's clientv3/yaml reads).
type keyPairFiles struct {
	CertFile string `json:"cert-file"`
	KeyFile  string `json:"key-file"`
}

// clientCertificateReloader returns a GetClientCertificate that reads
// the etcd.config file's cert-file and key-file at each TLS handshake, so
// that a renewed certificate (a rotated cilium-etcd-secrets) is used
// without restarting, as Cilium does. nil when the file names no client
// certificate; an error when it names only one of the two.
func clientCertificateReloader(path string) (func(*tls.CertificateRequestInfo) (*tls.Certificate, error), error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var kp keyPairFiles
	if err := yaml.Unmarshal(b, &kp); err != nil {
		return nil, err
	}
	switch {
	case kp.CertFile == "" && kp.KeyFile == "":
		return nil, nil
	case kp.CertFile == "" || kp.KeyFile == "":
		return nil, fmt.Errorf("cert-file and key-file go together (got cert-file %q, key-file %q): name both for a client certificate, or neither", kp.CertFile, kp.KeyFile)
	}
	return func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
		c, err := tls.LoadX509KeyPair(kp.CertFile, kp.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("etcd client certificate %s, key %s: %w", kp.CertFile, kp.KeyFile, err)
		}
		return &c, nil
	}, nil
}

// explainTLS probes the https endpoints with the client's TLS
// configuration when a request to etcd failed, and returns err with what
// is wrong and what to do if the TLS handshake is the reason (no client
// certificate, a certificate etcd does not accept, an untrusted server);
// else err as it is.
func (c *Client) explainTLS(ctx context.Context, err error) error {
	if c.cfg.TLS == nil || err == nil {
		return err
	}
	for _, ep := range c.cfg.Endpoints {
		u, perr := url.Parse(ep)
		if perr != nil || u.Scheme != "https" {
			continue
		}
		if hint := probeTLS(ctx, u.Host, c.cfg.TLS, c.configFile); hint != nil {
			return fmt.Errorf("%w: %w", err, hint)
		}
	}
	return err
}

// probeTLS makes a TLS connection to host as the etcd client would and
// reads from it briefly (with TLS 1.3 the server rejects a client
// certificate after the handshake). nil if nothing went wrong.
func probeTLS(ctx context.Context, host string, base *tls.Config, configFile string) error {
	cfg := base.Clone()
	if cfg.ServerName == "" {
		if h, _, err := net.SplitHostPort(host); err == nil {
			cfg.ServerName = h
		}
	}
	dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	d := tls.Dialer{Config: cfg}
	conn, err := d.DialContext(dctx, "tcp", host)
	if err == nil {
		_ = conn.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
		_, err = conn.Read(make([]byte, 1))
		conn.Close()
		var ne net.Error
		if err == nil || errors.As(err, &ne) && ne.Timeout() {
			return nil // the server waits for the client: TLS is fine
		}
	}
	var opErr *net.OpError
	if errors.As(err, &opErr) && opErr.Op == "dial" && !strings.Contains(err.Error(), "tls") {
		return nil // not reachable at all: not a TLS problem
	}
	where := "the --kvstore-opt etcd.config file"
	if configFile != "" {
		where = configFile
	}
	msg := err.Error()
	switch {
	case strings.Contains(msg, "certificate required"):
		return fmt.Errorf("TLS to etcd at %s: etcd requires a client certificate and none was sent: set cert-file and key-file in %s (Helm: etcd.ssl=true with etcd-client.crt and etcd-client.key in the Secret cilium-etcd-secrets)", host, where)
	case strings.Contains(msg, "bad certificate"), strings.Contains(msg, "unknown certificate authority"), strings.Contains(msg, "certificate expired"):
		return fmt.Errorf("TLS to etcd at %s: etcd rejected the client certificate (%v): use cert-file and key-file signed by the CA etcd trusts (its --trusted-ca-file) and still valid", host, err)
	case strings.Contains(msg, "x509:"), strings.Contains(msg, "certificate signed by unknown authority"):
		return fmt.Errorf("TLS to etcd at %s: etcd's serving certificate is not trusted (%v): set trusted-ca-file in %s to the CA that signed it (Helm: etcd-client-ca.crt in the Secret cilium-etcd-secrets), and use an endpoint name or IP the certificate is for", host, err, where)
	case strings.Contains(msg, "first record does not look like a TLS handshake"):
		return fmt.Errorf("TLS to etcd at %s: etcd serves plain http there: write the endpoint as http://%s", host, host)
	}
	return fmt.Errorf("TLS to etcd at %s: %w", host, err)
}
