package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/cellium/cellium/test/harness"
)

// run runs devcluster with args in-process and returns its standard output.
func run(ctx context.Context, args ...string) (string, error) {
	var stdout, stderr bytes.Buffer
	cmd := newRootCmd()
	cmd.SetArgs(args)
	cmd.SetOut(&stdout)
	cmd.SetErr(&stderr)
	err := cmd.ExecuteContext(ctx)
	if err != nil {
		err = errors.Join(err, errors.New("stderr: "+stderr.String()))
	}
	return stdout.String(), err
}

func TestUpStatusDown(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	ctx := t.Context()
	dir := filepath.Join(t.TempDir(), "dev")
	t.Cleanup(func() { _, _ = run(context.Background(), "down", "--dir", dir) })

	out, err := run(ctx, "up", "--dir", dir, "--controller-manager", "--control-plane-only")
	if err != nil {
		t.Fatalf("up: %v", err)
	}
	if !strings.Contains(out, "kubectl --kubeconfig "+filepath.Join(dir, "kubeconfig")+" get ns") {
		t.Errorf("up does not show how to use the kubeconfig:\n%s", out)
	}
	pids := map[string]int{}
	for _, name := range []string{harness.Etcd, harness.KubeAPIServer, harness.KubeControllerManager} {
		pid, running, err := harness.ReadPidFile(filepath.Join(dir, name+".pid"))
		if err != nil || !running {
			t.Fatalf("%s after up: pid %d running=%v err=%v", name, pid, running, err)
		}
		pids[name] = pid
	}

	out, err = run(ctx, "status", "--dir", dir)
	if err != nil {
		t.Fatalf("status: %v\n%s", err, out)
	}
	if !strings.Contains(out, ": ready") || strings.Count(out, "running") != 3 {
		t.Errorf("status:\n%s", out)
	}

	// A second up refuses while the first cluster runs.
	if _, err := run(ctx, "up", "--dir", dir, "--control-plane-only"); err == nil || !strings.Contains(err.Error(), "already running") {
		t.Errorf("second up: %v; want 'already running'", err)
	}

	out, err = run(ctx, "down", "--dir", dir)
	if err != nil {
		t.Fatalf("down: %v", err)
	}
	for name, pid := range pids {
		if err := waitGone(pid); err != nil {
			t.Errorf("%s after down: %v", name, err)
		}
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("%s still exists after down: %v\n%s", dir, err, out)
	}

	// down is idempotent, status says there is nothing.
	if _, err := run(ctx, "down", "--dir", dir); err != nil {
		t.Errorf("second down: %v", err)
	}
	if _, err := run(ctx, "status", "--dir", dir); err == nil || !strings.Contains(err.Error(), "no cluster") {
		t.Errorf("status after down: %v; want 'no cluster'", err)
	}
}

func TestUpRefusesForeignDir(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "precious"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := run(t.Context(), "up", "--dir", dir, "--control-plane-only"); err == nil || !strings.Contains(err.Error(), "choose another --dir") {
		t.Errorf("up in a foreign directory: %v", err)
	}
	if _, err := run(t.Context(), "down", "--dir", dir); err == nil {
		t.Error("down in a foreign directory: no error")
	}
	if _, err := os.Stat(filepath.Join(dir, "precious")); err != nil {
		t.Errorf("foreign file touched: %v", err)
	}
}

// TestUpAfterCrash: the state of a cluster whose processes died is replaced
// by the next up.
func TestUpAfterCrash(t *testing.T) {
	dir := t.TempDir()
	writeJSON := `{"processes":["etcd"],"started":"2026-01-01T00:00:00Z"}`
	if err := os.WriteFile(filepath.Join(dir, stateFile), []byte(writeJSON), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "etcd.pid"), []byte("1\n"), 0o644); err != nil { // not ours
		t.Fatal(err)
	}
	var log bytes.Buffer
	if err := prepareDir(dir, &log); err != nil {
		t.Fatal(err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("stale state left: %v", entries)
	}
}

// TestUpAfterE2EBinaries: a directory with only the e2e commands' folders
// (make e2e-binaries before the first make up) is a directory for up; one
// with anything else is not.
func TestUpAfterE2EBinaries(t *testing.T) {
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "e2e-netpol", "images"), 0o755); err != nil {
		t.Fatal(err)
	}
	var log bytes.Buffer
	if err := prepareDir(dir, &log); err != nil {
		t.Fatalf("a directory with e2e-netpol only: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "e2e-netpol", "images")); err != nil {
		t.Errorf("the e2e folder went: %v", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "e2e-conformance"), nil, 0o644); err != nil { // a file, not the folder
		t.Fatal(err)
	}
	if err := prepareDir(dir, &log); err == nil || !strings.Contains(err.Error(), "choose another --dir") {
		t.Errorf("a directory with a foreign file: %v", err)
	}
}

// waitGone waits until pid no longer exists (our own children are reaped by
// the harness).
func waitGone(pid int) error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := syscall.Kill(pid, 0)
		if errors.Is(err, syscall.ESRCH) {
			return nil
		}
		if time.Now().After(deadline) {
			return errors.New("still exists")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestUpNodes: --nodes is checked before anything starts: several nodes
// are for the real node only, 1 to 4.
func TestUpNodes(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--node", "dev", "--nodes", "2"}, "for --node real only"},
		{[]string{"--node", "real", "--nodes", "0"}, "1 to 4 nodes"},
		{[]string{"--node", "real", "--nodes", "5"}, "1 to 4 nodes"},
	} {
		_, err := run(t.Context(), append([]string{"up", "--dir", dir}, tc.args...)...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("up %v: %v, want an error saying %q", tc.args, err, tc.want)
		}
	}
	if entries, _ := os.ReadDir(dir); len(entries) > 0 {
		t.Errorf("up with a bad --nodes wrote into its directory: %v", entries)
	}
}
