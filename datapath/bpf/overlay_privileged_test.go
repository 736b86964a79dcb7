package bpf_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	ebpflink "github.com/cilium/ebpf/link"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/cellium/cellium/datapath/bpf"
	"github.com/cellium/cellium/datapath/loader"
	"github.com/cellium/cellium/datapath/maps"
	"github.com/cellium/cellium/datapath/routing"
	"github.com/cellium/cellium/statedb/identity"
	"github.com/cellium/cellium/statedb/policy"
	"github.com/cellium/cellium/statedb/routes"
	"github.com/cellium/cellium/test/privileged"
)

// The two-node topology: a "wire" namespace holding a bridge (with
// wireIP, an address that is no node's), and two node namespaces whose
// uplink eth0 is a veth on that bridge. Each node has its own bpffs and
// map set, its own router IP and pod CIDR. Everything is inside
// 10.78.0.0/16, which the root namespace blackholes while the test runs.
var (
	overlayRange = netip.MustParsePrefix("10.78.0.0/16")
	wireIP       = netip.MustParseAddr("10.78.0.254")
)

const (
	vxlanDevice = "cilium_vxlan"
	vxlanPort   = 8472
)

type xnode struct {
	*testNode
	name    string
	ip      netip.Addr   // on eth0
	podCIDR netip.Prefix // its pods
	m       *maps.Maps
	dir     string // the maps' pin directory, <root>/cellium
	root    string // the bpffs (the agent's --bpf-root)
	events  *eventReader
	seen    []maps.Event
	// overlayMonitor, when set, loads the tunnel device's programs with
	// traces on at its aggregation (else traces off).
	overlayMonitor *bpf.Monitor
	// nodePort loads localPod's programs with NODEPORT_ENABLED.
	nodePort bool
	// overlayViaStack loads the tunnel device's programs (agent parts)
	// with DELIVER_VIA_STACK.
	overlayViaStack bool
}

// blackholeRange routes prefix to a blackhole in the root namespace until
// tb ends, so nothing of the test's ranges can leave the machine.
func blackholeRange(tb testing.TB, prefix netip.Prefix) {
	tb.Helper()
	route := &netlink.Route{Dst: &net.IPNet{IP: prefix.Addr().AsSlice(), Mask: net.CIDRMask(prefix.Bits(), 32)},
		Type: syscall.RTN_BLACKHOLE, Table: syscall.RT_TABLE_MAIN}
	if err := netlink.RouteAdd(route); err != nil && !errors.Is(err, syscall.EEXIST) {
		tb.Fatalf("blackhole %s: %v", prefix, err)
	}
	tb.Cleanup(func() { _ = netlink.RouteDel(route) })
}

// newWire makes the wire namespace with its bridge br0 carrying wireIP.
func newWire(tb testing.TB) ns.NetNS {
	tb.Helper()
	w := newNetns(tb)
	err := w.Do(func(ns.NetNS) error {
		br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "br0"}}
		if err := netlink.LinkAdd(br); err != nil {
			return fmt.Errorf("add bridge: %w", err)
		}
		if err := netlink.AddrAdd(br, &netlink.Addr{IPNet: &net.IPNet{IP: wireIP.AsSlice(), Mask: net.CIDRMask(24, 32)}}); err != nil {
			return err
		}
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		if err := netlink.LinkSetUp(lo); err != nil {
			return err
		}
		return netlink.LinkSetUp(br)
	})
	if err != nil {
		tb.Fatalf("wire namespace: %v", err)
	}
	return w
}

