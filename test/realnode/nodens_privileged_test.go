package realnode

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/cellium/cellium/test/privileged"
)

// TestPrivilegedNodeNamespaces makes two nodes' namespaces on a bridge of
// their own and checks what a node of a several-node cluster relies on:
// the nodes reach each other over their eth0 (ICMP and TCP) and have no
// default route; each sees only its own links in /sys/class/net, has a
// bpffs of its own at /sys/fs/bpf and the host's cgroup hierarchies; each
// standard host path (/var/lib/kubelet, /run/cellium, ...) is the node's
// own folder, invisible to the host and to the other node, and a mount made
// inside a node does not reach the host. Remove leaves nothing.
func TestPrivilegedNodeNamespaces(t *testing.T) {
	privileged.Require(t)
	ctx := t.Context()
	dir, err := os.MkdirTemp("", "crns-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	const bridge = "crnbrtest"
	created, err := EnsureBridge(bridge)
	if err != nil {
		t.Fatal(err)
	}
	if !created {
		t.Fatalf("bridge %s exists already (another run of this test?)", bridge)
	}
	t.Cleanup(func() {
		if err := deleteLink(bridge); err != nil {
			t.Error(err)
		}
	})
	var nodes []NodeNamespaces
	made := map[string][]string{}
	for i := 1; i <= 2; i++ {
		ip, err := NodeIPAt(i)
		if err != nil {
			t.Fatal(err)
		}
		s := NodeNamespaces{Name: "crnt" + string(rune('0'+i)), Dir: filepath.Join(dir, "n"+string(rune('0'+i))), IP: ip}
		dirs, err := s.Create(ctx, bridge)
		if err != nil {
			t.Fatal(err)
		}
		made[s.Name] = dirs
		nodes = append(nodes, s)
		t.Cleanup(func() {
			if err := s.Remove(dirs); err != nil {
				t.Error(err)
			}
			if left := s.Leftovers(dirs); len(left) > 0 {
				t.Errorf("node %s left: %v", s.Name, left)
			}
		})
	}
	a, b := nodes[0], nodes[1]
	in := func(s NodeNamespaces, script string) string {
		t.Helper()
		out, err := s.Command(ctx, "sh", "-c", script).CombinedOutput()
		if err != nil {
			t.Fatalf("in node %s: %s: %v: %s", s.Name, script, err, out)
		}
		return strings.TrimSpace(string(out))
	}

	// The network: a reaches b, neither has a default route.
	nsA, err := ns.GetNS(a.NetnsPath())
	if err != nil {
		t.Fatal(err)
	}
	defer nsA.Close()
	nsB, err := ns.GetNS(b.NetnsPath())
	if err != nil {
		t.Fatal(err)
	}
	defer nsB.Close()
	if err := privileged.Ping(nsA, b.IP); err != nil {
		t.Errorf("node a pinging node b: %v", err)
	}
	if _, err := privileged.TCPEcho(nsB, b.IP, nsA, []byte("hello")); err != nil {
		t.Errorf("TCP from node a to node b: %v", err)
	}
	for _, s := range nodes {
		if r := in(s, "ip route show default"); r != "" {
			t.Errorf("node %s has a default route: %s", s.Name, r)
		}
		// sysfs of the node's network namespace.
		links := strings.Fields(in(s, "ls /sys/class/net"))
		slices.Sort(links)
		if !slices.Equal(links, []string{"eth0", "lo"}) {
			t.Errorf("node %s: /sys/class/net has %v, want eth0 and lo", s.Name, links)
		}
		if fs := in(s, "stat -f -c %T /sys/fs/bpf"); fs != "bpf_fs" {
			t.Errorf("node %s: /sys/fs/bpf is %s, want a bpffs", s.Name, fs)
		}
		if _, err := os.Stat("/sys/fs/cgroup/unified"); err == nil {
			if fs := in(s, "stat -f -c %T /sys/fs/cgroup/unified"); fs != "cgroup2fs" {
				t.Errorf("node %s: /sys/fs/cgroup/unified is %s, want the host's cgroup2", s.Name, fs)
			}
		}
	}
	// No node holds another's namespaces (nor the host's netns files).
	for _, s := range nodes {
		if out := in(s, "findmnt -rn -t nsfs -o TARGET || true"); out != "" {
			t.Errorf("node %s keeps namespaces of others: %s", s.Name, out)
		}
	}
	// Own bpffs: a directory made in a's is neither in b's nor the host's.
	in(a, "mkdir /sys/fs/bpf/crnt-mark")
	if out := in(b, "ls /sys/fs/bpf"); strings.Contains(out, "crnt-mark") {
		t.Errorf("node b sees node a's bpffs: %s", out)
	}
	if exists("/sys/fs/bpf/crnt-mark") {
		t.Error("the host sees node a's bpffs")
		_ = os.Remove("/sys/fs/bpf/crnt-mark")
	}
	// Own folders at the standard paths.
	for _, p := range StandardPaths {
		mark := filepath.Join(p, "crnt-"+a.Name)
		in(a, "touch "+mark)
		if !exists(filepath.Join(a.RootDir(), mark)) {
			t.Errorf("node a's %s is not its folder %s", p, filepath.Join(a.RootDir(), p))
		}
		if exists(mark) {
			t.Errorf("the host sees node a's %s", mark)
		}
		if out := in(b, "ls -a "+p); strings.Contains(out, "crnt-") {
			t.Errorf("node b sees node a's %s", mark)
		}
	}
	// A mount inside the node stays inside it.
	in(a, "mkdir -p /run/cellium/m && mount -t tmpfs crnt /run/cellium/m")
	mps, err := mountsUnder(a.Dir)
	if err != nil {
		t.Fatal(err)
	}
	// The namespace's file and its private mount are the host's.
	if mps = slices.DeleteFunc(mps, func(m string) bool { return m == a.nsDir() || m == a.MountNSPath() }); len(mps) > 0 {
		t.Errorf("mounts of node a on the host: %v", mps)
	}
	if isMountPoint(filepath.Join(a.RootDir(), "run/cellium/m")) {
		t.Error("node a's tmpfs propagated to the host")
	}
}
