package benchdatapath

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"time"

	"github.com/cilium/ebpf"
	ebpflink "github.com/cilium/ebpf/link"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/cellium/cellium/datapath/bpf"
	"github.com/cellium/cellium/datapath/link"
	"github.com/cellium/cellium/datapath/maps"
	"github.com/cellium/cellium/statedb/identity"
	"github.com/cellium/cellium/statedb/policy"
)

// The cross-node bench: two node namespaces whose uplinks (eth0, veths)
// sit on a bridge in a third ("wire") namespace, one pod on each, and the
// same pods connected four ways, measured side by side in one run:
//
//	native-bare     routes via the other node's IP, no programs
//	native-cellium  the same routes, cellium's programs on both pods
//	tunnel-kernel   the kernel's own VXLAN device (VNI 42, static FDB)
//	tunnel-cellium  cilium_vxlan (external) with cil_to_overlay and
//	                cil_from_overlay, cellium's programs on both pods
//
// Pods have MTU 1450 in every variant (the tunnel's), so the variants
// differ only in the path. Everything is inside crossRange, blackholed in
// the root namespace while the bench runs.
var (
	crossRange = netip.MustParsePrefix("10.95.0.0/16")
)

// CrossNodeResult holds the cross-node figures, per variant.
type CrossNodeResult struct {
	Duration time.Duration
	Rounds   int
	Variants []Variant
}

type xnode struct {
	n       byte
	ns      ns.NetNS
	host    link.Host
	ip      netip.Addr
	router  netip.Addr
	podCIDR netip.Prefix
	maps    *maps.Maps
	pod     *pod
	overlay *ebpf.Collection
	links   []ebpflink.Link
}

type crossTopology struct {
	cleanups
	wire   ns.NetNS
	n1, n2 *xnode
}

// RunCrossNode builds the two-node topology, measures every variant
// cfg.Rounds times (cfg.Duration each, interleaved), prints the rounds and
// the aims to w and removes everything.
func RunCrossNode(ctx context.Context, cfg Config, w io.Writer) (res CrossNodeResult, err error) {
	if cfg.Duration < time.Second {
		return res, errors.New("duration must be at least 1s")
	}
	for _, bin := range []string{"iperf3", "sockperf", "nsenter", "ss"} {
		if err := lookPath(bin); err != nil {
			return res, err
		}
	}
	res.Duration, res.Rounds = cfg.Duration, cfg.Rounds
	tmp, err := os.MkdirTemp("", "cellium-benchxn-")
	if err != nil {
		return res, err
	}
	defer os.RemoveAll(tmp)
	t := &crossTopology{}
	defer func() {
		if cerr := t.run(); cerr != nil {
			err = errors.Join(err, fmt.Errorf("clean up: %w", cerr))
		}
	}()
	if err := t.build(ctx, tmp); err != nil {
		return res, err
	}
	tp := &topology{a: t.n1.pod, b: t.n2.pod, clientCPU: -1, serverCPU: -1}
	names := []string{"native-bare", "native-cellium", "tunnel-kernel", "tunnel-cellium"}
	res.Variants = make([]Variant, len(names))
	for i, n := range names {
		res.Variants[i].Name = n
	}
	fmt.Fprintf(w, "cross-node: pod %s on node %s -> pod %s on node %s, MTU 1450\n", t.n1.pod.ip, t.n1.ip, t.n2.pod.ip, t.n2.ip)
	for round := range cfg.Rounds {
		order := []int{0, 1, 2, 3}
		if round%2 == 1 {
			order = []int{3, 2, 1, 0}
		}
		for _, i := range order {
			if err := t.setVariant(names[i]); err != nil {
				return res, fmt.Errorf("variant %s: %w", names[i], err)
			}
			bps, err := tp.iperf3(ctx, cfg.Duration)
			if err != nil {
				return res, fmt.Errorf("round %d %s: %w", round+1, names[i], err)
			}
			rr, err := tp.sockperf(ctx, cfg.Duration)
			if err != nil {
				return res, fmt.Errorf("round %d %s: %w", round+1, names[i], err)
			}
			WriteRound(w, round+1, names[i], bps, rr, 0)
			res.Variants[i].Bps = append(res.Variants[i].Bps, bps)
			res.Variants[i].RR = append(res.Variants[i].RR, rr)
		}
	}
	if err := t.setVariant(""); err != nil {
		return res, err
	}
	res.Write(w)
	return res, nil
}