// newXNode makes node number n (1 or 2): uplink 10.78.0.n/24 on the wire's
// bridge, router IP 10.78.n.1, pod CIDR 10.78.n.0/24, its own maps.
func newXNode(tb testing.TB, wire ns.NetNS, n byte) *xnode {
	tb.Helper()
	x := &xnode{
		testNode: newTestNodeWithRouter(tb, netip.AddrFrom4([4]byte{10, 78, n, 1})),
		name:     fmt.Sprintf("node%d", n),
		ip:       netip.AddrFrom4([4]byte{10, 78, 0, n}),
		podCIDR:  netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 78, n, 0}), 24),
	}
	// The agent's layout: the maps in <bpf-root>/cellium.
	x.root = tempBPFFS(tb)
	x.dir = filepath.Join(x.root, "cellium")
	if err := os.MkdirAll(x.dir, 0o700); err != nil {
		tb.Fatal(err)
	}
	m, err := maps.Open(x.dir)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { m.Close() })
	x.m = m
	x.events = newEventReader(tb, x.m)
	peer := fmt.Sprintf("x%d-%d", n, time.Now().UnixNano()%100000)
	err = wire.Do(func(ns.NetNS) error {
		veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: peer}, PeerName: "eth0",
			PeerNamespace: netlink.NsFd(int(x.ns.Fd()))}
		if err := netlink.LinkAdd(veth); err != nil {
			return fmt.Errorf("add uplink: %w", err)
		}
		br, err := netlink.LinkByName("br0")
		if err != nil {
			return err
		}
		l, err := netlink.LinkByName(peer)
		if err != nil {
			return err
		}
		if err := netlink.LinkSetMaster(l, br); err != nil {
			return err
		}
		return netlink.LinkSetUp(l)
	})
	if err != nil {
		tb.Fatalf("%s uplink: %v", x.name, err)
	}
	err = x.ns.Do(func(ns.NetNS) error {
		for _, name := range []string{"lo", "eth0"} {
			l, err := netlink.LinkByName(name)
			if err != nil {
				return err
			}
			if name == "eth0" {
				if err := netlink.AddrAdd(l, &netlink.Addr{IPNet: &net.IPNet{IP: x.ip.AsSlice(), Mask: net.CIDRMask(24, 32)}}); err != nil {
					return err
				}
			}
			if err := netlink.LinkSetUp(l); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		tb.Fatalf("%s eth0: %v", x.name, err)
	}
	// What the agent's ipcache holds of the node itself.
	for _, a := range []netip.Addr{x.ip, x.router} {
		if err := x.m.IPCache.Update(netip.PrefixFrom(a, 32), maps.IPCacheEntry{Identity: identity.ReservedIdentityHost}); err != nil {
			tb.Fatal(err)
		}
	}
	return x
}

// knowNode puts the other node's address into x's ipcache as remote-node.
func (x *xnode) knowNode(tb testing.TB, other *xnode) {
	tb.Helper()
	if err := x.m.IPCache.Update(netip.PrefixFrom(other.ip, 32), maps.IPCacheEntry{Identity: identity.ReservedIdentityRemoteNode}); err != nil {
		tb.Fatal(err)
	}
}

// knowRemotePod puts a pod of another node into x's ipcache: in tunnel
// mode with that node as tunnel endpoint (what datapath/mapsync writes
// from the CiliumEndpoint's HostIP).
func (x *xnode) knowRemotePod(tb testing.TB, pod *testPod, id identity.NumericIdentity, on *xnode, tunnel bool) {
	tb.Helper()
	e := maps.IPCacheEntry{Identity: id}
	if tunnel {
		e.TunnelEndpoint = on.ip
	}
	if err := x.m.IPCache.Update(netip.PrefixFrom(pod.ip, 32), e); err != nil {
		tb.Fatal(err)
	}
}

// localPod adds a pod with identity id and endpoint ID ep, its programs
// loaded against x's maps with pol as its policy, attached, and its
// cil_lxc_policy in cellium_policy_progs.
func (x *xnode) localPod(tb testing.TB, name string, ip netip.Addr, id identity.NumericIdentity, ep uint16, pol []policy.Entry) *testPod {
	tb.Helper()
	p := x.addPod(tb, name, ip)
	registerPod(tb, x.m, p, id, ep)
	pm := openPolicy(tb, x.dir, ep)
	if err := pm.BatchUpdate(pol); err != nil {
		tb.Fatal(err)
	}
	coll := loadEndpoint(tb, x.m, pm, endpointConfig{ID: ep, Identity: id, IfIndex: uint32(p.res.HostIfIndex), MAC: p.res.PodMAC, IPv4: p.ip,
		NodePort: x.nodePort})
	x.attach(tb, p, coll)
	if err := x.m.PolicyProgs.Set(ep, coll.Programs[bpf.LxcProgCilLxcPolicy]); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = x.m.PolicyProgs.Delete(ep) })
	return p
}

