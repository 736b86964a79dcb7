package harness

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// StandaloneEtcd is an etcd of its own on loopback (not the cluster's, which the API
// server needs), for kvstore-mode tests that stop and restart it. Its data
// survives Stop/Start.
type StandaloneEtcd struct {
	bin, dir  string
	url, peer string
	tls       *EtcdTLS
	cmd       *exec.Cmd
	done      chan struct{}
}

// EtcdTLS makes a StandaloneEtcd serve its clients over TLS (https) and
// require a client certificate signed by CAFile. All are PEM files.
type EtcdTLS struct {
	// CAFile signs the client certificates etcd accepts.
	CAFile string
	// CertFile and KeyFile are etcd's serving certificate (for
	// 127.0.0.1) and key.
	CertFile, KeyFile string
	// ClientCertFile and ClientKeyFile are a client certificate the
	// harness uses for its own health checks.
	ClientCertFile, ClientKeyFile string
}

// EtcdOption changes how StartEtcd runs etcd.
type EtcdOption func(*StandaloneEtcd)

// WithEtcdTLS serves clients over TLS with client certificates required.
func WithEtcdTLS(c EtcdTLS) EtcdOption { return func(e *StandaloneEtcd) { e.tls = &c } }

// StartEtcd builds (or finds cached) etcd and starts it on free loopback
// ports with a data directory under t.TempDir(); it is stopped when the
// test ends.
func StartEtcd(t testing.TB, opts ...EtcdOption) *StandaloneEtcd {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	bins, err := EnsureBinaries(ctx, nil)
	if err != nil {
		t.Fatalf("etcd binary: %v", err)
	}
	ports, err := freePorts(2)
	if err != nil {
		t.Fatal(err)
	}
	e := &StandaloneEtcd{
		bin:  bins.Etcd,
		dir:  t.TempDir(),
		url:  "http://127.0.0.1:" + strconv.Itoa(ports[0]),
		peer: "http://127.0.0.1:" + strconv.Itoa(ports[1]),
	}
	for _, o := range opts {
		o(e)
	}
	if e.tls != nil {
		e.url = "https://127.0.0.1:" + strconv.Itoa(ports[0])
	}
	if err := e.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := e.Stop(); err != nil {
			t.Errorf("stop etcd: %v", err)
		}
	})
	return e
}

// URL is the client URL.
func (e *StandaloneEtcd) URL() string { return e.url }

// Start starts etcd (again) on the same ports and data, and waits until
// it is healthy.
func (e *StandaloneEtcd) Start() error {
	if e.cmd != nil {
		return fmt.Errorf("etcd already running")
	}
	log, err := os.OpenFile(filepath.Join(e.dir, "etcd.log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	args := []string{
		"--name=kvstore-test",
		"--data-dir=" + filepath.Join(e.dir, "data"),
		"--listen-client-urls=" + e.url,
		"--advertise-client-urls=" + e.url,
		"--listen-peer-urls=" + e.peer,
		"--initial-advertise-peer-urls=" + e.peer,
		"--initial-cluster=kvstore-test=" + e.peer,
		"--unsafe-no-fsync",
		"--log-level=warn",
		"--heartbeat-interval=10",
		"--election-timeout=100",
	}
	healthy := etcdHealthy
	if e.tls != nil {
		args = append(args, "--cert-file="+e.tls.CertFile, "--key-file="+e.tls.KeyFile,
			"--trusted-ca-file="+e.tls.CAFile, "--client-cert-auth")
		hc, err := e.tls.healthClient()
		if err != nil {
			log.Close()
			return err
		}
		healthy = func(ctx context.Context, url string) error { return etcdHealthyWith(ctx, hc, url) }
	}
	cmd := exec.Command(e.bin, args...)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		log.Close()
		return fmt.Errorf("start etcd: %w", err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); log.Close(); close(done) }()
	e.cmd, e.done = cmd, done
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		if healthy(ctx, e.url) == nil {
			return nil
		}
		select {
		case <-done:
			e.cmd = nil
			b, _ := os.ReadFile(filepath.Join(e.dir, "etcd.log"))
			return fmt.Errorf("etcd exited at start: %s", tailLines(b, 20))
		case <-ctx.Done():
			return fmt.Errorf("etcd not healthy at %s: %w", e.url, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Stop kills etcd (as a crash would) and waits for it to exit.
func (e *StandaloneEtcd) Stop() error {
	if e.cmd == nil {
		return nil
	}
	_ = e.cmd.Process.Kill()
	<-e.done
	e.cmd = nil
	return nil
}

// healthClient is an HTTPS client with the harness's client certificate
// that trusts CAFile (which must also sign etcd's serving certificate).
func (c *EtcdTLS) healthClient() (*http.Client, error) {
	ca, err := os.ReadFile(c.CAFile)
	if err != nil {
		return nil, fmt.Errorf("etcd TLS CA: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca) {
		return nil, fmt.Errorf("etcd TLS CA %s: no PEM certificate", c.CAFile)
	}
	cert, err := tls.LoadX509KeyPair(c.ClientCertFile, c.ClientKeyFile)
	if err != nil {
		return nil, fmt.Errorf("etcd TLS health-check client certificate: %w", err)
	}
	return &http.Client{Transport: &http.Transport{DisableKeepAlives: true,
		TLSClientConfig: &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}}}, nil
}

// etcdHealthyWith is etcdHealthy with the given client (TLS).
func etcdHealthyWith(ctx context.Context, client *http.Client, url string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url+"/health", nil)
	if err != nil {
		return err
	}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("etcd health: %s", resp.Status)
	}
	return nil
}
