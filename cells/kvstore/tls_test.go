package kvstore

import (
	"context"
	"crypto/x509"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/cells/hive/hivetest"
	"github.com/cellium/cellium/test/harness"
)

// recHealth keeps the last report.
type recHealth struct {
	mu       sync.Mutex
	degraded bool
	err      string
}

func (h *recHealth) OK(string) { h.mu.Lock(); defer h.mu.Unlock(); h.degraded, h.err = false, "" }
func (h *recHealth) Degraded(_ string, err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.degraded, h.err = true, err.Error()
}
func (h *recHealth) Stopped(string)           {}
func (h *recHealth) Scope(string) hive.Health { return h }
func (h *recHealth) get() (bool, string)      { h.mu.Lock(); defer h.mu.Unlock(); return h.degraded, h.err }

// tlsEtcd is an etcd requiring client certificates, and the files of a
// client it accepts.
type tlsEtcd struct {
	etcd                      *harness.StandaloneEtcd
	dir, ca, cert, key, other string // other: a CA etcd does not know
}

func startTLSEtcd(t *testing.T) *tlsEtcd {
	dir := t.TempDir()
	ca := harness.NewTestCA(t, "etcd-ca")
	caFile := harness.WriteTestFile(t, dir, "etcd-client-ca.crt", ca.PEM)
	srvCert, srvKey := ca.IssueFiles(t, dir, "127.0.0.1", x509.ExtKeyUsageServerAuth)
	cert, key := ca.IssueFiles(t, dir, "etcd-client", x509.ExtKeyUsageClientAuth)
	other := harness.WriteTestFile(t, dir, "other-ca.crt", harness.NewTestCA(t, "other-ca").PEM)
	e := harness.StartEtcd(t, harness.WithEtcdTLS(harness.EtcdTLS{CAFile: caFile, CertFile: srvCert, KeyFile: srvKey,
		ClientCertFile: cert, ClientKeyFile: key}))
	return &tlsEtcd{etcd: e, dir: dir, ca: caFile, cert: cert, key: key, other: other}
}

// config writes an etcd.config file (Cilium's format) with the lines.
func (e *tlsEtcd) config(t *testing.T, name string, lines ...string) string {
	return harness.WriteTestFile(t, e.dir, name, []byte(fmt.Sprintf("---\nendpoints:\n- %s\n%s\n", e.etcd.URL(), strings.Join(lines, "\n"))))
}

// runClient starts a client of the etcd.config file with its session
// job reporting to h, until the test ends.
func runClient(t *testing.T, path string, h hive.Health) *Client {
	t.Helper()
	cfg, err := EtcdConfig(map[string]string{OptConfig: path})
	if err != nil {
		t.Fatal(err)
	}
	c := NewClient(hivetest.Logger(t), cfg, 30*time.Second)
	c.configFile = path
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { c.RunSession(ctx, h); close(done) }()
	t.Cleanup(func() { cancel(); <-done; _ = c.Close() })
	return c
}

// TestIntegrationEtcdTLS: with Cilium's etcd.config (trusted-ca-file,
// cert-file, key-file) the client talks to an etcd that requires client
// certificates; without the client certificate, or trusting the wrong CA,
// the session's health says what is wrong and what to set.
func TestIntegrationEtcdTLS(t *testing.T) {
	if testing.Short() {
		t.Skip("needs etcd")
	}
	e := startTLSEtcd(t)
	ctx := ctxTimeout(t, 90*time.Second)

	good := e.config(t, "etcd.config", "trusted-ca-file: '"+e.ca+"'", "cert-file: '"+e.cert+"'", "key-file: '"+e.key+"'")
	c := runClient(t, good, &recHealth{})
	if _, err := c.WaitSession(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Etcd().Put(ctx, "cilium/state/test/tls", "v"); err != nil {
		t.Fatalf("put over TLS: %v", err)
	}

	for _, tc := range []struct {
		name  string
		lines []string
		want  []string
	}{
		{"no-client-cert.config", []string{"trusted-ca-file: '" + e.ca + "'"},
			[]string{"etcd requires a client certificate and none was sent", "set cert-file and key-file in " + filepath.Join(e.dir, "no-client-cert.config"), "cilium-etcd-secrets"}},
		{"wrong-ca.config", []string{"trusted-ca-file: '" + e.other + "'", "cert-file: '" + e.cert + "'", "key-file: '" + e.key + "'"},
			[]string{"etcd's serving certificate is not trusted", "set trusted-ca-file"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var h recHealth
			runClient(t, e.config(t, tc.name, tc.lines...), &h)
			deadline := time.Now().Add(60 * time.Second)
			for {
				deg, msg := h.get()
				if deg && strings.Contains(msg, "TLS to etcd") {
					t.Logf("health: %s", msg)
					for _, w := range tc.want {
						if !strings.Contains(msg, w) {
							t.Errorf("error %q lacks %q", msg, w)
						}
					}
					return
				}
				if time.Now().After(deadline) {
					t.Fatalf("no TLS error reported; last health degraded=%v %q", deg, msg)
				}
				time.Sleep(100 * time.Millisecond)
			}
		})
	}

	// Half a key pair is refused at start.
	if _, err := EtcdConfig(map[string]string{OptConfig: e.config(t, "half.config", "cert-file: '"+e.cert+"'")}); err == nil || !strings.Contains(err.Error(), "cert-file and key-file go together") {
		t.Errorf("cert-file without key-file: %v", err)
	}
}

// TestClientCertificateReloaded: the client certificate is read from
// cert-file and key-file at each handshake, so a renewed one (a rotated
// Secret) is used without a restart.
func TestClientCertificateReloaded(t *testing.T) {
	dir := t.TempDir()
	ca := harness.NewTestCA(t, "ca")
	c1, k1 := ca.Issue(t, "first", x509.ExtKeyUsageClientAuth)
	cert := harness.WriteTestFile(t, dir, "etcd-client.crt", c1)
	key := harness.WriteTestFile(t, dir, "etcd-client.key", k1)
	path := harness.WriteTestFile(t, dir, "etcd.config", []byte("endpoints: [https://127.0.0.1:2379]\ncert-file: "+cert+"\nkey-file: "+key+"\n"))
	cfg, err := EtcdConfig(map[string]string{OptConfig: path})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.TLS == nil || cfg.TLS.GetClientCertificate == nil {
		t.Fatal("no client certificate callback")
	}
	name := func() string {
		c, err := cfg.TLS.GetClientCertificate(nil)
		if err != nil {
			t.Fatal(err)
		}
		x, err := x509.ParseCertificate(c.Certificate[0])
		if err != nil {
			t.Fatal(err)
		}
		return x.Subject.CommonName
	}
	if got := name(); got != "first" {
		t.Fatalf("certificate %q, want first", got)
	}
	c2, k2 := ca.Issue(t, "renewed", x509.ExtKeyUsageClientAuth)
	harness.WriteTestFile(t, dir, "etcd-client.crt", c2)
	harness.WriteTestFile(t, dir, "etcd-client.key", k2)
	if got := name(); got != "renewed" {
		t.Errorf("certificate %q after renewal, want renewed", got)
	}
}