// addTunnel makes cilium_vxlan (external, port 8472, MTU 1450, NOARP) with
// the overlay programs attached, and routes the other nodes' pod CIDRs
// into it: what datapath/routing and the loader do in tunnel mode.
func (x *xnode) addTunnel(tb testing.TB, remote ...*xnode) {
	tb.Helper()
	spec, err := maps.LoadOverlaySpec()
	if err != nil {
		tb.Fatal(err)
	}
	mon := bpf.Monitor{}
	if x.overlayMonitor != nil {
		mon = *x.overlayMonitor
	}
	if err := mon.ApplyOverlay(spec, x.overlayMonitor != nil); err != nil {
		tb.Fatal(err)
	}
	coll, err := ebpf.NewCollectionWithOptions(spec, ebpf.CollectionOptions{MapReplacements: x.m.OverlayReplacements()})
	if err != nil {
		var ve *ebpf.VerifierError
		if errors.As(err, &ve) {
			tb.Fatalf("load overlay: %+v", ve)
		}
		tb.Fatalf("load overlay: %v", err)
	}
	tb.Cleanup(coll.Close)
	var links []ebpflink.Link
	err = x.ns.Do(func(ns.NetNS) error {
		vx := &netlink.Vxlan{LinkAttrs: netlink.LinkAttrs{Name: vxlanDevice, MTU: 1450}, FlowBased: true, Port: vxlanPort}
		if err := netlink.LinkAdd(vx); err != nil {
			return fmt.Errorf("add %s: %w", vxlanDevice, err)
		}
		l, err := netlink.LinkByName(vxlanDevice)
		if err != nil {
			return err
		}
		if err := netlink.LinkSetARPOff(l); err != nil {
			return err
		}
		if err := netlink.LinkSetUp(l); err != nil {
			return err
		}
		for _, a := range []struct {
			prog string
			at   ebpf.AttachType
		}{{bpf.OverlayProgCilFromOverlay, ebpf.AttachTCXIngress}, {bpf.OverlayProgCilToOverlay, ebpf.AttachTCXEgress}} {
			lk, err := ebpflink.AttachTCX(ebpflink.TCXOptions{Interface: l.Attrs().Index, Program: coll.Programs[a.prog], Attach: a.at})
			if err != nil {
				return fmt.Errorf("attach %s: %w", a.prog, err)
			}
			links = append(links, lk)
		}
		for _, r := range remote {
			dst := &net.IPNet{IP: r.podCIDR.Addr().AsSlice(), Mask: net.CIDRMask(24, 32)}
			if err := netlink.RouteAdd(&netlink.Route{Dst: dst, LinkIndex: l.Attrs().Index, Scope: netlink.SCOPE_LINK}); err != nil {
				return fmt.Errorf("route %s: %w", r.podCIDR, err)
			}
		}
		return nil
	})
	tb.Cleanup(func() {
		for _, lk := range links {
			lk.Close()
		}
	})
	if err != nil {
		tb.Fatalf("%s tunnel: %v", x.name, err)
	}
}

// addTunnelAgent is addTunnel done by the agent's own parts: the routing
// reconciler's operations make cilium_vxlan and the routes, the loader's
// Overlay attaches the programs with links pinned in the node's bpffs.
func (x *xnode) addTunnelAgent(tb testing.TB, remote ...*xnode) {
	tb.Helper()
	ctx := context.Background()
	n := routing.Netns{Path: x.ns.Path()}
	if err := (routing.DeviceOps{Netns: n}).Update(ctx, nil, &routes.Device{Name: routes.TunnelDevice, Kind: routes.KindVXLAN,
		Port: vxlanPort, MTU: 1500 - routes.TunnelOverhead}); err != nil {
		tb.Fatal(err)
	}
	for _, r := range remote {
		if err := (routing.RouteOps{Netns: n}).Update(ctx, nil, &routes.Route{Prefix: r.podCIDR, Device: routes.TunnelDevice}); err != nil {
			tb.Fatal(err)
		}
	}
	o := &loader.Overlay{Layout: loader.Layout{Root: x.root}, Netns: loader.Netns{Path: x.ns.Path()}, ViaStack: x.overlayViaStack}
	if err := o.Ensure(routes.TunnelDevice); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := o.Remove(); err != nil {
			tb.Error(err)
		}
	})
}

// addNativeRoutes routes the other nodes' pod CIDRs via their node IPs
// (native routing with auto-direct-node-routes).
func (x *xnode) addNativeRoutes(tb testing.TB, remote ...*xnode) {
	tb.Helper()
	err := x.ns.Do(func(ns.NetNS) error {
		for _, r := range remote {
			dst := &net.IPNet{IP: r.podCIDR.Addr().AsSlice(), Mask: net.CIDRMask(24, 32)}
			if err := netlink.RouteAdd(&netlink.Route{Dst: dst, Gw: r.ip.AsSlice()}); err != nil {
				return fmt.Errorf("route %s via %s: %w", r.podCIDR, r.ip, err)
			}
		}
		return nil
	})
	if err != nil {
		tb.Fatal(err)
	}
}

// waitEvent waits for an event of x matching match.
func (x *xnode) waitEvent(tb testing.TB, what string, match func(maps.Event) bool) maps.Event {
	tb.Helper()
	return x.events.waitFor(tb, what, &x.seen, match)
}

