package bpf_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cellium/cellium/datapath/bpf"
	"github.com/cellium/cellium/datapath/maps"
	"github.com/cellium/cellium/datapath/socklb"
	"github.com/cellium/cellium/statedb/identity"
	"github.com/cellium/cellium/statedb/lb"
	"github.com/cellium/cellium/statedb/policy"
	"github.com/cellium/cellium/test/privileged"
)

// childEnv carries a client's arguments into the re-executed test binary:
// "<netns path> <address:port>".
const childEnv = "CELLIUM_BPF_TEST_CHILD"

// runChild enters the network namespace and connects to the address with
// TCP, echoes one message and prints the peer the socket shows. It runs
// on the main thread, locked, so the socket is made in that namespace.
func runChild(args string) int {
	runtime.LockOSThread()
	path, dst, ok := strings.Cut(args, " ")
	if !ok {
		fmt.Fprintln(os.Stderr, "child: want <netns> <address:port>")
		return 2
	}
	f, err := os.Open(path)
	if err == nil {
		err = unix.Setns(int(f.Fd()), unix.CLONE_NEWNET)
		f.Close()
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "child: enter %s: %v\n", path, err)
		return 2
	}
	c, err := net.DialTimeout("tcp4", dst, 5*time.Second)
	if err != nil {
		fmt.Printf("connect %s: %v\n", dst, err)
		return 1
	}
	defer c.Close()
	if err := roundTrip(c, "cellium-socklb"); err != nil {
		fmt.Printf("echo %s: %v\n", dst, err)
		return 1
	}
	fmt.Printf("peer %s\n", c.RemoteAddr())
	return 0
}

