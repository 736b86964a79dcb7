package realnode

import (
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"
)

// fakeMachine is the sysctls and cgroup roots of a machine in memory.
type fakeMachine struct {
	mu      sync.Mutex
	values  map[string]string
	cgroups map[string]bool
}

func (m *fakeMachine) share(dir string) sysctlShare {
	return sysctlShare{
		dir:   dir,
		names: []string{"kernel.panic", "vm.overcommit_memory"},
		read: func(names []string) (map[string]string, error) {
			m.mu.Lock()
			defer m.mu.Unlock()
			out := map[string]string{}
			for _, n := range names {
				out[n] = m.values[n]
			}
			return out, nil
		},
		write: func(v map[string]string) error {
			m.mu.Lock()
			defer m.mu.Unlock()
			maps.Copy(m.values, v)
			return nil
		},
		cgroupExists: func(root string) bool {
			m.mu.Lock()
			defer m.mu.Unlock()
			return m.cgroups[root]
		},
	}
}

// kubelet sets the kubelet's values, as its start does.
func (m *fakeMachine) kubelet() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.values["kernel.panic"] = "10"
	m.values["vm.overcommit_memory"] = "1"
}

func (m *fakeMachine) get(k string) string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.values[k]
}

var original = map[string]string{"kernel.panic": "0", "vm.overcommit_memory": "0"}

// TestSysctlShareOverlappingNodes is CI's failure: node A's kubelet runs
// when node B starts, A stops (and restored the machine's values while B
// ran), B's check found the sysctls changed. With the share, B gets the
// values from before A, A leaves them alone while B holds them, and B
// restores them.
func TestSysctlShareOverlappingNodes(t *testing.T) {
	m := &fakeMachine{values: maps.Clone(original), cgroups: map[string]bool{}}
	s := m.share(t.TempDir())

	a, err := s.hold("/node-a", "/node-a")
	if err != nil {
		t.Fatal(err)
	}
	m.cgroups["/node-a"] = true
	m.kubelet()
	b, err := s.hold("/node-b", "/node-b")
	if err != nil {
		t.Fatal(err)
	}
	m.cgroups["/node-b"] = true
	if !maps.Equal(a, original) || !maps.Equal(b, original) {
		t.Fatalf("held values: a %v, b %v; want the machine's %v for both", a, b, original)
	}
	others, err := s.others("/node-b")
	if err != nil || len(others) != 1 || others[0] != "node-a" {
		t.Fatalf("others of b = %v, %v; want [node-a]", others, err)
	}

	delete(m.cgroups, "/node-a")
	if err := s.release("/node-a", a); err != nil {
		t.Fatal(err)
	}
	if got := m.get("kernel.panic"); got != "10" {
		t.Fatalf("kernel.panic = %s after A stopped while B runs; want B's kubelet's 10 left alone", got)
	}
	if others, _ := s.others("/node-b"); len(others) != 0 {
		t.Fatalf("others of b after A stopped = %v", others)
	}

	delete(m.cgroups, "/node-b")
	if err := s.release("/node-b", b); err != nil {
		t.Fatal(err)
	}
	if !maps.Equal(m.values, original) {
		t.Fatalf("after the last node: %v; want %v", m.values, original)
	}
	if _, err := os.Stat(filepath.Join(s.dir, "saved.json")); !os.IsNotExist(err) {
		t.Fatalf("saved.json stays after the last holder: %v", err)
	}
}

// TestSysctlShareKilledHolder: a holder whose process was SIGKILLed
// before its node made its cgroup root is gone; the values it saved (the
// machine's) are the ones the next first holder gets, not the kubelet's
// that are set now.
func TestSysctlShareKilledHolder(t *testing.T) {
	m := &fakeMachine{values: maps.Clone(original), cgroups: map[string]bool{}}
	s := m.share(t.TempDir())
	if _, err := s.hold("/killed", "/killed"); err != nil {
		t.Fatal(err)
	}
	// The holder's file names a process that is gone.
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	dead := cmd.Process.Pid
	if err := writeJSON(s.holderPath("/killed"), sysctlHolder{PID: dead, PIDStart: "1", CgroupRoot: "/killed"}); err != nil {
		t.Fatal(err)
	}
	m.kubelet()

	got, err := s.hold("/next", "/next")
	if err != nil {
		t.Fatal(err)
	}
	if !maps.Equal(got, original) {
		t.Fatalf("the next holder got %v; want the machine's %v saved before the killed run", got, original)
	}
	if err := s.release("/next", got); err != nil {
		t.Fatal(err)
	}
	if !maps.Equal(m.values, original) {
		t.Fatalf("after the last node: %v; want %v", m.values, original)
	}
	if entries, _ := os.ReadDir(filepath.Join(s.dir, "holders")); len(entries) != 0 {
		t.Fatalf("holders left: %v", entries)
	}
}

// TestSysctlShareDetachedNode: a node whose starting process returned
// (make up) holds the values while its cgroup root exists.
func TestSysctlShareDetachedNode(t *testing.T) {
	m := &fakeMachine{values: maps.Clone(original), cgroups: map[string]bool{"/up": true}}
	s := m.share(t.TempDir())
	if err := writeJSON(filepath.Join(s.dir, "saved.json"), original); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(s.dir, "holders"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := writeJSON(s.holderPath("/up"), sysctlHolder{PID: 0, CgroupRoot: "/up"}); err != nil {
		t.Fatal(err)
	}
	m.kubelet()
	got, err := s.hold("/test", "/test")
	if err != nil {
		t.Fatal(err)
	}
	if !maps.Equal(got, original) {
		t.Fatalf("held %v; want %v", got, original)
	}
	if err := s.release("/test", got); err != nil {
		t.Fatal(err)
	}
	if m.get("kernel.panic") != "10" {
		t.Fatal("the test's node restored the sysctls while make up's node runs")
	}
}

// TestSysctlShareFallback: a node from before the share (no saved file,
// no holder) restores what its state file recorded.
func TestSysctlShareFallback(t *testing.T) {
	m := &fakeMachine{values: map[string]string{"kernel.panic": "10", "vm.overcommit_memory": "1"}, cgroups: map[string]bool{}}
	s := m.share(t.TempDir())
	if err := s.release("/old", original); err != nil {
		t.Fatal(err)
	}
	if !maps.Equal(m.values, original) {
		t.Fatalf("got %v; want %v", m.values, original)
	}
}

func TestProcessStart(t *testing.T) {
	self := os.Getpid()
	start := processStart(self)
	if start == "" || !processAlive(self, start) {
		t.Fatalf("processStart(self) = %q; alive %v", start, processAlive(self, start))
	}
	if processAlive(self, start+"0") {
		t.Fatal("a different start time counts as the same process")
	}
}

// TestHostNetworkOwners: a process named kube-proxy in this network
// namespace is named, with its pid and command line, by the error of a
// WaitHostFree that ran out.
func TestHostNetworkOwners(t *testing.T) {
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Skip("no sleep binary")
	}
	b, err := os.ReadFile(sleep)
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), "kube-proxy")
	if err := os.WriteFile(bin, b, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "30")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	want := fmt.Sprintf("pid %d: %s 30", cmd.Process.Pid, bin)
	var got []string
	for range 50 { // the exec may not have renamed the process yet
		if got = hostNetworkOwners(); slices.Contains(got, want) {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("hostNetworkOwners() = %q; want it to hold %q", got, want)
}