// Identities and endpoints of the two-node tests: on node 1 pod a
// (allowed by b) and pod c (not allowed); on node 2 pod b, serving TCP 80.
const (
	xidA, xidB, xidC identity.NumericIdentity = 31001, 31002, 31003
	xidUnknown       identity.NumericIdentity = 77777
	xepA, xepB, xepC uint16                   = 31, 32, 33
	xport                                     = 80
)

type twoNodes struct {
	wire    ns.NetNS
	n1, n2  *xnode
	a, b, c *testPod
}

// newTwoNodes builds the topology in tunnel or native mode with the maps
// filled as the agents of both nodes would fill them.
func newTwoNodes(t *testing.T, tunnel bool) *twoNodes {
	return newTwoNodesWith(t, tunnel, false)
}

// newTwoNodesWith is newTwoNodes; with agentParts the tunnel is made by
// the agent's routing operations and loader instead of by hand.
func newTwoNodesWith(t *testing.T, tunnel, agentParts bool) *twoNodes {
	return newTwoNodesMonitor(t, tunnel, agentParts, nil)
}

// newTwoNodesMonitor is newTwoNodesWith with the tunnel programs tracing
// at mon's aggregation (nil: no traces).
func newTwoNodesMonitor(t *testing.T, tunnel, agentParts bool, mon *bpf.Monitor) *twoNodes {
	return newTwoNodesOpts(t, twoNodesOpts{tunnel: tunnel, agentParts: agentParts, mon: mon})
}

// twoNodesOpts shape newTwoNodesOpts' topology.
type twoNodesOpts struct {
	tunnel, agentParts bool
	// mon: the tunnel programs trace at its aggregation (nil: no traces).
	mon *bpf.Monitor
	// viaStack: the tunnel programs hand packets for local endpoints to
	// the stack (with agentParts).
	viaStack bool
}

// newTwoNodesOpts builds the two-node topology as o says.
func newTwoNodesOpts(t *testing.T, o twoNodesOpts) *twoNodes {
	t.Helper()
	tunnel, agentParts, mon := o.tunnel, o.agentParts, o.mon
	blackholeRange(t, overlayRange)
	tn := &twoNodes{wire: newWire(t)}
	tn.n1, tn.n2 = newXNode(t, tn.wire, 1), newXNode(t, tn.wire, 2)
	tn.n1.overlayMonitor, tn.n2.overlayMonitor = mon, mon
	tn.n1.overlayViaStack, tn.n2.overlayViaStack = o.viaStack, o.viaStack
	tn.n1.knowNode(t, tn.n2)
	tn.n2.knowNode(t, tn.n1)
	tn.a = tn.n1.localPod(t, "xa", netip.MustParseAddr("10.78.1.10"), xidA, xepA, []policy.Entry{allowAllEgress, allowAllIngress})
	tn.c = tn.n1.localPod(t, "xc", netip.MustParseAddr("10.78.1.11"), xidC, xepC, []policy.Entry{allowAllEgress, allowAllIngress})
	tn.b = tn.n2.localPod(t, "xb", netip.MustParseAddr("10.78.2.10"), xidB, xepB, []policy.Entry{
		allowAllEgress,
		{Key: policy.NewKey(xidA, policy.Ingress, policy.ProtoTCP, xport, 16)},
		{Key: policy.NewKey(xidA, policy.Ingress, policy.ProtoICMP, 0, 0)},
	})
	tn.n1.knowRemotePod(t, tn.b, xidB, tn.n2, tunnel)
	tn.n2.knowRemotePod(t, tn.a, xidA, tn.n1, tunnel)
	tn.n2.knowRemotePod(t, tn.c, xidC, tn.n1, tunnel)
	for _, x := range []*xnode{tn.n1, tn.n2} {
		for _, id := range []identity.NumericIdentity{xidA, xidB, xidC} {
			if err := x.m.Identities.Add(id); err != nil {
				t.Fatal(err)
			}
		}
	}
	switch {
	case tunnel && agentParts:
		tn.n1.addTunnelAgent(t, tn.n2)
		tn.n2.addTunnelAgent(t, tn.n1)
	case tunnel:
		tn.n1.addTunnel(t, tn.n2)
		tn.n2.addTunnel(t, tn.n1)
	case agentParts:
		for _, c := range []struct{ x, o *xnode }{{tn.n1, tn.n2}, {tn.n2, tn.n1}} {
			r := &routes.Route{Prefix: c.o.podCIDR, Gateway: c.o.ip}
			if err := (routing.RouteOps{Netns: routing.Netns{Path: c.x.ns.Path()}}).Update(context.Background(), nil, r); err != nil {
				t.Fatal(err)
			}
		}
	default:
		tn.n1.addNativeRoutes(t, tn.n2)
		tn.n2.addNativeRoutes(t, tn.n1)
	}
	tn.b.serveEcho(t, xport)
	return tn
}

