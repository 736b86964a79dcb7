package routing

import (
	"context"
	"fmt"
	"iter"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/statedb"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/containernetworking/plugins/pkg/testutils"
	"github.com/google/nftables"
	"github.com/vishvananda/netlink"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	"github.com/cellium/cellium/datapath/link"
	"github.com/cellium/cellium/statedb/endpoints"
	"github.com/cellium/cellium/statedb/nodes"
	"github.com/cellium/cellium/statedb/reconciler"
	"github.com/cellium/cellium/statedb/routes"
	"github.com/cellium/cellium/test/privileged"
)

// Every address below lives only inside network namespaces the test makes:
// one plays the node, one each pod. The node namespace has no default
// route and no link to the outside, and the pods route only through it,
// so no packet can leave the test namespaces.
var (
	testRouter = netip.MustParseAddr("10.213.0.1")
	testPodA   = netip.MustParseAddr("10.213.0.10")
	testPodB   = netip.MustParseAddr("10.213.0.11")
)

func newTestNS(tb testing.TB) ns.NetNS {
	tb.Helper()
	n, err := testutils.NewNS()
	if err != nil {
		tb.Fatalf("create netns: %v", err)
	}
	tb.Cleanup(func() {
		_ = n.Close()
		if err := testutils.UnmountNS(n); err != nil {
			tb.Errorf("remove netns %s: %v", n.Path(), err)
		}
	})
	return n
}

type nopHealth struct{}

func (nopHealth) OK(string)              {}
func (nopHealth) Degraded(string, error) {}

// harness runs the deriver and the three reconcilers against a node
// namespace, fed by endpoints and local-node tables the test writes.
type harness struct {
	t         testing.TB
	db        *statedb.DB
	eps       statedb.RWTable[*endpoints.Endpoint]
	local     statedb.RWTable[*nodes.LocalNode]
	nodes     statedb.RWTable[*nodes.Node]
	tables    Tables
	epsInit   func(statedb.WriteTxn)
	nodeNetns Netns
	stop      func()
}

func startHarness(t testing.TB, node ns.NetNS, fullInterval time.Duration, masquerade ...bool) *harness {
	t.Helper()
	return startHarnessRemote(t, node, fullInterval, len(masquerade) > 0 && masquerade[0], nil)
}

// startHarnessRemote is startHarness with a nodes table and remote, how the
// node reaches other nodes' pods (nil: it does not).
func startHarnessRemote(t testing.TB, node ns.NetNS, fullInterval time.Duration, masquerade bool, remote *RemoteConfig) *harness {
	t.Helper()
	db := statedb.New()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	eps, err := endpoints.NewTable(db)
	must(err)
	local, err := nodes.NewLocalNodeTable(db)
	must(err)
	rt, err := routes.NewRoutesTable(db)
	must(err)
	dt, err := routes.NewDevicesTable(db)
	must(err)
	st, err := routes.NewSysctlsTable(db)
	must(err)
	h := &harness{t: t, db: db, eps: eps, local: local, nodeNetns: Netns{Path: node.Path()}}
	wtxn := db.WriteTxn(eps)
	h.epsInit = eps.RegisterInitializer(wtxn, "test")
	wtxn.Commit()
	h.tables = Tables{DB: db, Endpoints: eps, LocalNode: local, Routes: rt, Devices: dt, Sysctls: st}
	if remote != nil {
		h.nodes, err = nodes.NewNodesTable(db)
		must(err)
		h.tables.Nodes, h.tables.Remote = h.nodes, remote
	}
	var runs []func(context.Context, reconciler.Health)
	if masquerade {
		mt, err := routes.NewMasqueradeTable(db)
		must(err)
		h.tables.Masquerade = mt
		mc := MasqueradeReconciler(h.tables, h.nodeNetns)
		mc.FullInterval = fullInterval
		mr, err := reconciler.New(db, mc)
		must(err)
		must(mr.Subscribe())
		runs = append(runs, mr.Run)
	}

	d := NewDeriver(h.tables)
	rc, dc, sc := Reconcilers(h.tables, h.nodeNetns)
	rc.FullInterval, dc.FullInterval, sc.FullInterval = fullInterval, fullInterval, fullInterval
	rr, err := reconciler.New(db, rc)
	must(err)
	dr, err := reconciler.New(db, dc)
	must(err)
	sr, err := reconciler.New(db, sc)
	must(err)
	must(rr.Subscribe())
	must(dr.Subscribe())
	must(sr.Subscribe())

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for _, run := range append(runs, d.Run, rr.Run, dr.Run, sr.Run) {
		wg.Add(1)
		go func() { defer wg.Done(); run(ctx, nopHealth{}) }()
	}
	var once sync.Once
	h.stop = func() { once.Do(func() { cancel(); wg.Wait() }) }
	t.Cleanup(h.stop)
	return h
}

