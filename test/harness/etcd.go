package harness

import (
	"context"
	"fmt"
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
	cmd       *exec.Cmd
	done      chan struct{}
}

// StartEtcd builds (or finds cached) etcd and starts it on free loopback
// ports with a data directory under t.TempDir(); it is stopped when the
// test ends.
func StartEtcd(t testing.TB) *StandaloneEtcd {
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
	cmd := exec.Command(e.bin,
		"--name=kvstore-test",
		"--data-dir="+filepath.Join(e.dir, "data"),
		"--listen-client-urls="+e.url,
		"--advertise-client-urls="+e.url,
		"--listen-peer-urls="+e.peer,
		"--initial-advertise-peer-urls="+e.peer,
		"--initial-cluster=kvstore-test="+e.peer,
		"--unsafe-no-fsync",
		"--log-level=warn",
		"--heartbeat-interval=10",
		"--election-timeout=100",
	)
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
		if etcdHealthy(ctx, e.url) == nil {
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