// checkCrossNode is what both modes must do: TCP and ICMP from a to b
// pass; TCP from c to b is dropped by b's ingress policy on node 2, seen
// in node 2's event ring with c's identity.
func (tn *twoNodes) checkCrossNode(t *testing.T) {
	bWeb := netip.AddrPortFrom(tn.b.ip, xport)
	t.Run("tcp a->b", func(t *testing.T) {
		if err := tn.a.tcpEcho(bWeb); err != nil {
			t.Errorf("tcp %s -> %s across nodes: %v", tn.a.ip, bWeb, err)
		}
	})
	t.Run("icmp a->b", func(t *testing.T) {
		if err := privileged.Ping(tn.a.ns, tn.b.ip); err != nil {
			t.Errorf("ping %s -> %s across nodes: %v", tn.a.ip, tn.b.ip, err)
		}
	})
	t.Run("policy deny c->b on the receiving node", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() {
			c, err := tn.c.dial(ctx, bWeb)
			if c != nil {
				c.Close()
			}
			done <- err
		}()
		ev := tn.n2.waitEvent(t, "policy drop", func(e maps.Event) bool {
			return e.Type == maps.EventDrop && e.Src == tn.c.ip && e.Dst == tn.b.ip && e.DstPort == xport
		})
		cancel()
		if err := <-done; err == nil {
			t.Errorf("connection c -> b succeeded, want it dropped")
		}
		if ev.Reason != maps.DropPolicy || ev.EndpointID != xepB || ev.SrcIdentity != xidC || ev.Dir != maps.DirIngress {
			t.Errorf("drop event %v: want reason %d at endpoint %d, source identity %d, ingress", ev, maps.DropPolicy, xepB, xidC)
		}
	})
}