func (h *harness) setLocalNode(router netip.Addr) {
	h.setLocalNodeCIDR(router, netip.PrefixFrom(router, 24).Masked())
}

func (h *harness) setLocalNodeCIDR(router netip.Addr, cidr netip.Prefix) {
	wtxn := h.db.WriteTxn(h.local)
	_, _, _ = h.local.Insert(wtxn, &nodes.LocalNode{Name: "test-node", RouterIP: router, PodCIDRs: []netip.Prefix{cidr}})
	wtxn.Commit()
}

func (h *harness) upsertEndpoint(ep *endpoints.Endpoint) {
	wtxn := h.db.WriteTxn(h.eps)
	_, _, _ = h.eps.Insert(wtxn, ep)
	wtxn.Commit()
}

func (h *harness) deleteEndpoint(id uint16) {
	wtxn := h.db.WriteTxn(h.eps)
	_, _, _ = h.eps.Delete(wtxn, &endpoints.Endpoint{ID: id})
	wtxn.Commit()
}

func (h *harness) endpointsRestored() {
	wtxn := h.db.WriteTxn(h.eps)
	h.epsInit(wtxn)
	wtxn.Commit()
}

// waitTables waits until cond holds over a snapshot, re-checking on every
// change of the three desired tables.
func (h *harness) waitTables(what string, cond func(txn statedb.ReadTxn) bool) {
	h.t.Helper()
	timeout := time.After(15 * time.Second)
	for {
		txn := h.db.ReadTxn()
		_, w1 := h.tables.Routes.AllWatch(txn)
		_, w2 := h.tables.Devices.AllWatch(txn)
		_, w3 := h.tables.Sysctls.AllWatch(txn)
		var w4 <-chan struct{}
		var masq []string
		if h.tables.Masquerade != nil {
			var rows iter.Seq2[*routes.Masquerade, statedb.Revision]
			rows, w4 = h.tables.Masquerade.AllWatch(txn)
			for m := range rows {
				masq = append(masq, m.Prefix.String()+" "+m.Status.String())
			}
		}
		if cond(txn) {
			return
		}
		select {
		case <-w1:
		case <-w2:
		case <-w3:
		case <-w4:
		case <-timeout:
			h.t.Fatalf("timed out waiting for %s; routes: %v; masquerade: %v", what, dumpRoutes(txn, h.tables.Routes), masq)
		}
	}
}

func dumpRoutes(txn statedb.ReadTxn, t statedb.Table[*routes.Route]) []string {
	var out []string
	for r := range t.All(txn) {
		out = append(out, fmt.Sprintf("%s dev %s %s", r.Prefix, r.Device, r.Status))
	}
	return out
}

func allDone(txn statedb.ReadTxn, tb Tables, nRoutes int) bool {
	n := 0
	for r := range tb.Routes.All(txn) {
		if r.Status.Kind != reconciler.StatusDone {
			return false
		}
		n++
	}
	nd := 0
	for d := range tb.Devices.All(txn) {
		if d.Status.Kind != reconciler.StatusDone {
			return false
		}
		nd++
	}
	ns := 0
	for s := range tb.Sysctls.All(txn) {
		if s.Status.Kind != reconciler.StatusDone {
			return false
		}
		ns++
	}
	return n == nRoutes && nd == 1 && ns > 0
}

// waitKernel polls the node namespace until cond holds (the reconciler
// writes to the kernel after the table says so, or by itself when
// pruning, so there is no table event to wait for).
func waitKernel(t testing.TB, what string, cond func() (bool, error)) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		ok, err := cond()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// nodeRoutes lists the main-table IPv4 routes of the node namespace.
func nodeRoutes(nh *netlink.Handle) ([]netlink.Route, error) {
	return retryDump(func() ([]netlink.Route, error) {
		return nh.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Table: syscall.RT_TABLE_MAIN}, netlink.RT_FILTER_TABLE)
	})
}

