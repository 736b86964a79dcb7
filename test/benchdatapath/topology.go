package benchdatapath

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"

	"github.com/cilium/ebpf"
	ebpflink "github.com/cilium/ebpf/link"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/containernetworking/plugins/pkg/testutils"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/cellium/cellium/datapath/bpf"
	"github.com/cellium/cellium/datapath/bpfconfig"
	"github.com/cellium/cellium/datapath/link"
	"github.com/cellium/cellium/datapath/maps"
	"github.com/cellium/cellium/statedb/identity"
	"github.com/cellium/cellium/statedb/policy"
)

// The bench's addresses. They exist only inside the namespaces it makes;
// the node namespace blackholes the whole range before any pod exists, so
// nothing addressed to the range can leave it.
var (
	benchRange = netip.MustParsePrefix("10.97.0.0/16")
	routerIP   = netip.MustParseAddr("10.97.0.1")
	podAIP     = netip.MustParseAddr("10.97.0.10")
	podBIP     = netip.MustParseAddr("10.97.0.11")
)

// cleanups runs its functions in reverse order.
type cleanups []func() error

func (c *cleanups) add(f func() error) { *c = append(*c, f) }

func (c *cleanups) run() error {
	var errs []error
	for i := len(*c) - 1; i >= 0; i-- {
		errs = append(errs, (*c)[i]())
	}
	*c = nil
	return errors.Join(errs...)
}

// topology is a node namespace (forwarding on, the router IP on
// cellium_host) with two pods attached exactly as the agent attaches
// them (datapath/link), and the global maps in a private bpffs.
type topology struct {
	cleanups
	node ns.NetNS
	host link.Host
	a, b *pod
	maps *maps.Maps
	dir  string // the bpffs (the agent's --bpf-root)
	// pinDir holds the maps (dir/cellium, as the agent pins them).
	pinDir string
	// clientCPU and serverCPU pin the load generators (taskset); -1
	// leaves them to the scheduler.
	clientCPU, serverCPU int
}

// pod is one endpoint: its namespace, veth and, when attached, programs.
type pod struct {
	name   string
	ns     ns.NetNS
	ip     netip.Addr
	res    link.Result
	id     identity.NumericIdentity
	epID   uint16
	policy *maps.PolicyMap
	coll   *ebpf.Collection
	links  []ebpflink.Link
}

func newNetns(c *cleanups) (ns.NetNS, error) {
	n, err := testutils.NewNS()
	if err != nil {
		return nil, fmt.Errorf("create netns: %w", err)
	}
	c.add(func() error {
		_ = n.Close()
		if _, err := os.Stat(n.Path()); err != nil {
			return nil
		}
		if err := testutils.UnmountNS(n); err != nil {
			return fmt.Errorf("remove netns %s: %w", n.Path(), err)
		}
		return nil
	})
	return n, nil
}