// TestPrivilegedOverlayTunnel runs two nodes in tunnel mode: cilium_vxlan
// with cil_to_overlay and cil_from_overlay, each node its own maps. Pods
// talk across nodes (TCP, ICMP); the receiving node's policy drops what
// it does not allow, on the identity the VNI carries: a packet whose inner
// source is an allowed pod but whose VNI is another identity is denied,
// and with the allowed identity in the VNI the same packet is allowed.
// Tunnel packets from an address that is not a node (172), with an
// unknown VNI (171), or for a pod that is not on the receiving node (150)
// drop with their reasons, counted in the metrics map.
func TestPrivilegedOverlayTunnel(t *testing.T) {
	privileged.Require(t)
	tn := newTwoNodes(t, true)
	tn.checkCrossNode(t)

	// Crafted VXLAN packets to node 2's tunnel port: an inner TCP SYN.
	syn := func(src, dst netip.Addr) []byte { return innerSYN(src, dst, 40000, xport) }
	t.Run("the VNI is the identity the receiver's policy sees", func(t *testing.T) {
		sendVXLAN(t, tn.n1.ns, tn.n2.ip, uint32(xidC), syn(tn.a.ip, tn.b.ip))
		ev := tn.n2.waitEvent(t, "policy drop of the VNI's identity", func(e maps.Event) bool {
			return e.Type == maps.EventDrop && e.Src == tn.a.ip && e.Dst == tn.b.ip && e.SrcPort == 40000
		})
		if ev.Reason != maps.DropPolicy || ev.SrcIdentity != xidC || ev.EndpointID != xepB {
			t.Errorf("drop %v: want policy denied (133) at endpoint %d for the VNI's identity %d (the inner source %s is %d)", ev, xepB, xidC, tn.a.ip, xidA)
		}
		sendVXLAN(t, tn.n1.ns, tn.n2.ip, uint32(xidA), innerSYN(tn.a.ip, tn.b.ip, 40001, xport))
		ev = tn.n2.waitEvent(t, "allowed verdict", func(e maps.Event) bool {
			return e.Src == tn.a.ip && e.Dst == tn.b.ip && e.SrcPort == 40001
		})
		if ev.Type != maps.EventPolicyVerdict || ev.Verdict != maps.VerdictAllowed || ev.SrcIdentity != xidA {
			t.Errorf("event %v: want an allowed policy verdict for identity %d", ev, xidA)
		}
	})
	t.Run("unknown VNI", func(t *testing.T) {
		sendVXLAN(t, tn.n1.ns, tn.n2.ip, uint32(xidUnknown), innerSYN(tn.a.ip, tn.b.ip, 40002, xport))
		ev := tn.n2.waitEvent(t, "invalid identity drop", func(e maps.Event) bool {
			return e.Type == maps.EventDrop && e.Src == tn.a.ip && e.SrcPort == 40002
		})
		if ev.Reason != maps.DropInvalidIdentity || ev.SrcIdentity != xidUnknown {
			t.Errorf("drop %v: want %d (%s) with identity %d", ev, maps.DropInvalidIdentity, maps.DropReasonName(maps.DropInvalidIdentity), xidUnknown)
		}
	})
	t.Run("tunnel packet from an address that is not a node", func(t *testing.T) {
		sendVXLAN(t, tn.wire, tn.n2.ip, uint32(xidA), innerSYN(tn.a.ip, tn.b.ip, 40003, xport))
		ev := tn.n2.waitEvent(t, "unknown sender drop", func(e maps.Event) bool {
			return e.Type == maps.EventDrop && e.Src == tn.a.ip && e.SrcPort == 40003
		})
		if ev.Reason != maps.DropUnknownSender {
			t.Errorf("drop %v: want %d (%s)", ev, maps.DropUnknownSender, maps.DropReasonName(maps.DropUnknownSender))
		}
	})
	t.Run("tunnel packet for a pod not on this node", func(t *testing.T) {
		// c's address (node 1's pod) sent to node 2.
		sendVXLAN(t, tn.n1.ns, tn.n2.ip, uint32(xidA), innerSYN(tn.a.ip, tn.c.ip, 40004, xport))
		ev := tn.n2.waitEvent(t, "unknown target drop", func(e maps.Event) bool {
			return e.Type == maps.EventDrop && e.Src == tn.a.ip && e.SrcPort == 40004
		})
		if ev.Reason != maps.DropUnknownTarget || ev.Dst != tn.c.ip {
			t.Errorf("drop %v: want %d (%s)", ev, maps.DropUnknownTarget, maps.DropReasonName(maps.DropUnknownTarget))
		}
	})
	t.Run("drops are counted", func(t *testing.T) {
		for _, r := range []uint8{maps.DropInvalidIdentity, maps.DropUnknownSender, maps.DropUnknownTarget} {
			v, err := tn.n2.m.Metrics.Get(maps.MetricsKey{Reason: r, Dir: maps.DirIngress})
			if err != nil {
				t.Fatal(err)
			}
			if v.Packets == 0 {
				t.Errorf("metrics: no ingress packets counted for reason %d (%s)", r, maps.DropReasonName(r))
			}
		}
	})
	t.Run("through the stack when the endpoint's slot is empty", func(t *testing.T) {
		// No tail call: the decapsulated packet takes node 2's stack
		// (which must take the frame, sent to node 1's tunnel MAC, as its
		// own) and b's cil_to_container.
		if err := tn.n2.m.PolicyProgs.Delete(xepB); err != nil {
			t.Fatal(err)
		}
		if err := tn.a.tcpEcho(netip.AddrPortFrom(tn.b.ip, xport)); err != nil {
			t.Errorf("tcp a -> b through node 2's stack: %v", err)
		}
	})
	t.Run("no tunnel endpoint", func(t *testing.T) {
		// An address of node 2's pod CIDR that node 1's ipcache does not
		// know: the route sends it into the tunnel, which has nowhere
		// to send it.
		ghost := netip.MustParseAddr("10.78.2.99")
		if err := tn.a.ns.Do(func(ns.NetNS) error {
			c, err := net.Dial("udp4", netip.AddrPortFrom(ghost, 9).String())
			if err != nil {
				return err
			}
			defer c.Close()
			_, err = c.Write([]byte("ghost"))
			return err
		}); err != nil {
			t.Fatal(err)
		}
		ev := tn.n1.waitEvent(t, "no tunnel endpoint drop", func(e maps.Event) bool {
			return e.Type == maps.EventDrop && e.Dst == ghost
		})
		if ev.Reason != maps.DropNoTunnelEndpoint || ev.SrcIdentity != xidA || ev.Dir != maps.DirEgress {
			t.Errorf("drop %v: want %d (%s), egress, source identity %d", ev, maps.DropNoTunnelEndpoint, maps.DropReasonName(maps.DropNoTunnelEndpoint), xidA)
		}
	})
}

// TestPrivilegedOverlayTunnelAgentParts: the same two nodes with the
// tunnel made as the agent makes it (datapath/routing's device and route
// operations, datapath/loader's Overlay with pinned links): pods talk
// across nodes and the receiving node's policy still drops what it does
// not allow.
func TestPrivilegedOverlayTunnelAgentParts(t *testing.T) {
	privileged.Require(t)
	tn := newTwoNodesWith(t, true, true)
	tn.checkCrossNode(t)
}