// CrossNodeAims are the cross-node aims: cellium's TCP throughput at least
// 0.95 of the bare path of the same mode, its request/response rate at
// least 1.0 of it.
func (r CrossNodeResult) Aims() []Aim {
	v := map[string]Variant{}
	for _, x := range r.Variants {
		v[x.Name] = x
	}
	var out []Aim
	aim := func(what string, got, want float64) Aim {
		return Aim{What: what, Value: fmt.Sprintf("%.3f", got), Want: fmt.Sprintf(">= %.2f", want), Met: got >= want}
	}
	for _, m := range []struct{ mode, bare string }{{"native", "native-bare"}, {"tunnel", "tunnel-kernel"}} {
		c, b := v[m.mode+"-cellium"], v[m.bare]
		out = append(out,
			aim(fmt.Sprintf("%s TCP throughput cellium/%s", m.mode, m.bare), medianRatio(c.Bps, b.Bps), 0.95),
			aim(fmt.Sprintf("%s request/response cellium/%s", m.mode, m.bare), medianRatio(c.RR, b.RR), 1.0),
		)
	}
	return out
}

// Write prints the medians and the aims with PASS/MISS.
func (r CrossNodeResult) Write(w io.Writer) {
	fmt.Fprintf(w, "\ncross-node medians over %d rounds of %s:\n", r.Rounds, r.Duration)
	for _, v := range r.Variants {
		fmt.Fprintf(w, "  %-15s %8.2f Gbit/s  %9.0f req/s\n", v.Name, median(v.Bps)/1e9, median(v.RR))
	}
	fmt.Fprintf(w, "\n== cross-node aims ==\n")
	for _, a := range r.Aims() {
		verdict := "MISS"
		if a.Met {
			verdict = "PASS"
		}
		fmt.Fprintf(w, "  %-4s %-52s %8s  (aim %s)\n", verdict, a.What, a.Value, a.Want)
	}
}

func (t *crossTopology) build(ctx context.Context, tmp string) error {
	// Nothing of the range may leave the machine.
	_, dst, _ := net.ParseCIDR(crossRange.String())
	bh := &netlink.Route{Dst: dst, Type: unix.RTN_BLACKHOLE}
	if err := netlink.RouteAdd(bh); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("blackhole %s in the root namespace: %w", crossRange, err)
	}
	t.add(func() error { _ = netlink.RouteDel(bh); return nil })
	var err error
	if t.wire, err = newNetns(&t.cleanups); err != nil {
		return err
	}
	err = t.wire.Do(func(ns.NetNS) error {
		br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "br0"}}
		if err := netlink.LinkAdd(br); err != nil {
			return err
		}
		return netlink.LinkSetUp(br)
	})
	if err != nil {
		return fmt.Errorf("wire namespace: %w", err)
	}
	if t.n1, err = t.addNode(ctx, tmp, 1, 1001); err != nil {
		return err
	}
	if t.n2, err = t.addNode(ctx, tmp, 2, 1002); err != nil {
		return err
	}
	for _, c := range []struct{ x, o *xnode }{{t.n1, t.n2}, {t.n2, t.n1}} {
		if err := c.x.know(c.o); err != nil {
			return err
		}
		if err := c.x.devices(c.o); err != nil {
			return fmt.Errorf("node %d devices: %w", c.x.n, err)
		}
	}
	return nil
}

