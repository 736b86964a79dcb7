package devkubelet

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"syscall"
	"testing"

	"github.com/containernetworking/cni/libcni"

	"github.com/cellium/cellium/test/privileged"
)

// TestPrivilegedPluginNetns: with Config.PluginNetns the plugins run in
// that namespace (the reference node's of devkubelet bench), not in ours.
func TestPrivilegedPluginNetns(t *testing.T) {
	privileged.Require(t)
	fn := newFakeNetwork(t, t.TempDir())
	fn.install(t)
	suffix := strconv.Itoa(os.Getpid())
	nodeNS, err := CreateNodeNetns("cellium-dkt-node-" + suffix)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := RemoveNodeNetns(nodeNS); err != nil {
			t.Error(err)
		}
	})
	podNS, err := CreateNodeNetns("cellium-dkt-pod-" + suffix)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := RemoveNodeNetns(podNS); err != nil {
			t.Error(err)
		}
	})
	f, err := os.Open(nodeNS)
	if err != nil {
		t.Fatal(err)
	}
	var st syscall.Stat_t
	err = syscall.Fstat(int(f.Fd()), &st)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("net:[%d]", st.Ino)
	// This thread's namespace: /proc/self is the main thread's, which
	// may have been left in a namespace CreateNodeNetns made.
	runtime.LockOSThread()
	self, err := os.Readlink("/proc/thread-self/ns/net")
	runtime.UnlockOSThread()
	if err != nil || self == want {
		t.Fatalf("own namespace %q (%v) must differ from the node's %q", self, err, want)
	}

	for _, pluginNetns := range []string{nodeNS, ""} {
		r := newCNIRuntime(fn.confDir, []string{fn.binDir}, t.TempDir(), pluginNetns)
		list, err := r.network()
		if err != nil {
			t.Fatal(err)
		}
		cid := "c-" + strconv.Itoa(len(pluginNetns))
		rt := &libcni.RuntimeConf{ContainerID: cid, NetNS: podNS, IfName: PodInterface}
		if _, err := r.cni.AddNetworkList(context.Background(), list, rt); err != nil {
			t.Fatalf("ADD: %v", err)
		}
		if err := r.cni.DelNetworkList(context.Background(), list, rt); err != nil {
			t.Fatalf("DEL: %v", err)
		}
		wantNS := want
		if pluginNetns == "" {
			wantNS = self
		}
		var n int
		for _, c := range fn.calls(t) {
			if c.ContainerID != cid {
				continue
			}
			n++
			if c.PluginNetns != wantNS {
				t.Errorf("PluginNetns %q: %s ran in %s, want %s", pluginNetns, c.Command, c.PluginNetns, wantNS)
			}
		}
		if n != 2 {
			t.Errorf("PluginNetns %q: %d calls logged, want ADD and DEL", pluginNetns, n)
		}
	}
}