// TestPrivilegedOverlayNativeAgentParts: native routing with the direct
// routes made by datapath/routing's route operations (via the other
// node's IP).
func TestPrivilegedOverlayNativeAgentParts(t *testing.T) {
	privileged.Require(t)
	tn := newTwoNodesWith(t, false, true)
	tn.checkCrossNode(t)
}

// TestPrivilegedOverlayNative runs the same two nodes with native routing:
// no tunnel device, each node routes the other's pod CIDR via its node IP,
// and the receiving pod's cil_to_container takes the source identity from
// the ipcache by source address.
func TestPrivilegedOverlayNative(t *testing.T) {
	privileged.Require(t)
	tn := newTwoNodes(t, false)
	tn.checkCrossNode(t)
}

// innerSYN is an Ethernet frame holding an IPv4 TCP SYN (IP checksum set,
// TCP checksum not: the programs decide before any checksum is checked).
func innerSYN(src, dst netip.Addr, sport, dport uint16) []byte {
	b := packet(src, dst, 6, sport, dport, 0x02)
	ip := b[14:34]
	ip[8] = 64
	binary.BigEndian.PutUint16(ip[10:], 0)
	binary.BigEndian.PutUint16(ip[10:], ipChecksum(ip))
	return b
}

func ipChecksum(h []byte) uint16 {
	var sum uint32
	for i := 0; i+1 < len(h); i += 2 {
		sum += uint32(binary.BigEndian.Uint16(h[i:]))
	}
	for sum > 0xffff {
		sum = sum&0xffff + sum>>16
	}
	return ^uint16(sum)
}

// sendVXLAN sends frame in a VXLAN header with vni to dst's tunnel port
// from a UDP socket inside from (whose address on the wire is the outer
// source).
func sendVXLAN(tb testing.TB, from ns.NetNS, dst netip.Addr, vni uint32, frame []byte) {
	tb.Helper()
	msg := make([]byte, 8, 8+len(frame))
	msg[0] = 0x08 // the VNI is valid
	msg[4], msg[5], msg[6] = byte(vni>>16), byte(vni>>8), byte(vni)
	msg = append(msg, frame...)
	err := from.Do(func(ns.NetNS) error {
		c, err := net.DialUDP("udp4", nil, net.UDPAddrFromAddrPort(netip.AddrPortFrom(dst, vxlanPort)))
		if err != nil {
			return err
		}
		defer c.Close()
		_, err = c.Write(msg)
		return err
	})
	if err != nil {
		tb.Fatalf("send VXLAN packet to %s: %v", dst, err)
	}
}

