package loader

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/statedb"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/containernetworking/plugins/pkg/testutils"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/cellium/cellium/datapath/bpf"
	dplink "github.com/cellium/cellium/datapath/link"
	"github.com/cellium/cellium/statedb/bpfprog"
	"github.com/cellium/cellium/statedb/identity"
	"github.com/cellium/cellium/statedb/reconciler"
	"github.com/cellium/cellium/test/privileged"
)

// fixture is a node (a network namespace) with two pods reaching each
// other through it, and a bpffs of the test's own.
type fixture struct {
	t      *testing.T
	layout Layout
	node   ns.NetNS
	pods   [2]ns.NetNS
	eps    [2]dplink.Result
	ips    [2]netip.Addr
	maps   *testMaps
}

func newTestNS(t *testing.T) ns.NetNS {
	t.Helper()
	n, err := testutils.NewNS()
	if err != nil {
		t.Fatalf("create netns: %v", err)
	}
	t.Cleanup(func() {
		_ = n.Close()
		if err := testutils.UnmountNS(n); err != nil {
			t.Errorf("remove netns %s: %v", n.Path(), err)
		}
	})
	return n
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	privileged.Require(t)
	f := &fixture{t: t, layout: Layout{Root: t.TempDir()}}
	if err := f.layout.MountBPFFS(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// Unmounting drops every pin (and so the links) left behind.
		if err := unix.Unmount(f.layout.Root, 0); err != nil {
			t.Errorf("unmount test bpffs: %v", err)
		}
	})
	maps, err := newTestMaps(f.layout.Dir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { maps.Close() })
	f.maps = maps

	router := netip.MustParseAddr("10.219.7.1")
	f.ips = [2]netip.Addr{netip.MustParseAddr("10.219.7.10"), netip.MustParseAddr("10.219.7.11")}
	f.node = newTestNS(t)
	for i := range f.pods {
		f.pods[i] = newTestNS(t)
		r, err := dplink.Host{NetnsPath: f.node.Path()}.SetupEndpoint(context.Background(), dplink.Spec{
			ContainerID: fmt.Sprintf("loader-test-%d-%d", os.Getpid(), i), NetnsPath: f.pods[i].Path(),
			IPv4: f.ips[i].AsSlice(), Gateway: router.AsSlice(),
		})
		if err != nil {
			t.Fatal(err)
		}
		f.eps[i] = r
	}
	// The node answers for the router IP (on lo), routes to each pod
	// through its veth and forwards.
	err = f.node.Do(func(ns.NetNS) error {
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		if err := netlink.LinkSetUp(lo); err != nil {
			return err
		}
		if err := netlink.AddrAdd(lo, &netlink.Addr{IPNet: &net.IPNet{IP: router.AsSlice(), Mask: net.CIDRMask(32, 32)}}); err != nil {
			return err
		}
		for i, ep := range f.eps {
			if err := netlink.RouteAdd(&netlink.Route{LinkIndex: ep.HostIfIndex, Scope: netlink.SCOPE_LINK,
				Dst: &net.IPNet{IP: f.ips[i].AsSlice(), Mask: net.CIDRMask(32, 32)}}); err != nil {
				return err
			}
		}
		return os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1\n"), 0)
	})
	if err != nil {
		t.Fatalf("set up the node: %v", err)
	}
	if err := privileged.Ping(f.pods[0], f.ips[1]); err != nil {
		t.Fatalf("pods do not reach each other before any program: %v", err)
	}
	return f
}

func (f *fixture) ops(spec SpecLoader) *Ops {
	return NewOps(OpsConfig{Layout: f.layout, Netns: Netns{Path: f.node.Path()}, Spec: spec, Maps: f.maps})
}

// row is the desired programs of pod i with identity id.
func (f *fixture) row(i int, id uint32) *bpfprog.Program {
	return &bpfprog.Program{
		EndpointID: uint16(100 + i), HostIfName: f.eps[i].HostIfName, HostIfIndex: f.eps[i].HostIfIndex,
		Identity: identity.NumericIdentity(id), MAC: f.eps[i].PodMAC.String(),
	}
}

// attachedProg is what the kernel has at one hook of a veth.
type attachedProg struct {
	prog ebpf.ProgramID
	link link.ID
}

