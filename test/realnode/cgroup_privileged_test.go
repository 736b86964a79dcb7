package realnode

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/cellium/cellium/test/harness"
	"github.com/cellium/cellium/test/privileged"
)

// TestPrivilegedRuncCgroupV2 answers what a node's socket load balancer
// relies on on this hybrid (cgroup v1 + unified v2) machine: runc, run
// inside a node's namespaces with a cgroup path under the node's cgroup
// root (as the kubelet's cgroupRoot puts pods), puts the container into
// the unified hierarchy at that same path ("0::/<root>/..."), so a
// cgroup program attached to /sys/fs/cgroup/unified/<root> (the node's
// agent's --cgroup-root) sees the node's containers and no other node's.
func TestPrivilegedRuncCgroupV2(t *testing.T) {
	privileged.Require(t)
	runc, err := exec.LookPath("runc")
	if err != nil {
		t.Skip("runc is not installed: run make deps (Debian: apt-get install runc)")
	}
	if _, err := os.Stat("/sys/fs/cgroup/unified"); err != nil {
		t.Skip("no unified cgroup v2 hierarchy at /sys/fs/cgroup/unified (not a hybrid machine)")
	}
	ctx := t.Context()
	dir, err := os.MkdirTemp("", "crcg-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	const bridge = "crnbrcg"
	if _, err := EnsureBridge(bridge); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = deleteLink(bridge) })
	ip, _ := NodeIPAt(1)
	s := NodeNamespaces{Name: "crncg1", Dir: filepath.Join(dir, "n"), IP: ip}
	made, err := s.Create(ctx, bridge)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Remove(made); err != nil {
			t.Error(err)
		}
	})

	// A bundle whose rootfs is the pause program.
	root, err := harness.RepoRoot(".")
	if err != nil {
		t.Fatal(err)
	}
	bundle := filepath.Join(dir, "bundle")
	build := exec.CommandContext(ctx, "go", "build", "-o", filepath.Join(bundle, "rootfs", "pause"), "./test/cmd/pause")
	build.Dir, build.Env = root, append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build pause: %v: %s", err, out)
	}
	if out, err := exec.CommandContext(ctx, runc, "spec", "--bundle", bundle).CombinedOutput(); err != nil {
		t.Fatalf("runc spec: %v: %s", err, out)
	}
	var spec map[string]any
	b, err := os.ReadFile(filepath.Join(bundle, "config.json"))
	if err == nil {
		err = json.Unmarshal(b, &spec)
	}
	if err != nil {
		t.Fatal(err)
	}
	const cgroupRoot = "/cellium-rn-cgtest"
	t.Cleanup(func() {
		if err := removeCgroupRoot(cgroupRoot); err != nil {
			t.Error(err)
		}
	})
	proc := spec["process"].(map[string]any)
	proc["args"], proc["terminal"] = []string{"/pause"}, false
	linux := spec["linux"].(map[string]any)
	linux["cgroupsPath"] = cgroupRoot + "/kubepods/c1"
	if b, err = json.Marshal(spec); err == nil {
		err = os.WriteFile(filepath.Join(bundle, "config.json"), b, 0o644)
	}
	if err != nil {
		t.Fatal(err)
	}
	state := filepath.Join(dir, "runc")
	// The detached container inherits runc's stdio: a file, not a pipe
	// that would never close.
	logFile := filepath.Join(dir, "runc.log")
	logf, err := os.Create(logFile)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	cmd := s.Command(ctx, runc, "--root", state, "run", "--detach", "--bundle", bundle, "c1")
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Run(); err != nil {
		out, _ := os.ReadFile(logFile)
		t.Fatalf("runc run in node %s: %v: %s", s.Name, err, out)
	}
	t.Cleanup(func() {
		if out, err := s.Command(context.Background(), runc, "--root", state, "delete", "--force", "c1").CombinedOutput(); err != nil {
			t.Errorf("runc delete: %v: %s", err, out)
		}
	})
	out, err := s.Command(ctx, runc, "--root", state, "state", "c1").Output()
	if err != nil {
		t.Fatal(err)
	}
	var st struct{ Pid int }
	if err := json.Unmarshal(out, &st); err != nil || st.Pid == 0 {
		t.Fatalf("runc state %s: %v", out, err)
	}
	cg, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(st.Pid), "cgroup"))
	if err != nil {
		t.Fatal(err)
	}
	want := "0::" + cgroupRoot + "/kubepods/c1"
	if !strings.Contains(string(cg), want+"\n") {
		t.Errorf("the container's cgroups:\n%s\nwant the unified hierarchy's line %s", cg, want)
	}
	t.Logf("the container's cgroups:\n%s", cg)
}