// addNode makes node n: uplink 10.95.0.n/24, router 10.95.n.1, pod
// 10.95.n.10 with identity id, its own bpffs and maps.
func (t *crossTopology) addNode(ctx context.Context, tmp string, n byte, id identity.NumericIdentity) (*xnode, error) {
	x := &xnode{n: n, ip: netip.AddrFrom4([4]byte{10, 95, 0, n}), router: netip.AddrFrom4([4]byte{10, 95, n, 1}),
		podCIDR: netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 95, n, 0}), 24)}
	var err error
	if x.ns, err = newNetns(&t.cleanups); err != nil {
		return nil, err
	}
	peer := fmt.Sprintf("xn%d", n)
	err = t.wire.Do(func(ns.NetNS) error {
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: peer}, PeerName: "eth0",
			PeerNamespace: netlink.NsFd(int(x.ns.Fd()))}); err != nil {
			return err
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
		return nil, fmt.Errorf("node %d uplink: %w", n, err)
	}
	err = x.ns.Do(func(ns.NetNS) error {
		for k, v := range map[string]string{"ipv4/ip_forward": "1", "ipv4/conf/all/rp_filter": "0", "ipv4/conf/default/rp_filter": "0"} {
			if err := os.WriteFile("/proc/sys/net/"+k, []byte(v+"\n"), 0); err != nil {
				return err
			}
		}
		_, dst, _ := net.ParseCIDR(crossRange.String())
		if err := netlink.RouteAdd(&netlink.Route{Dst: dst, Type: unix.RTN_BLACKHOLE}); err != nil {
			return err
		}
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
		router := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "cellium_host"}, PeerName: "cellium_net"}
		if err := netlink.LinkAdd(router); err != nil {
			return err
		}
		if err := netlink.AddrAdd(router, &netlink.Addr{IPNet: &net.IPNet{IP: x.router.AsSlice(), Mask: net.CIDRMask(32, 32)}}); err != nil {
			return err
		}
		for _, name := range []string{"cellium_host", "cellium_net"} {
			l, err := netlink.LinkByName(name)
			if err == nil {
				err = netlink.LinkSetUp(l)
			}
			if err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("node %d namespace: %w", n, err)
	}
	x.host = link.Host{NetnsPath: x.ns.Path()}
	dir := filepath.Join(tmp, fmt.Sprintf("bpffs%d", n))
	if err := maps.EnsureBPFFS(dir); err != nil {
		return nil, err
	}
	t.add(func() error { return unix.Unmount(dir, 0) })
	if x.maps, err = maps.Open(dir); err != nil {
		return nil, err
	}
	t.add(x.maps.Close)
	for _, a := range []netip.Addr{x.ip, x.router} {
		if err := x.maps.IPCache.Update(netip.PrefixFrom(a, 32), maps.IPCacheEntry{Identity: identity.ReservedIdentityHost}); err != nil {
			return nil, err
		}
	}

	// The pod, as the agent attaches it, with MTU 1450.
	ip := netip.AddrFrom4([4]byte{10, 95, n, 10})
	pn, err := newNetns(&t.cleanups)
	if err != nil {
		return nil, err
	}
	res, err := x.host.SetupEndpoint(ctx, link.Spec{
		ContainerID: fmt.Sprintf("cellium-benchxn-%d-%d", os.Getpid(), n), NetnsPath: pn.Path(),
		IPv4: ip.AsSlice(), Gateway: x.router.AsSlice(), MTU: 1450,
	})
	if err != nil {
		return nil, fmt.Errorf("pod on node %d: %w", n, err)
	}
	t.add(func() error { return x.host.RemoveEndpoint(context.Background(), res.HostIfName, pn.Path()) })
	if err := x.host.EnsurePodRoute(ctx, res.HostIfName, ip.AsSlice()); err != nil {
		return nil, err
	}
	p := &pod{name: fmt.Sprintf("n%d", n), ns: pn, ip: ip, res: res, id: id, epID: uint16(n)}
	if err := x.maps.IPCache.Update(netip.PrefixFrom(ip, 32), maps.IPCacheEntry{Identity: id}); err != nil {
		return nil, err
	}
	if err := x.maps.Endpoints.Update(ip, maps.EndpointInfo{IfIndex: uint32(res.HostIfIndex), ID: p.epID,
		MAC: res.PodMAC, NodeMAC: res.HostMAC, Identity: id}); err != nil {
		return nil, err
	}
	if p.policy, err = maps.OpenPolicyMap(dir, p.epID); err != nil {
		return nil, err
	}
	t.add(p.policy.Close)
	x.pod = p
	spec, err := bpf.LoadLxc()
	if err != nil {
		return nil, err
	}
	consts := bpf.EndpointConstants{EndpointID: p.epID, Identity: uint32(p.id), IfIndex: uint32(res.HostIfIndex), MAC: res.PodMAC, IPv4: ip}
	if err := consts.Apply(spec); err != nil {
		return nil, err
	}
	if p.coll, err = ebpf.NewCollectionWithOptions(spec, ebpf.CollectionOptions{MapReplacements: x.maps.Replacements(p.policy)}); err != nil {
		return nil, fmt.Errorf("load programs of the pod on node %d: %w", n, err)
	}
	t.add(func() error { p.coll.Close(); return nil })
	ospec, err := maps.LoadOverlaySpec()
	if err != nil {
		return nil, err
	}
	if x.overlay, err = ebpf.NewCollectionWithOptions(ospec, ebpf.CollectionOptions{MapReplacements: x.maps.OverlayReplacements()}); err != nil {
		return nil, fmt.Errorf("load overlay programs: %w", err)
	}
	t.add(func() error { x.overlay.Close(); return nil })
	return x, nil
}