func findRoute(rs []netlink.Route, dst string, proto int) *netlink.Route {
	for i, r := range rs {
		if r.Dst != nil && r.Dst.String() == dst && int(r.Protocol) == proto {
			return &rs[i]
		}
	}
	return nil
}

func setupPod(t *testing.T, node ns.NetNS, id int, ip netip.Addr) (ns.NetNS, link.Result) {
	t.Helper()
	pod := newTestNS(t)
	res, err := link.Host{NetnsPath: node.Path()}.SetupEndpoint(context.Background(), link.Spec{
		ContainerID: fmt.Sprintf("routing-test-%d", id),
		NetnsPath:   pod.Path(),
		IPv4:        ip.AsSlice(),
		Gateway:     testRouter.AsSlice(),
	})
	if err != nil {
		t.Fatal(err)
	}
	return pod, res
}

func nodeHandle(t testing.TB, node ns.NetNS) *netlink.Handle {
	t.Helper()
	var nh *netlink.Handle
	err := node.Do(func(ns.NetNS) error {
		var err error
		nh, err = netlink.NewHandle(syscall.NETLINK_ROUTE)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nh.Close)
	return nh
}

// TestPrivilegedConnectivity: two pods made by the CNI path's link package
// on a test node; from the endpoints and local-node tables alone the
// reconcilers program cilium_host, the routes and the sysctls, and then
// pods reach each other and the node (ICMP and TCP). On the old code
// nothing made cilium_host or the routes, and the pods could not talk.
func TestPrivilegedConnectivity(t *testing.T) {
	privileged.Require(t)
	node := newTestNS(t)
	nh := nodeHandle(t, node)
	podA, resA := setupPod(t, node, 1, testPodA)
	podB, resB := setupPod(t, node, 2, testPodB)

	h := startHarness(t, node, time.Hour)
	h.setLocalNode(testRouter)
	h.upsertEndpoint(&endpoints.Endpoint{ID: 1, IPv4: testPodA, HostIfName: resA.HostIfName, State: ciliumv2.EndpointStateReady})
	h.upsertEndpoint(&endpoints.Endpoint{ID: 2, IPv4: testPodB, HostIfName: resB.HostIfName, State: ciliumv2.EndpointStateReady})
	h.endpointsRestored()
	h.waitTables("all rows reconciled", func(txn statedb.ReadTxn) bool { return allDone(txn, h.tables, 2) })

	// What the kernel now holds.
	host, err := nh.LinkByName(routes.HostDevice)
	if err != nil {
		t.Fatalf("cilium_host: %v", err)
	}
	if host.Type() != "veth" || host.Attrs().Flags&net.FlagUp == 0 {
		t.Errorf("cilium_host is a %s with flags %v, want an up veth", host.Type(), host.Attrs().Flags)
	}
	addrs, err := nh.AddrList(host, netlink.FAMILY_V4)
	if err != nil || len(addrs) != 1 || addrs[0].IPNet.String() != "10.213.0.1/32" {
		t.Errorf("cilium_host addresses = %v (%v), want 10.213.0.1/32", addrs, err)
	}
	rs, err := nodeRoutes(nh)
	if err != nil {
		t.Fatal(err)
	}
	for ip, dev := range map[netip.Addr]link.Result{testPodA: resA, testPodB: resB} {
		r := findRoute(rs, ip.String()+"/32", routes.Protocol)
		if r == nil || r.LinkIndex != dev.HostIfIndex || r.Scope != netlink.SCOPE_LINK {
			t.Errorf("route to %s = %+v, want scope link dev %s proto %d", ip, r, dev.HostIfName, routes.Protocol)
		}
	}
	var fwd string
	_ = node.Do(func(ns.NetNS) error {
		b, err := os.ReadFile("/proc/sys/net/ipv4/ip_forward")
		fwd = string(b)
		return err
	})
	if fwd != "1\n" {
		t.Errorf("node ip_forward = %q, want 1", fwd)
	}

	t.Run("icmp", func(t *testing.T) {
		for _, c := range []struct {
			name string
			from ns.NetNS
			dst  netip.Addr
		}{{"A->B", podA, testPodB}, {"B->A", podB, testPodA}, {"A->router", podA, testRouter}} {
			if err := privileged.Ping(c.from, c.dst); err != nil {
				t.Errorf("%s: %v", c.name, err)
			}
		}
	})
	t.Run("tcp", func(t *testing.T) {
		peer, err := privileged.TCPEcho(podB, testPodB, podA, []byte("pod A to pod B"))
		if err != nil {
			t.Fatalf("pod A -> pod B: %v", err)
		}
		if peer != testPodA {
			t.Errorf("pod B saw %s, want pod A's %s", peer, testPodA)
		}
		if _, err := privileged.TCPEcho(node, testRouter, podA, []byte("pod A to the node")); err != nil {
			t.Errorf("pod A -> node (router IP): %v", err)
		}
		if _, err := privileged.TCPEcho(podA, testPodA, node, []byte("node to pod A")); err != nil {
			t.Errorf("node -> pod A: %v", err)
		}
	})
}

// TestPrivilegedPrune: deleting an endpoint row removes its route; a route
// with the agent's protocol that nothing desires (left by an earlier
// agent) is pruned by the full reconciliation; routes with other
// protocols, even to a pod address, are never touched; a route whose
// device is missing shows the error in its row.
func TestPrivilegedPrune(t *testing.T) {
	privileged.Require(t)
	node := newTestNS(t)
	nh := nodeHandle(t, node)
	_, resA := setupPod(t, node, 1, testPodA)
	_, resB := setupPod(t, node, 2, testPodB)

	// Before the agent: a stale route of ours and two foreign ones.
	hostA, err := nh.LinkByName(resA.HostIfName)
	if err != nil {
		t.Fatal(err)
	}
	add := func(dst string, proto int, typ int, linkIndex int) {
		t.Helper()
		_, ipn, _ := net.ParseCIDR(dst)
		r := &netlink.Route{Dst: ipn, Table: syscall.RT_TABLE_MAIN, Protocol: netlink.RouteProtocol(proto), Type: typ, LinkIndex: linkIndex}
		if typ == syscall.RTN_UNICAST {
			r.Scope = netlink.SCOPE_LINK
		}
		if err := nh.RouteAdd(r); err != nil {
			t.Fatalf("add route %s: %v", dst, err)
		}
	}
	add("10.213.0.98/32", routes.Protocol, syscall.RTN_UNICAST, hostA.Attrs().Index) // stale, ours
	add("10.213.0.99/32", syscall.RTPROT_STATIC, syscall.RTN_UNICAST, hostA.Attrs().Index)
	add("10.213.9.0/24", syscall.RTPROT_STATIC, syscall.RTN_BLACKHOLE, 0)

	h := startHarness(t, node, 100*time.Millisecond)
	h.setLocalNode(testRouter)
	h.upsertEndpoint(&endpoints.Endpoint{ID: 1, IPv4: testPodA, HostIfName: resA.HostIfName, State: ciliumv2.EndpointStateReady})
	h.upsertEndpoint(&endpoints.Endpoint{ID: 2, IPv4: testPodB, HostIfName: resB.HostIfName, State: ciliumv2.EndpointStateReady})
	h.endpointsRestored()
	h.waitTables("all rows reconciled", func(txn statedb.ReadTxn) bool { return allDone(txn, h.tables, 2) })

	waitKernel(t, "the stale route 10.213.0.98/32 pruned", func() (bool, error) {
		rs, err := nodeRoutes(nh)
		return findRoute(rs, "10.213.0.98/32", routes.Protocol) == nil, err
	})
	rs, err := nodeRoutes(nh)
	if err != nil {
		t.Fatal(err)
	}
	if findRoute(rs, "10.213.0.99/32", syscall.RTPROT_STATIC) == nil {
		t.Error("the foreign route 10.213.0.99/32 proto static was removed")
	}
	if findRoute(rs, "10.213.9.0/24", syscall.RTPROT_STATIC) == nil {
		t.Error("the foreign blackhole 10.213.9.0/24 was removed")
	}

	h.deleteEndpoint(2)
	waitKernel(t, "the route to the deleted endpoint removed", func() (bool, error) {
		rs, err := nodeRoutes(nh)
		return findRoute(rs, testPodB.String()+"/32", routes.Protocol) == nil, err
	})
	rs, _ = nodeRoutes(nh)
	if findRoute(rs, testPodA.String()+"/32", routes.Protocol) == nil {
		t.Error("the route to endpoint 1 went with endpoint 2's")
	}

	// An endpoint whose veth is gone: the row says why it is not routed.
	h.upsertEndpoint(&endpoints.Endpoint{ID: 3, IPv4: netip.MustParseAddr("10.213.0.12"), HostIfName: "lxcmissing", State: ciliumv2.EndpointStateReady})
	h.waitTables("an error status on the route without a device", func(txn statedb.ReadTxn) bool {
		r, _, ok := h.tables.Routes.Get(txn, routes.PrefixIndex.Query(netip.MustParsePrefix("10.213.0.12/32")))
		return ok && r.Status.Kind == reconciler.StatusError &&
			strings.Contains(r.Status.Error, "lxcmissing")
	})

	// Without a router IP cilium_host is not desired: it is removed.
	h.setLocalNode(netip.Addr{})
	waitKernel(t, "cilium_host removed", func() (bool, error) {
		l, err := linkByName(nh, routes.HostDevice)
		return l == nil, err
	})
}

// TestPrivilegedVethRecreated: the CNI plugin re-creates a pod's veth under
// the same name (an ADD retried): the kernel dropped the route with the old
// link, and the endpoint's new ifindex alone brings it back, without
// waiting for a full reconciliation (there is none in this test).
func TestPrivilegedVethRecreated(t *testing.T) {
	privileged.Require(t)
	node := newTestNS(t)
	nh := nodeHandle(t, node)
	podA, resA := setupPod(t, node, 1, testPodA)
	h := startHarness(t, node, time.Hour)
	h.setLocalNode(testRouter)
	h.upsertEndpoint(&endpoints.Endpoint{ID: 1, IPv4: testPodA, HostIfName: resA.HostIfName, HostIfIndex: resA.HostIfIndex, State: ciliumv2.EndpointStateReady})
	h.endpointsRestored()
	h.waitTables("all rows reconciled", func(txn statedb.ReadTxn) bool { return allDone(txn, h.tables, 1) })

	res2, err := link.Host{NetnsPath: node.Path()}.SetupEndpoint(context.Background(), link.Spec{
		ContainerID: "routing-test-1", NetnsPath: podA.Path(), IPv4: testPodA.AsSlice(), Gateway: testRouter.AsSlice(),
	})
	if err != nil {
		t.Fatal(err)
	}
	if res2.HostIfName != resA.HostIfName || res2.HostIfIndex == resA.HostIfIndex {
		t.Fatalf("re-created veth %s/%d, want the name %s with a new index", res2.HostIfName, res2.HostIfIndex, resA.HostIfName)
	}
	// The kernel dropped the route with the old link. (A retry of the
	// reconciler may already have put it back through the new link of the
	// same name; either way the route must end up on the new ifindex.)
	if rs, _ := nodeRoutes(nh); findRoute(rs, testPodA.String()+"/32", routes.Protocol) != nil {
		t.Log("the route is already back through the re-created veth")
	}
	h.upsertEndpoint(&endpoints.Endpoint{ID: 1, IPv4: testPodA, HostIfName: res2.HostIfName, HostIfIndex: res2.HostIfIndex, State: ciliumv2.EndpointStateReady})
	waitKernel(t, "the route through the new veth", func() (bool, error) {
		rs, err := nodeRoutes(nh)
		r := findRoute(rs, testPodA.String()+"/32", routes.Protocol)
		return r != nil && r.LinkIndex == res2.HostIfIndex, err
	})
	if err := privileged.Ping(podA, testRouter); err != nil {
		t.Errorf("pod -> node after the veth was re-created: %v", err)
	}
}

// TestPrivilegedMasquerade: a pod reaches a namespace playing the outside
// world through the node, masqueraded to the node's address on that link
// (the world has no route back to the pod CIDR); pod to pod is not
// masqueraded; a pod CIDR that goes away takes its rule with it.
func TestPrivilegedMasquerade(t *testing.T) {
	privileged.Require(t)
	node := newTestNS(t)
	nh := nodeHandle(t, node)
	world := newTestNS(t)
	wh := nodeHandle(t, world)
	podA, resA := setupPod(t, node, 1, testPodA)
	podB, resB := setupPod(t, node, 2, testPodB)

	// node 10.215.0.1/24 (cw-out) <-> world 10.215.0.2/24 (cw-in).
	out := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "cw-out"}, PeerName: "cw-in", PeerNamespace: netlink.NsFd(int(world.Fd()))}
	if err := nh.LinkAdd(out); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		h          *netlink.Handle
		name, addr string
	}{{nh, "cw-out", "10.215.0.1/24"}, {wh, "cw-in", "10.215.0.2/24"}} {
		l, err := c.h.LinkByName(c.name)
		if err != nil {
			t.Fatal(err)
		}
		a, _ := netlink.ParseAddr(c.addr)
		if err := c.h.AddrAdd(l, a); err != nil {
			t.Fatal(err)
		}
		if err := c.h.LinkSetUp(l); err != nil {
			t.Fatal(err)
		}
	}

	h := startHarness(t, node, time.Hour, true)
	h.setLocalNode(testRouter)
	h.upsertEndpoint(&endpoints.Endpoint{ID: 1, IPv4: testPodA, HostIfName: resA.HostIfName, State: ciliumv2.EndpointStateReady})
	h.upsertEndpoint(&endpoints.Endpoint{ID: 2, IPv4: testPodB, HostIfName: resB.HostIfName, State: ciliumv2.EndpointStateReady})
	h.endpointsRestored()
	masqDone := func(txn statedb.ReadTxn) bool {
		n := 0
		for m := range h.tables.Masquerade.All(txn) {
			if m.Status.Kind != reconciler.StatusDone {
				return false
			}
			n++
		}
		return n == 1
	}
	h.waitTables("all rows reconciled", func(txn statedb.ReadTxn) bool {
		return allDone(txn, h.tables, 2) && masqDone(txn)
	})

	peer, err := privileged.TCPEcho(world, netip.MustParseAddr("10.215.0.2"), podA, []byte("pod A to the world"))
	if err != nil {
		t.Fatalf("pod A -> world: %v", err)
	}
	if want := netip.MustParseAddr("10.215.0.1"); peer != want {
		t.Errorf("the world saw %s, want the node's %s (masqueraded)", peer, want)
	}
	if peer, err := privileged.TCPEcho(podB, testPodB, podA, []byte("pod A to pod B")); err != nil || peer != testPodA {
		t.Errorf("pod A -> pod B: seen as %s (%v), want %s: pod to pod is not masqueraded", peer, err, testPodA)
	}

	// Another pod CIDR: the old rule is removed, the new one added.
	h.setLocalNodeCIDR(testRouter, netip.MustParsePrefix("10.213.0.0/23"))
	waitKernel(t, "the masquerade rule of 10.213.0.0/24 replaced", func() (bool, error) {
		var tags []string
		err := MasqueradeOps{Netns: h.nodeNetns}.conn(func(c *nftables.Conn) error {
			rs, err := rules(c)
			for _, r := range rs {
				tags = append(tags, string(r.UserData))
			}
			return err
		})
		return len(tags) == 1 && tags[0] == masqTag+"10.213.0.0/23", err
	})
}