// TestPrivilegedOverlayTraces: the tunnel device's programs trace with the
// packet's TCP flags and ICMP type. At aggregation none, a TCP connection
// from a (node 1) to b (node 2) shows its SYN at to-overlay on node 1 and
// at from-overlay on node 2, an echo request its ICMP type 8 at both;
// nothing there claims to know the reply direction (no conntrack). At
// medium, from-overlay is never traced and to-overlay only for TCP
// packets with a report flag (SYN, FIN, RST), not for the data and ACKs
// between them.
func TestPrivilegedOverlayTraces(t *testing.T) {
	privileged.Require(t)
	bWeb := netip.AddrPortFrom(netip.MustParseAddr("10.78.2.10"), xport)
	overlayTraces := func(evs []maps.Event) (to, from []maps.Event) {
		for _, e := range evs {
			if e.Type != maps.EventTrace {
				continue
			}
			switch e.Reason {
			case maps.TraceToOverlay:
				to = append(to, e)
			case maps.TraceFromOverlay:
				from = append(from, e)
			}
		}
		return to, from
	}
	settle := func(x *xnode) []maps.Event {
		var out []maps.Event
		for {
			time.Sleep(200 * time.Millisecond)
			evs := x.events.drain(t)
			if len(evs) == 0 {
				return out
			}
			out = append(out, evs...)
		}
	}
	t.Run("none", func(t *testing.T) {
		tn := newTwoNodesMonitor(t, true, false, &bpf.Monitor{Aggregation: bpf.AggregationNone})
		if err := tn.a.tcpEcho(bWeb); err != nil {
			t.Fatal(err)
		}
		to, _ := overlayTraces(settle(tn.n1))
		_, from := overlayTraces(settle(tn.n2))
		isSYN := func(e maps.Event) bool {
			return e.Proto == 6 && e.Dst == tn.b.ip && e.TCPFlags == bpf.TCPFlagSYN && !e.ReplyKnown
		}
		if _, ok := findEvent(to, isSYN); !ok {
			t.Errorf("no to-overlay trace of the SYN on node 1:\n%s", eventList(to))
		}
		if _, ok := findEvent(from, isSYN); !ok {
			t.Errorf("no from-overlay trace of the SYN on node 2:\n%s", eventList(from))
		}
		if err := privileged.Ping(tn.a.ns, tn.b.ip); err != nil {
			t.Fatal(err)
		}
		to, _ = overlayTraces(settle(tn.n1))
		if _, ok := findEvent(to, func(e maps.Event) bool { return e.Proto == 1 && e.ICMPType == 8 && e.ICMPCode == 0 }); !ok {
			t.Errorf("no to-overlay trace of the echo request with ICMP type 8:\n%s", eventList(to))
		}
	})
	// medium also with the chart's --monitor-aggregation-flags=all:
	// without conntrack, ACK and PSH are not news here (else every packet
	// of Hubble's own stream to the relay would be traced, and feed it).
	for name, mon := range map[string]*bpf.Monitor{
		"medium":           {Aggregation: bpf.AggregationMedium},
		"medium flags all": {Aggregation: bpf.AggregationMedium, ReportFlags: 0xff},
	} {
		t.Run(name, func(t *testing.T) {
			tn := newTwoNodesMonitor(t, true, false, mon)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			c, err := tn.a.dial(ctx, bWeb)
			if err != nil {
				t.Fatal(err)
			}
			for i := range 10 {
				if err := roundTrip(c, fmt.Sprintf("message %d", i)); err != nil {
					c.Close()
					t.Fatal(err)
				}
			}
			c.Close()
			to, from := overlayTraces(settle(tn.n1))
			to2, from2 := overlayTraces(settle(tn.n2))
			to, from = append(to, to2...), append(from, from2...)
			if len(from) != 0 {
				t.Errorf("from-overlay traces at medium:\n%s", eventList(from))
			}
			syn := 0
			for _, e := range to {
				if e.TCPFlags&bpf.DefaultReportFlags == 0 {
					t.Errorf("to-overlay trace of a packet without SYN, FIN or RST at medium: %v", e)
				}
				if e.TCPFlags&bpf.TCPFlagSYN != 0 {
					syn++
				}
			}
			// The SYN from a, the SYN-ACK from b.
			if syn < 2 {
				t.Errorf("%d to-overlay traces with SYN, want the SYN and the SYN-ACK:\n%s", syn, eventList(to))
			}
			t.Logf("%s: %d to-overlay traces for a connection of 10 round trips", name, len(to))
		})
	}
}

// With the socket load balancer off, kube-proxy translates a pod's
// connection to a ClusterIP in its node's stack (DNAT, here one nftables
// rule as kube-proxy's nftables mode writes); the backend on the other node
// answers through the tunnel, and only the stack can reverse the DNAT, so
// the tunnel device hands packets for local endpoints to the stack
// (DELIVER_VIA_STACK, the agent's --bpf-lb-sock=false). Without it the
// reply reaches the pod from the backend's own address and the connection
// fails: the second case shows the test exercises that path.
func TestPrivilegedOverlayKubeProxyClusterIP(t *testing.T) {
	privileged.Require(t)
	for _, viaStack := range []bool{true, false} {
		t.Run(fmt.Sprintf("deliver via stack %t", viaStack), func(t *testing.T) {
			tn := newTwoNodesOpts(t, twoNodesOpts{tunnel: true, agentParts: true, viaStack: viaStack})
			// In the blackholed test range, on no device: only the DNAT
			// makes it reachable.
			vip := netip.AddrPortFrom(netip.MustParseAddr("10.78.200.1"), 8080)
			rules := fmt.Sprintf("table ip kptest { chain pre { type nat hook prerouting priority dstnat; ip daddr %s tcp dport %d dnat to %s:%d; }; }\n",
				vip.Addr(), vip.Port(), tn.b.ip, xport)
			cmd := exec.Command("nsenter", "--net="+tn.n1.ns.Path(), "nft", "-f", "-")
			cmd.Stdin = strings.NewReader(rules)
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("nft in %s: %v: %s", tn.n1.name, err, out)
			}
			err := tn.a.tcpEcho(vip)
			switch {
			case viaStack && err != nil:
				t.Errorf("a -> %s (DNAT to %s on the other node) with DELIVER_VIA_STACK: %v", vip, tn.b.ip, err)
			case !viaStack && err == nil:
				t.Errorf("a -> %s worked without DELIVER_VIA_STACK: the reply did not need the stack", vip)
			}
			if viaStack {
				// Through the stack, the receiving pod's policy still
				// applies (cil_to_container): c -> b is dropped.
				tn.checkCrossNode(t)
			}
		})
	}
}