// know fills x's maps with what its agent would know of o: o's address
// (remote-node), o's pod (with o as tunnel endpoint), its identity; and
// the policies: x's pod allows o's pod both ways on the bench's ports.
func (x *xnode) know(o *xnode) error {
	if err := x.maps.IPCache.Update(netip.PrefixFrom(o.ip, 32), maps.IPCacheEntry{Identity: identity.ReservedIdentityRemoteNode}); err != nil {
		return err
	}
	if err := x.maps.IPCache.Update(netip.PrefixFrom(o.pod.ip, 32), maps.IPCacheEntry{Identity: o.pod.id, TunnelEndpoint: o.ip}); err != nil {
		return err
	}
	if err := x.maps.Identities.Add(o.pod.id); err != nil {
		return err
	}
	var es []policy.Entry
	for _, d := range []policy.Direction{policy.Ingress, policy.Egress} {
		es = append(es,
			policy.Entry{Key: policy.NewKey(o.pod.id, d, policy.ProtoTCP, iperfPort, 16)},
			policy.Entry{Key: policy.NewKey(o.pod.id, d, policy.ProtoTCP, sockperfPort, 16)})
	}
	return x.pod.policy.BatchUpdate(es)
}

// vxkMAC is node n's MAC on vxk.
func vxkMAC(n byte) net.HardwareAddr { return net.HardwareAddr{2, 0x95, 0, 0, 0, n} }

// devices makes the two tunnel devices of x (down until a variant needs
// one): vxk, the kernel's VXLAN with VNI 42 on port 4789 and a static FDB
// entry to o (the other node's pod CIDR is routed via its router IP,
// onlink, whose neighbour entry is o's vxk MAC: the kernel drops a VXLAN
// frame whose inner source is its own MAC, so the MACs differ);
// cilium_vxlan, external on port 8472, ARP off.
func (x *xnode) devices(o *xnode) error {
	return x.ns.Do(func(ns.NetNS) error {
		mac := vxkMAC(x.n)
		vxk := &netlink.Vxlan{LinkAttrs: netlink.LinkAttrs{Name: "vxk", MTU: 1450, HardwareAddr: mac}, VxlanId: 42, Port: 4789,
			SrcAddr: x.ip.AsSlice(), Learning: false}
		if err := netlink.LinkAdd(vxk); err != nil {
			return fmt.Errorf("add vxk: %w", err)
		}
		l, err := netlink.LinkByName("vxk")
		if err != nil {
			return err
		}
		if err := netlink.NeighAppend(&netlink.Neigh{LinkIndex: l.Attrs().Index, Family: unix.AF_BRIDGE,
			State: netlink.NUD_PERMANENT, Flags: netlink.NTF_SELF, IP: o.ip.AsSlice(), HardwareAddr: make(net.HardwareAddr, 6)}); err != nil {
			return fmt.Errorf("fdb entry: %w", err)
		}
		cv := &netlink.Vxlan{LinkAttrs: netlink.LinkAttrs{Name: "cilium_vxlan", MTU: 1450}, FlowBased: true, Port: 8472}
		if err := netlink.LinkAdd(cv); err != nil {
			return fmt.Errorf("add cilium_vxlan: %w", err)
		}
		if l, err = netlink.LinkByName("cilium_vxlan"); err != nil {
			return err
		}
		return netlink.LinkSetARPOff(l)
	})
}