// TestPrivilegedStrayPeer: a cilium_net left without its cilium_host (its
// veth peer is something else) does not block creating the pair.
func TestPrivilegedStrayPeer(t *testing.T) {
	privileged.Require(t)
	node := newTestNS(t)
	nh := nodeHandle(t, node)
	if err := nh.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: routes.NetDevice}, PeerName: "cr-stray"}); err != nil {
		t.Fatal(err)
	}
	h := startHarness(t, node, time.Hour)
	h.setLocalNode(testRouter)
	h.endpointsRestored()
	h.waitTables("cilium_host reconciled", func(txn statedb.ReadTxn) bool { return allDone(txn, h.tables, 0) })
	l, err := nh.LinkByName(routes.HostDevice)
	if err != nil {
		t.Fatal(err)
	}
	peer, err := nh.LinkByName(routes.NetDevice)
	if err != nil || peer.Attrs().ParentIndex != l.Attrs().Index {
		t.Errorf("cilium_net (%v) is not the peer of cilium_host", err)
	}
}

// routesOwned counts the routes with the agent's protocol in the node.
func (h *harness) routesOwned() (int, error) {
	n := 0
	err := h.nodeNetns.handle(func(nh *netlink.Handle) error {
		rs, err := RouteOps{}.list(nh)
		n = len(rs)
		return err
	})
	return n, err
}