// attached lists the programs on pod i's host veth at hook t, as the
// kernel reports them (BPF_PROG_QUERY on the device).
func (f *fixture) attached(i int, t ebpf.AttachType) []attachedProg {
	f.t.Helper()
	var out []attachedProg
	err := f.node.Do(func(ns.NetNS) error {
		res, err := link.QueryPrograms(link.QueryOptions{Target: f.eps[i].HostIfIndex, Attach: t})
		if err != nil {
			return err
		}
		for _, p := range res.Programs {
			lid, _ := p.LinkID()
			out = append(out, attachedProg{prog: p.ID, link: lid})
		}
		return nil
	})
	if err != nil {
		f.t.Fatalf("query programs on %s: %v", f.eps[i].HostIfName, err)
	}
	return out
}

// both returns the single program at each hook of pod i's veth, failing
// unless there is exactly one linked program at each.
func (f *fixture) both(i int) [2]attachedProg {
	f.t.Helper()
	var out [2]attachedProg
	for h, t := range []ebpf.AttachType{ebpf.AttachTCXIngress, ebpf.AttachTCXEgress} {
		got := f.attached(i, t)
		if len(got) != 1 || got[0].link == 0 {
			f.t.Fatalf("%s %s: want one program attached through a link, got %+v", f.eps[i].HostIfName, attachName(t), got)
		}
		out[h] = got[0]
	}
	return out
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// TestPrivilegedLoaderAttach loads and attaches the programs of a pod and
// checks with the kernel: one program at each tcx hook of the host veth,
// through pinned links, with the row's constants; the pods still reach
// each other; an unchanged row does nothing; a new identity replaces the
// programs in the same links.
func TestPrivilegedLoaderAttach(t *testing.T) {
	f := newFixture(t)
	ops := f.ops(testSpec)
	row := f.row(0, 1234)
	if err := ops.Update(context.Background(), nil, row); err != nil {
		t.Fatal(err)
	}
	first := f.both(0)
	for _, hk := range hooks {
		if !exists(f.layout.LinkPin(row.EndpointID, hk.prog)) {
			t.Errorf("no pinned link %s", f.layout.LinkPin(row.EndpointID, hk.prog))
		}
	}
	wantMAC, _ := bpf.MACConstant(f.eps[0].PodMAC)
	for h, a := range first {
		id, audit, ident, ifindex, mac, err := rodata(a.prog)
		if err != nil {
			t.Fatal(err)
		}
		if id != row.EndpointID || audit != 0 || ident != 1234 || int(ifindex) != f.eps[0].HostIfIndex || mac != wantMAC || mac == 0 {
			t.Errorf("%s constants: id %d audit %d identity %d ifindex %d mac %#x; want %d 0 1234 %d %#x",
				hooks[h].prog, id, audit, ident, ifindex, mac, row.EndpointID, f.eps[0].HostIfIndex, wantMAC)
		}
	}
	if err := privileged.Ping(f.pods[0], f.ips[1]); err != nil {
		t.Errorf("pod A -> pod B with programs: %v", err)
	}

	// The same row again (a full reconciliation): nothing reloaded.
	if err := ops.Update(context.Background(), nil, row); err != nil {
		t.Fatal(err)
	}
	if again := f.both(0); again != first {
		t.Errorf("unchanged row reloaded the programs: %+v, then %+v", first, again)
	}

	// A new identity and audit mode: new programs, same links.
	row2 := f.row(0, 5678)
	row2.AuditMode = true
	if err := ops.Update(context.Background(), nil, row2); err != nil {
		t.Fatal(err)
	}
	second := f.both(0)
	for h := range second {
		if second[h].link != first[h].link || second[h].prog == first[h].prog {
			t.Errorf("%s: want the program replaced in link %d, got %+v (was %+v)", hooks[h].prog, first[h].link, second[h], first[h])
		}
		_, audit, ident, _, _, err := rodata(second[h].prog)
		if err != nil || audit != 1 || ident != 5678 {
			t.Errorf("%s after the change: audit %d identity %d (%v), want 1 5678", hooks[h].prog, audit, ident, err)
		}
	}
}

// udpFlood sends numbered datagrams from pod 0 to pod 1, at most window
// unanswered... in flight at a time (the receiver's count paces the
// sender, so no socket buffer overflows), until stop is closed and at
// least min were sent. It returns sent and received counts.
type flood struct {
	sent, received atomic.Int64
	errc           chan error
}

func (f *fixture) startFlood(t *testing.T, stop <-chan struct{}, minSent int64) *flood {
	t.Helper()
	fl := &flood{errc: make(chan error, 2)}
	var rx *net.UDPConn
	if err := f.pods[1].Do(func(ns.NetNS) error {
		var err error
		rx, err = net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(f.ips[1], 0)))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	var tx *net.UDPConn
	if err := f.pods[0].Do(func(ns.NetNS) error {
		var err error
		tx, err = net.DialUDP("udp4", nil, rx.LocalAddr().(*net.UDPAddr))
		return err
	}); err != nil {
		rx.Close()
		t.Fatal(err)
	}
	rxDone := make(chan struct{})
	go func() {
		defer close(rxDone)
		buf := make([]byte, 2048)
		for {
			n, err := rx.Read(buf)
			if err != nil {
				return // closed
			}
			if n == countPayload {
				fl.received.Add(1)
			}
		}
	}()
	go func() {
		defer func() { tx.Close(); rx.Close(); <-rxDone }()
		payload := make([]byte, countPayload)
		const window = 64
		for {
			select {
			case <-stop:
				if fl.sent.Load() >= minSent {
					// Let the last datagrams arrive (each one is
					// proof of progress; a loss shows as a stall).
					fl.errc <- waitCount(&fl.received, fl.sent.Load())
					return
				}
			default:
			}
			if err := waitCount(&fl.received, fl.sent.Load()-window); err != nil {
				fl.errc <- err
				return
			}
			if _, err := tx.Write(payload); err != nil {
				fl.errc <- err
				return
			}
			fl.sent.Add(1)
		}
	}()
	return fl
}

// waitCount waits until c reaches n; a count that stops moving for 2s
// means datagrams were lost.
func waitCount(c *atomic.Int64, n int64) error {
	last, since := c.Load(), time.Now()
	for c.Load() < n {
		if cur := c.Load(); cur != last {
			last, since = cur, time.Now()
		} else if time.Since(since) > 2*time.Second {
			return fmt.Errorf("received count stuck at %d, want %d: datagrams lost", cur, n)
		}
		time.Sleep(50 * time.Microsecond)
	}
	return nil
}

// TestPrivilegedLoaderRestartWithoutGap plays an agent restart while a
// stream of UDP datagrams flows from pod A to pod B: a new Ops over the
// same bpffs (nothing in memory) replaces pod A's programs through the
// pinned links. The programs count each datagram at the veth; the counts
// of the old and new programs together equal the datagrams sent, so not
// one packet passed the veth without a program, and none was lost.
func TestPrivilegedLoaderRestartWithoutGap(t *testing.T) {
	f := newFixture(t)
	if err := f.ops(testSpec).Update(context.Background(), nil, f.row(0, 1234)); err != nil {
		t.Fatal(err)
	}
	before := f.both(0)

	stop := make(chan struct{})
	fl := f.startFlood(t, stop, 20000)
	// Wait for the stream to be under way (the programs have counted).
	for {
		n, err := f.maps.counted()
		if err != nil {
			t.Fatal(err)
		}
		if n >= 2000 {
			break
		}
		select {
		case err := <-fl.errc:
			t.Fatalf("stream before the restart: %v", err)
		default:
		}
		time.Sleep(time.Millisecond)
	}
	// The restarted agent, with a changed identity so the programs differ.
	restarted := f.ops(testSpec)
	sentAtRestart := fl.sent.Load()
	if err := restarted.Update(context.Background(), nil, f.row(0, 4321)); err != nil {
		t.Fatal(err)
	}
	after := f.both(0)
	for h := range after {
		if after[h].link != before[h].link || after[h].prog == before[h].prog {
			t.Errorf("%s: want the program replaced in link %d, got %+v (was %+v)", hooks[h].prog, before[h].link, after[h], before[h])
		}
	}
	close(stop)
	if err := <-fl.errc; err != nil {
		t.Fatalf("stream: %v (sent %d, received %d)", err, fl.sent.Load(), fl.received.Load())
	}
	counted, err := f.maps.counted()
	if err != nil {
		t.Fatal(err)
	}
	sent, received := fl.sent.Load(), fl.received.Load()
	t.Logf("sent %d datagrams (%d before the restart), received %d, counted by the programs %d", sent, sentAtRestart, received, counted)
	if received != sent || counted != uint64(sent) {
		t.Errorf("sent %d, received %d, counted by the programs %d: want all equal", sent, received, counted)
	}
}

// TestPrivilegedLoaderDelete checks that Delete detaches both programs,
// removes the pins, the endpoint's directory and its policy map; and that
// Prune does the same for an endpoint not desired, keeping the others.
func TestPrivilegedLoaderDelete(t *testing.T) {
	f := newFixture(t)
	ops := f.ops(testSpec)
	a, b := f.row(0, 1234), f.row(1, 1235)
	for _, r := range []*bpfprog.Program{a, b} {
		if err := ops.Update(context.Background(), nil, r); err != nil {
			t.Fatal(err)
		}
	}
	f.both(0)
	f.both(1)
	if !exists(f.maps.policyPin(a.EndpointID)) {
		t.Fatalf("no policy map pinned for endpoint %d", a.EndpointID)
	}
	if err := ops.Delete(context.Background(), nil, a); err != nil {
		t.Fatal(err)
	}
	for _, at := range []ebpf.AttachType{ebpf.AttachTCXIngress, ebpf.AttachTCXEgress} {
		if got := f.attached(0, at); len(got) != 0 {
			t.Errorf("after delete %s has programs at %s: %+v", f.eps[0].HostIfName, attachName(at), got)
		}
	}
	for _, p := range []string{f.layout.EndpointDir(a.EndpointID), f.maps.policyPin(a.EndpointID)} {
		if exists(p) {
			t.Errorf("after delete %s still exists", p)
		}
	}
	// Deleting again is fine.
	if err := ops.Delete(context.Background(), nil, a); err != nil {
		t.Errorf("second delete: %v", err)
	}

	// Prune with only A desired: B (deleted while the agent was down)
	// goes, from a new Ops that never saw it.
	pruner := f.ops(testSpec)
	if err := pruner.Update(context.Background(), nil, a); err != nil {
		t.Fatal(err)
	}
	desired := func(yield func(*bpfprog.Program, statedb.Revision) bool) { yield(a, 1) }
	if err := pruner.Prune(context.Background(), nil, desired); err != nil {
		t.Fatal(err)
	}
	f.both(0)
	for _, at := range []ebpf.AttachType{ebpf.AttachTCXIngress, ebpf.AttachTCXEgress} {
		if got := f.attached(1, at); len(got) != 0 {
			t.Errorf("after prune %s has programs at %s: %+v", f.eps[1].HostIfName, attachName(at), got)
		}
	}
	if exists(f.layout.EndpointDir(b.EndpointID)) || exists(f.maps.policyPin(b.EndpointID)) {
		t.Errorf("after prune the pins of endpoint %d remain", b.EndpointID)
	}
}

// TestPrivilegedLoaderVerifierError runs the reconciler over a table with
// a collection the verifier rejects: the row's status is an error with
// the verifier's log, and nothing is attached.
func TestPrivilegedLoaderVerifierError(t *testing.T) {
	f := newFixture(t)
	ops := f.ops(brokenSpec)
	err := ops.Update(context.Background(), nil, f.row(0, 1234))
	if !errors.Is(err, ErrVerifier) || !strings.Contains(err.Error(), "R5 !read_ok") {
		t.Fatalf("Update = %v, want ErrVerifier with the log (R5 !read_ok)", err)
	}

	db := statedb.New()
	tbl, err := bpfprog.NewTable(db)
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Start(); err != nil {
		t.Fatal(err)
	}
	defer db.Stop()
	r, err := reconciler.New(db, ReconcilerConfig(Tables{DB: db, Programs: tbl}, ops))
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Subscribe(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { r.Run(ctx, nopHealth{}); close(done) }()
	defer func() { cancel(); <-done }()
	wtxn := db.WriteTxn(tbl)
	_, _, _ = tbl.Insert(wtxn, f.row(0, 1234).WithStatus(reconciler.Pending()))
	wtxn.Commit()
	deadline := time.After(10 * time.Second)
	for {
		row, _, watch, _ := tbl.GetWatch(db.ReadTxn(), bpfprog.EndpointIDIndex.Query(100))
		if row.Status.Kind == reconciler.StatusError {
			if !strings.Contains(row.Status.Error, "R5 !read_ok") || !strings.Contains(row.Status.Error, "verifier") {
				t.Errorf("status error lacks the verifier log: %q", row.Status.Error)
			}
			break
		}
		select {
		case <-watch:
		case <-deadline:
			t.Fatalf("row status still %s", row.Status)
		}
	}
	for _, at := range []ebpf.AttachType{ebpf.AttachTCXIngress, ebpf.AttachTCXEgress} {
		if got := f.attached(0, at); len(got) != 0 {
			t.Errorf("a rejected collection left programs at %s: %+v", attachName(at), got)
		}
	}
}

type nopHealth struct{}

func (nopHealth) OK(string)              {}
func (nopHealth) Degraded(string, error) {}

// TestPrivilegedLoaderClsactFallback attaches as clsact filters (what the
// loader does where tcx is not supported): both filters are on the veth
// with the loaded programs, traffic flows, a change replaces them, Delete
// removes them.
func TestPrivilegedLoaderClsactFallback(t *testing.T) {
	f := newFixture(t)
	ops := f.ops(testSpec)
	ops.forceClsact = true
	row := f.row(0, 1234)
	if err := ops.Update(context.Background(), nil, row); err != nil {
		t.Fatal(err)
	}
	filters := func() (ids [2]int) {
		t.Helper()
		err := f.node.Do(func(ns.NetNS) error {
			h, err := netlink.NewHandle(unix.NETLINK_ROUTE)
			if err != nil {
				return err
			}
			defer h.Close()
			for i, hk := range hooks {
				bf, err := ownFilter(h, f.eps[0].HostIfIndex, hk)
				if err != nil {
					return err
				}
				if bf != nil {
					ids[i] = bf.Id
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		return ids
	}
	first := filters()
	if first[0] == 0 || first[1] == 0 {
		t.Fatalf("clsact filters: %v, want a program at ingress and egress", first)
	}
	if err := privileged.Ping(f.pods[0], f.ips[1]); err != nil {
		t.Errorf("pod A -> pod B with clsact programs: %v", err)
	}
	if err := ops.Update(context.Background(), nil, f.row(0, 999)); err != nil {
		t.Fatal(err)
	}
	if second := filters(); second[0] == first[0] || second[1] == first[1] || second[0] == 0 {
		t.Errorf("filters after a change: %v, want new programs (were %v)", second, first)
	}
	if err := ops.Delete(context.Background(), nil, row); err != nil {
		t.Fatal(err)
	}
	if got := filters(); got != [2]int{} {
		t.Errorf("filters after delete: %v", got)
	}
}

// BenchmarkPrivilegedLoaderReplace measures one reload of the real
// programs (datapath/bpf: ELF copy, constants, the kernel's verifier,
// maps) and their replacement in the pinned links of a veth: what an
// identity change or an agent restart costs per endpoint; and the check
// of an unchanged row (the periodic full reconciliation).
func BenchmarkPrivilegedLoaderReplace(b *testing.B) {
	privileged.Require(b)
	root := b.TempDir()
	layout := Layout{Root: root}
	if err := layout.MountBPFFS(); err != nil {
		b.Fatal(err)
	}
	defer func() { _ = unix.Unmount(root, 0) }()
	node, err := testutils.NewNS()
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = node.Close(); _ = testutils.UnmountNS(node) }()
	var ifindex int
	err = node.Do(func(ns.NetNS) error {
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "ldrbench0"}, PeerName: "ldrbench1"}); err != nil {
			return err
		}
		l, err := netlink.LinkByName("ldrbench0")
		if err != nil {
			return err
		}
		ifindex = l.Attrs().Index
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
	maps := NewPinnedMaps(layout.Dir())
	defer maps.Close()
	ops := NewOps(OpsConfig{Layout: layout, Netns: Netns{Path: node.Path()}, Spec: LoadSpec, Maps: maps})
	row := &bpfprog.Program{EndpointID: 1, HostIfName: "ldrbench0", HostIfIndex: ifindex, MAC: "0a:00:00:00:00:01"}
	b.Run("changed", func(b *testing.B) {
		for i := range b.N {
			row.Identity = identity.NumericIdentity(1000 + i%2) // a change every time
			if err := ops.Update(context.Background(), nil, row); err != nil {
				b.Fatal(err)
			}
		}
	})
	// The periodic check of an endpoint whose links are intact.
	b.Run("unchanged", func(b *testing.B) {
		for range b.N {
			if err := ops.Update(context.Background(), nil, row); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// TestPrivilegedLoaderVethRecreated: the veth is deleted and made again
// under the same name (a new ifindex). The pinned links of the old one
// are dropped and new ones attached to the new veth, with the new
// ifindex as ENDPOINT_IFINDEX; the periodic check of an unchanged row
// also repairs a link removed behind the loader's back.
func TestPrivilegedLoaderVethRecreated(t *testing.T) {
	privileged.Require(t)
	layout := Layout{Root: t.TempDir()}
	if err := layout.MountBPFFS(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(layout.Root, 0); err != nil {
			t.Errorf("unmount test bpffs: %v", err)
		}
	})
	maps, err := newTestMaps(layout.Dir())
	if err != nil {
		t.Fatal(err)
	}
	defer maps.Close()
	node := newTestNS(t)
	mkVeth := func() (idx int) {
		t.Helper()
		err := node.Do(func(ns.NetNS) error {
			if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "ldrtest0"}, PeerName: "ldrtest1"}); err != nil {
				return err
			}
			l, err := netlink.LinkByName("ldrtest0")
			if err != nil {
				return err
			}
			idx = l.Attrs().Index
			return netlink.LinkSetUp(l)
		})
		if err != nil {
			t.Fatal(err)
		}
		return idx
	}
	progsOn := func(idx int) (out [2][]link.AttachedProgram) {
		t.Helper()
		err := node.Do(func(ns.NetNS) error {
			for i, at := range []ebpf.AttachType{ebpf.AttachTCXIngress, ebpf.AttachTCXEgress} {
				res, err := link.QueryPrograms(link.QueryOptions{Target: idx, Attach: at})
				if err != nil {
					return err
				}
				out[i] = res.Programs
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	ops := NewOps(OpsConfig{Layout: layout, Netns: Netns{Path: node.Path()}, Spec: testSpec, Maps: maps})
	first := mkVeth()
	row := &bpfprog.Program{EndpointID: 5, HostIfName: "ldrtest0", HostIfIndex: first, Identity: 1234}
	if err := ops.Update(context.Background(), nil, row); err != nil {
		t.Fatal(err)
	}
	if got := progsOn(first); len(got[0]) != 1 || len(got[1]) != 1 {
		t.Fatalf("programs on the first veth: %+v", got)
	}
	if err := node.Do(func(ns.NetNS) error {
		l, err := netlink.LinkByName("ldrtest0")
		if err != nil {
			return err
		}
		return netlink.LinkDel(l)
	}); err != nil {
		t.Fatal(err)
	}
	second := mkVeth()
	if second == first {
		t.Fatalf("the re-created veth has the same ifindex %d", first)
	}
	row2 := *row
	row2.HostIfIndex = second
	if err := ops.Update(context.Background(), nil, &row2); err != nil {
		t.Fatal(err)
	}
	got := progsOn(second)
	if len(got[0]) != 1 || len(got[1]) != 1 {
		t.Fatalf("programs on the re-created veth: %+v", got)
	}
	if _, _, _, ifindex, _, err := rodata(got[0][0].ID); err != nil || int(ifindex) != second {
		t.Errorf("ENDPOINT_IFINDEX %d (%v), want %d", ifindex, err, second)
	}
	for _, hk := range hooks {
		l, err := link.LoadPinnedLink(layout.LinkPin(row.EndpointID, hk.prog), nil)
		if err != nil {
			t.Fatal(err)
		}
		if !linkOn(l, second, hk.tcx) {
			t.Errorf("pinned link %s is not on the re-created veth", hk.prog)
		}
		l.Close()
	}

	// Someone removes a link: the next check of the same row repairs it.
	if err := removeLinkPin(layout.LinkPin(row.EndpointID, ProgToContainer)); err != nil {
		t.Fatal(err)
	}
	if got := progsOn(second); len(got[1]) != 0 {
		t.Fatalf("egress program still there after its link was removed: %+v", got[1])
	}
	if err := ops.Update(context.Background(), nil, &row2); err != nil {
		t.Fatal(err)
	}
	if got := progsOn(second); len(got[0]) != 1 || len(got[1]) != 1 {
		t.Errorf("programs after the repair: %+v", got)
	}
}