// setVariant detaches everything, then routes and attaches what variant
// name needs ("" leaves everything detached).
func (t *crossTopology) setVariant(name string) error {
	for _, c := range []struct{ x, o *xnode }{{t.n1, t.n2}, {t.n2, t.n1}} {
		x, o := c.x, c.o
		for _, l := range x.links {
			l.Close()
		}
		x.links = nil
		_ = x.maps.PolicyProgs.Delete(x.pod.epID)
		err := x.ns.Do(func(ns.NetNS) error {
			dst := &net.IPNet{IP: o.podCIDR.Addr().AsSlice(), Mask: net.CIDRMask(24, 32)}
			_ = netlink.RouteDel(&netlink.Route{Dst: dst})
			for _, dev := range []string{"vxk", "cilium_vxlan"} {
				if l, err := netlink.LinkByName(dev); err == nil {
					_ = netlink.LinkSetDown(l)
				}
			}
			var route *netlink.Route
			switch name {
			case "":
				return nil
			case "native-bare", "native-cellium":
				route = &netlink.Route{Dst: dst, Gw: o.ip.AsSlice()}
			case "tunnel-kernel", "tunnel-cellium":
				dev := "vxk"
				if name == "tunnel-cellium" {
					dev = "cilium_vxlan"
				}
				l, err := netlink.LinkByName(dev)
				if err != nil {
					return err
				}
				if err := netlink.LinkSetUp(l); err != nil {
					return err
				}
				route = &netlink.Route{Dst: dst, LinkIndex: l.Attrs().Index, Scope: netlink.SCOPE_LINK}
				if name == "tunnel-kernel" {
					route = &netlink.Route{Dst: dst, LinkIndex: l.Attrs().Index, Gw: o.router.AsSlice(), Flags: int(netlink.FLAG_ONLINK)}
					// Bringing the device down flushed the entry.
					if err := netlink.NeighSet(&netlink.Neigh{LinkIndex: l.Attrs().Index, Family: unix.AF_INET,
						State: netlink.NUD_PERMANENT, IP: o.router.AsSlice(), HardwareAddr: vxkMAC(o.n)}); err != nil {
						return fmt.Errorf("neighbour %s: %w", o.router, err)
					}
				}
				if name == "tunnel-cellium" {
					for _, h := range []struct {
						prog string
						at   ebpf.AttachType
					}{{bpf.OverlayProgCilFromOverlay, ebpf.AttachTCXIngress}, {bpf.OverlayProgCilToOverlay, ebpf.AttachTCXEgress}} {
						lk, err := ebpflink.AttachTCX(ebpflink.TCXOptions{Interface: l.Attrs().Index, Program: x.overlay.Programs[h.prog], Attach: h.at})
						if err != nil {
							return fmt.Errorf("attach %s: %w", h.prog, err)
						}
						x.links = append(x.links, lk)
					}
				}
			}
			if err := netlink.RouteAdd(route); err != nil {
				return fmt.Errorf("route %s: %w", o.podCIDR, err)
			}
			if name == "native-cellium" || name == "tunnel-cellium" {
				for _, h := range []struct {
					prog string
					at   ebpf.AttachType
				}{{bpf.LxcProgCilFromContainer, ebpf.AttachTCXIngress}, {bpf.LxcProgCilToContainer, ebpf.AttachTCXEgress}} {
					lk, err := ebpflink.AttachTCX(ebpflink.TCXOptions{Interface: x.pod.res.HostIfIndex, Program: x.pod.coll.Programs[h.prog], Attach: h.at})
					if err != nil {
						return fmt.Errorf("attach %s: %w", h.prog, err)
					}
					x.links = append(x.links, lk)
				}
				if err := x.maps.PolicyProgs.Set(x.pod.epID, x.pod.coll.Programs[maps.PolicyProgram]); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return err
		}
	}
	return nil
}