// TestPrivilegedProgramClusterIPSocketLB: the socket load balancer and the
// guard together, as on a node with --bpf-lb-sock. Pod a's egress policy
// allows only pod b, the ClusterIP's backend; the ClusterIP is a frontend
// in the socket LB's maps (programs attached to a cgroup of the test's
// own) and flagged in the ipcache. A client process of a in that cgroup
// connects to ClusterIP:80: the socket LB translates it to b:8080, the
// packets leave addressed to b and pass a's egress policy; the socket
// shows the ClusterIP as its peer. The same connect() from a socket
// outside the cgroup (one the hooks missed), and a raw ICMP socket's
// echo, leave addressed to the ClusterIP and drop with 174.
func TestPrivilegedProgramClusterIPSocketLB(t *testing.T) {
	privileged.Require(t)
	m, dir := openMaps(t)
	events := newEventReader(t, m)
	var seen []maps.Event

	node := newTestNode(t)
	a := node.addPod(t, "sa", netip.MustParseAddr("10.77.0.70"))
	b := node.addPod(t, "sb", netip.MustParseAddr("10.77.0.71"))
	const idA, idB identity.NumericIdentity = 1401, 1402
	const epA, epB uint16 = 41, 42
	registerPod(t, m, a, idA, epA)
	registerPod(t, m, b, idB, epB)
	polA, polB := openPolicy(t, dir, epA), openPolicy(t, dir, epB)
	// a: egress to b only (toEndpoints b); world is not allowed.
	if err := polA.Update(policy.Entry{Key: policy.NewKey(idB, policy.Egress, policy.ProtoAny, 0, 0)}); err != nil {
		t.Fatal(err)
	}
	if err := polB.BatchUpdate([]policy.Entry{allowAllIngress, allowAllEgress}); err != nil {
		t.Fatal(err)
	}
	node.attach(t, a, loadEndpoint(t, m, polA, endpointConfig{ID: epA, Identity: idA, IfIndex: uint32(a.res.HostIfIndex), MAC: a.res.PodMAC, IPv4: a.ip,
		Trace: true, Aggregation: bpf.AggregationMedium}))
	node.attach(t, b, loadEndpoint(t, m, polB, endpointConfig{ID: epB, Identity: idB, IfIndex: uint32(b.res.HostIfIndex), MAC: b.res.PodMAC, IPv4: b.ip}))
	b.serveEcho(t, 8080)

	vip := netip.AddrPortFrom(netip.MustParseAddr("10.77.9.20"), 80)
	if err := m.IPCache.Update(netip.PrefixFrom(vip.Addr(), 32),
		maps.IPCacheEntry{Identity: identity.ReservedIdentityWorld, Flags: maps.IPCacheFlagService}); err != nil {
		t.Fatal(err)
	}
	lbm, err := maps.OpenLB(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lbm.Close() })
	fe := lb.L4Addr{Addr: vip.Addr(), Port: vip.Port(), Proto: lb.TCP}
	if err := lbm.Backends.Update([]uint32{1}, []lb.L4Addr{{Addr: b.ip, Port: 8080, Proto: lb.TCP}}); err != nil {
		t.Fatal(err)
	}
	if err := lbm.Services.Update([]maps.ServiceSlot{{Frontend: fe, Slot: 1}, {Frontend: fe}},
		[]maps.ServiceValue{{BackendID: 1}, {Count: 1}}); err != nil {
		t.Fatal(err)
	}
	cg := filepath.Join(cgroup2Mount(t), "cellium-bpf-test-"+strings.ToLower(rand.Text()[:8]))
	if err := os.Mkdir(cg, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := os.Remove(cg); err != nil {
			t.Errorf("remove cgroup %s: %v", cg, err)
		}
	})
	linkDir := filepath.Join(dir, "socklb")
	if err := socklb.Attach(lbm, cg, linkDir); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := socklb.Detach(linkDir); err != nil {
			t.Error(err)
		}
	})

	// Translated at connect(): reaches b, shows the ClusterIP.
	out, err := clientIn(cg, a.ns.Path(), vip)
	if err != nil || strings.TrimSpace(out) != "peer "+vip.String() {
		t.Fatalf("client in the socket LB's cgroup to %s: %v\n%s", vip, err, out)
	}
	// The events of a's side of the connection name the ClusterIP it
	// asked for (cellium_lb4_reverse_sk through
	// cellium_lb4_reverse_sk_ref, kept in the conntrack entry): the
	// policy verdict and the to-stack trace of the SYN, and the FIN's
	// trace, which comes from the entry. Its replies do not (their
	// destination was never translated).
	time.Sleep(300 * time.Millisecond)
	evs := events.drain(t)
	for _, e := range evs {
		if e.Type == maps.EventDrop {
			t.Errorf("a drop on the translated connection: %v", e)
		}
	}
	for _, c := range []struct {
		what  string
		match func(maps.Event) bool
	}{
		{"a's policy verdict", func(e maps.Event) bool {
			return e.Type == maps.EventPolicyVerdict && e.EndpointID == epA && e.Dst == b.ip
		}},
		{"a's SYN to-stack", func(e maps.Event) bool {
			return e.Type == maps.EventTrace && e.EndpointID == epA && e.Reason == maps.TraceToStack && e.Dst == b.ip &&
				e.TCPFlags&bpf.TCPFlagSYN != 0
		}},
		{"a's FIN to-stack", func(e maps.Event) bool {
			return e.Type == maps.EventTrace && e.EndpointID == epA && e.Reason == maps.TraceToStack && e.Dst == b.ip &&
				e.TCPFlags&bpf.TCPFlagFIN != 0
		}},
	} {
		e, ok := findEvent(evs, c.match)
		if !ok {
			t.Errorf("%s: no event; saw:\n%s", c.what, eventList(evs))
			continue
		}
		if got := netip.AddrPortFrom(e.OrigDst, e.OrigDstPort); got != vip {
			t.Errorf("%s: %v: original destination %s, want the ClusterIP %s", c.what, e, got, vip)
		}
	}
	if e, ok := findEvent(evs, func(e maps.Event) bool {
		return e.EndpointID == epA && e.Src == b.ip && e.OrigDst.IsValid()
	}); ok {
		t.Errorf("a reply carries an original destination: %v", e)
	}

	// The hooks missed these: 174.
	expect174 := func(what string, proto uint8, send func() error) {
		t.Helper()
		errc := make(chan error, 1)
		go func() { errc <- send() }()
		ev := events.waitFor(t, "drop of "+what, &seen, func(e maps.Event) bool {
			return e.Type == maps.EventDrop && e.Proto == proto && e.Dst == vip.Addr()
		})
		if ev.Reason != maps.DropIsClusterIP || ev.EndpointID != epA || ev.Src != a.ip {
			t.Errorf("%s: drop event %v, want 174 (Is a ClusterIP) from endpoint %d", what, ev, epA)
		}
		if err := <-errc; err == nil {
			t.Errorf("%s: got an answer", what)
		}
	}
	expect174("connect() outside the cgroup", 6, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		c, err := a.dial(ctx, vip)
		if err == nil {
			c.Close()
		}
		return err
	})
	expect174("raw ICMP echo", 1, func() error { return a.rawPing(vip.Addr()) })

	// The backends move to bank 1 (datapath/lbsync writes a new version
	// there, then slot 0 naming it, then deletes bank 0): the program
	// follows slot 0's LB4_SVC_BANK1 to the slots of bank 1.
	if err := lbm.Services.Update([]maps.ServiceSlot{{Frontend: fe, Slot: 1, Bank: 1}, {Frontend: fe}},
		[]maps.ServiceValue{{BackendID: 1}, {Count: 1, Bank1: true}}); err != nil {
		t.Fatal(err)
	}
	if err := lbm.Services.Delete([]maps.ServiceSlot{{Frontend: fe, Slot: 1}}); err != nil {
		t.Fatal(err)
	}
	if out, err := clientIn(cg, a.ns.Path(), vip); err != nil || strings.TrimSpace(out) != "peer "+vip.String() {
		t.Fatalf("client to %s with the slots in bank 1: %v\n%s", vip, err, out)
	}
}

// clientIn runs runChild in cgroup cg for a connection from network
// namespace netns to dst and returns its output.
func clientIn(cg, netns string, dst netip.AddrPort) (string, error) {
	f, err := os.Open(cg)
	if err != nil {
		return "", err
	}
	defer f.Close()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"="+netns+" "+dst.String())
	cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(f.Fd())}
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// cgroup2Mount finds the machine's cgroup v2 mount.
func cgroup2Mount(t testing.TB) string {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mounts")
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 3 && f[2] == "cgroup2" {
			return f[1]
		}
	}
	t.Skip("no cgroup2 mount on this machine")
	return ""
}