// newTopology builds the node, the two pods and the maps. Call close to
// remove everything, also after an error.
func newTopology(ctx context.Context, tmp string) (*topology, error) {
	t := &topology{clientCPU: -1, serverCPU: -1}
	var err error
	if t.node, err = newNetns(&t.cleanups); err != nil {
		return t, err
	}
	err = t.node.Do(func(ns.NetNS) error {
		// Blackhole the bench range first: a packet for a bench address
		// that no pod route covers ends here.
		_, dst, _ := net.ParseCIDR(benchRange.String())
		if err := netlink.RouteAdd(&netlink.Route{Dst: dst, Type: unix.RTN_BLACKHOLE}); err != nil {
			return fmt.Errorf("add blackhole route %s: %w", benchRange, err)
		}
		if err := os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1\n"), 0); err != nil {
			return err
		}
		attrs := netlink.NewLinkAttrs()
		attrs.Name = "cellium_host"
		router := &netlink.Veth{LinkAttrs: attrs, PeerName: "cellium_net"}
		if err := netlink.LinkAdd(router); err != nil {
			return fmt.Errorf("add router device: %w", err)
		}
		addr := &netlink.Addr{IPNet: &net.IPNet{IP: routerIP.AsSlice(), Mask: net.CIDRMask(32, 32)}}
		if err := netlink.AddrAdd(router, addr); err != nil {
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
		return t, fmt.Errorf("set up node namespace: %w", err)
	}
	t.host = link.Host{NetnsPath: t.node.Path()}

	t.dir = filepath.Join(tmp, "bpffs")
	if err := maps.EnsureBPFFS(t.dir); err != nil {
		return t, err
	}
	t.add(func() error { return unix.Unmount(t.dir, 0) })
	// The agent's layout (<bpf-root>/cellium): the agent's cells run on
	// the same maps later.
	t.pinDir = filepath.Join(t.dir, bpfconfig.PinSubdir)
	if err := os.MkdirAll(t.pinDir, 0o700); err != nil {
		return t, err
	}
	if t.maps, err = maps.Open(t.pinDir); err != nil {
		return t, err
	}
	t.add(t.maps.Close)

	if t.a, err = t.addPod(ctx, "a", podAIP, 1001, 1); err != nil {
		return t, err
	}
	if t.b, err = t.addPod(ctx, "b", podBIP, 1002, 2); err != nil {
		return t, err
	}
	return t, nil
}

func (t *topology) close() error { return t.run() }

func (t *topology) addPod(ctx context.Context, name string, ip netip.Addr, id identity.NumericIdentity, epID uint16) (*pod, error) {
	pn, err := newNetns(&t.cleanups)
	if err != nil {
		return nil, err
	}
	res, err := t.host.SetupEndpoint(ctx, link.Spec{
		ContainerID: fmt.Sprintf("cellium-benchdp-%d-%s", os.Getpid(), name),
		NetnsPath:   pn.Path(),
		IPv4:        ip.AsSlice(),
		Gateway:     routerIP.AsSlice(),
	})
	if err != nil {
		return nil, fmt.Errorf("set up pod %s: %w", name, err)
	}
	t.add(func() error { return t.host.RemoveEndpoint(context.Background(), res.HostIfName, pn.Path()) })
	if err := t.host.EnsurePodRoute(ctx, res.HostIfName, ip.AsSlice()); err != nil {
		return nil, err
	}
	p := &pod{name: name, ns: pn, ip: ip, res: res, id: id, epID: epID}
	if err := t.maps.IPCache.Update(netip.PrefixFrom(ip, 32), maps.IPCacheEntry{Identity: id}); err != nil {
		return nil, err
	}
	if err := t.maps.Endpoints.Update(ip, maps.EndpointInfo{
		IfIndex: uint32(res.HostIfIndex), ID: epID, MAC: res.PodMAC, NodeMAC: res.HostMAC, Identity: id,
	}); err != nil {
		return nil, err
	}
	if p.policy, err = maps.OpenPolicyMap(t.pinDir, epID); err != nil {
		return nil, err
	}
	t.add(p.policy.Close)
	return p, nil
}

// load loads p's programs with its constants and policy map, the way the
// loader does.
func (t *topology) load(p *pod) error {
	spec, err := bpf.LoadLxc()
	if err != nil {
		return err
	}
	consts := bpf.EndpointConstants{EndpointID: p.epID, Identity: uint32(p.id), IfIndex: uint32(p.res.HostIfIndex), MAC: p.res.PodMAC, IPv4: p.ip}
	if err := consts.Apply(spec); err != nil {
		return err
	}
	coll, err := ebpf.NewCollectionWithOptions(spec, ebpf.CollectionOptions{MapReplacements: t.maps.Replacements(p.policy)})
	if err != nil {
		var ve *ebpf.VerifierError
		if errors.As(err, &ve) {
			return fmt.Errorf("load programs of pod %s: %+v", p.name, ve)
		}
		return fmt.Errorf("load programs of pod %s: %w", p.name, err)
	}
	p.coll = coll
	t.add(func() error { coll.Close(); return nil })
	return nil
}

// attach attaches both pods' programs with tcx (variant b); with
// redirect it also puts their cil_lxc_policy into cellium_policy_progs,
// so that packets between the pods skip the host stack.
func (t *topology) attach(redirect bool) error {
	for _, p := range []*pod{t.a, t.b} {
		if redirect {
			if err := t.maps.PolicyProgs.Set(p.epID, p.coll.Programs[maps.PolicyProgram]); err != nil {
				return err
			}
		}
		err := t.node.Do(func(ns.NetNS) error {
			for _, h := range []struct {
				prog   string
				attach ebpf.AttachType
			}{{bpf.LxcProgCilFromContainer, ebpf.AttachTCXIngress}, {bpf.LxcProgCilToContainer, ebpf.AttachTCXEgress}} {
				l, err := ebpflink.AttachTCX(ebpflink.TCXOptions{Interface: p.res.HostIfIndex, Program: p.coll.Programs[h.prog], Attach: h.attach})
				if err != nil {
					return fmt.Errorf("attach %s to %s: %w", h.prog, p.res.HostIfName, err)
				}
				p.links = append(p.links, l)
			}
			return nil
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// detach removes the programs from both veths (variant a).
func (t *topology) detach() error {
	var errs []error
	for _, p := range []*pod{t.a, t.b} {
		errs = append(errs, t.maps.PolicyProgs.Delete(p.epID))
		for _, l := range p.links {
			errs = append(errs, l.Close())
		}
		p.links = nil
	}
	return errors.Join(errs...)
}

// Ports the bench's traffic uses.
const (
	iperfPort    = 5201
	sockperfPort = 11111
	streamPort   = 9000
)

// loadPolicy fills the maps with a realistic load: an ipcache of
// ipcachePrefixes prefixes besides the pods, and on both sides an
// enforcing policy that allows the peer on the bench's ports among
// otherEntries entries for other identities and ports.
func (t *topology) loadPolicy(ipcachePrefixes, otherEntries int) error {
	prefixes := make([]netip.Prefix, 0, ipcachePrefixes)
	entries := make([]maps.IPCacheEntry, 0, ipcachePrefixes)
	for i := range ipcachePrefixes {
		var p netip.Prefix
		if i%4 == 3 { // a quarter CIDR prefixes, the rest pod /32s
			j := i / 4
			p = netip.PrefixFrom(netip.AddrFrom4([4]byte{172, 16 + byte(j>>8), byte(j), 0}), 24)
		} else {
			p = netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 98 + byte(i>>16), byte(i >> 8), byte(i)}), 32)
		}
		prefixes = append(prefixes, p)
		entries = append(entries, maps.IPCacheEntry{Identity: identity.NumericIdentity(20000 + i%500)})
	}
	if err := t.maps.IPCache.BatchUpdate(prefixes, entries); err != nil {
		return fmt.Errorf("fill ipcache: %w", err)
	}
	for _, side := range []struct {
		p    *pod
		peer identity.NumericIdentity
		dir  policy.Direction
	}{{t.a, t.b.id, policy.Egress}, {t.b, t.a.id, policy.Ingress}} {
		es := []policy.Entry{
			{Key: policy.NewKey(side.peer, side.dir, policy.ProtoTCP, iperfPort, 16)},
			{Key: policy.NewKey(side.peer, side.dir, policy.ProtoTCP, sockperfPort, 16)},
			{Key: policy.NewKey(side.peer, side.dir, policy.ProtoUDP, streamPort, 16)},
		}
		for i := range otherEntries {
			proto := policy.ProtoTCP
			if i%3 == 2 {
				proto = policy.ProtoUDP
			}
			es = append(es, policy.Entry{Key: policy.NewKey(identity.NumericIdentity(20000+i%500), side.dir, proto, uint16(1000+i), 16)})
		}
		// The other direction does not enforce.
		other := policy.Ingress
		if side.dir == policy.Ingress {
			other = policy.Egress
		}
		es = append(es, policy.Entry{Key: policy.NewKey(0, other, policy.ProtoAny, 0, 0)})
		if err := side.p.policy.BatchUpdate(es); err != nil {
			return fmt.Errorf("fill policy of pod %s: %w", side.p.name, err)
		}
	}
	return nil
}

// txPackets returns the packets p's host veth has sent towards the pod:
// what went through the stack (a redirect into the pod skips it).
func (t *topology) txPackets(p *pod) (uint64, error) {
	var n uint64
	err := t.node.Do(func(ns.NetNS) error {
		l, err := netlink.LinkByIndex(p.res.HostIfIndex)
		if err != nil {
			return fmt.Errorf("read counters of %s: %w", p.res.HostIfName, err)
		}
		if st := l.Attrs().Statistics; st != nil {
			n = st.TxPackets
		}
		return nil
	})
	return n, err
}
