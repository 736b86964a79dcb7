package loader

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sync"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"

	"github.com/cellium/cellium/datapath/bpf"
	"github.com/cellium/cellium/datapath/maps"
)

// NodePortConfig switches the kube-proxy replacement's uplink program
// (bpf/nodeport.c) on and names its devices. The agent fills it from
// --kube-proxy-replacement and --devices.
type NodePortConfig struct {
	// KubeProxyReplacement attaches cil_from_netdev to the uplink devices;
	// false removes it (Cilium's --kube-proxy-replacement).
	KubeProxyReplacement bool
	// Devices are the uplink devices (Cilium's --devices); empty: the
	// devices of the IPv4 default routes, else the device holding the
	// node's address (DetectNodePortDevices).
	Devices []string
	// ServicesInStack: the socket load balancer is off (--bpf-lb-sock=false)
	// and kube-proxy translates the pods' Service connections in the host
	// stack, so the tunnel device hands packets for local endpoints to the
	// stack (Overlay.ViaStack).
	ServicesInStack bool
	// LBMapMax is the load balancer maps' capacity (--bpf-lb-map-max),
	// the same the socket load balancer opens them with; 0 is
	// maps.DefaultLBMapMax.
	LBMapMax int
	// MaglevTableSize is the slots of the frontends' Maglev tables
	// (--bpf-lb-maglev-table-size) with --bpf-lb-algorithm=maglev; 0 picks
	// backends at random. MaglevSeed seeds the program's hash of a
	// connection's 5-tuple (maglev.Seed.Datapath).
	MaglevTableSize, MaglevSeed uint32
	// LBMode is --bpf-lb-mode as the program's NODEPORT_LB_MODE
	// (bpf.LBModeSNAT, the zero value, bpf.LBModeDSR, bpf.LBModeHybrid).
	LBMode uint8
}

// NodePortDir is the directory of the uplink devices' pinned ingress
// links, <root>/cellium/nodeport, one pin per device, named after it.
func (l Layout) NodePortDir() string { return filepath.Join(l.Dir(), "nodeport") }

// NodePortEgressDir is the directory of the uplink devices' pinned egress
// links (cil_to_netdev), <root>/cellium/nodeport-egress, one pin per
// device, named after it.
func (l Layout) NodePortEgressDir() string { return filepath.Join(l.Dir(), "nodeport-egress") }

// NodePort attaches cil_from_netdev (bpf/nodeport.c) to the tcx ingress of
// the node's uplink devices (and cil_to_netdev to their egress), loaded against the global maps and the load
// balancer's maps pinned in Layout.Dir(), with the device's first IPv4
// address as its SNAT address. The links are pinned in
// Layout.NodePortDir(), so they keep running across an agent restart, and
// a new agent replaces their programs in place.
type NodePort struct {
	Layout Layout
	Netns  Netns
	// LBMapMax is the load balancer maps' capacity (NodePortConfig's).
	LBMapMax int
	// MaglevTableSize and MaglevSeed are NodePortConfig's: 0 picks
	// backends at random.
	MaglevTableSize, MaglevSeed uint32
	// LBMode is NodePortConfig's.
	LBMode uint8

	mu sync.Mutex
	// on are the devices this process attached to: ifindex and the
	// SNAT address it loaded the program with.
	on map[string]nodePortDevice
}

type nodePortDevice struct {
	ifindex int
	snat    netip.Addr
}

// Ensure attaches the program to each of devices unless this process
// already did with the same address and the link is still on the device,
// and detaches it from the devices that are not listed any more. A
// missing device is an error wrapping os.ErrNotExist (the others are
// still attached).
func (n *NodePort) Ensure(devices []string) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.on == nil {
		n.on = map[string]nodePortDevice{}
	}
	var errs []error
	err := n.Netns.do(func(h *netlink.Handle) error {
		for _, dev := range devices {
			if err := n.ensure(h, dev); err != nil {
				errs = append(errs, err)
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	if err := n.prune(devices); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

func (n *NodePort) ensure(h *netlink.Handle, dev string) error {
	l, err := linkByName(h, dev)
	if err != nil {
		return err
	}
	if l == nil {
		return fmt.Errorf("uplink device %s: %w", dev, os.ErrNotExist)
	}
	ifindex := l.Attrs().Index
	snat, err := firstIPv4(h, l)
	if err != nil {
		return err
	}
	pin := filepath.Join(n.Layout.NodePortDir(), dev)
	egressPin := filepath.Join(n.Layout.NodePortEgressDir(), dev)
	if cur, ok := n.on[dev]; ok && cur.ifindex == ifindex && cur.snat == snat &&
		pinnedOn(pin, ifindex, ebpf.AttachTCXIngress) && pinnedOn(egressPin, ifindex, ebpf.AttachTCXEgress) {
		return nil
	}
	coll, err := n.load(snat)
	if err != nil {
		return err
	}
	defer coll.Close()
	for _, dir := range []string{n.Layout.NodePortDir(), n.Layout.NodePortEgressDir()} {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return fmt.Errorf("create %s: %w", dir, err)
		}
	}
	if err := attachPinned(pin, ifindex, ebpf.AttachTCXIngress, coll.Programs[bpf.NodeportProgCilFromNetdev]); err != nil {
		return fmt.Errorf("uplink device %s: %w", dev, err)
	}
	if err := attachPinned(egressPin, ifindex, ebpf.AttachTCXEgress, coll.Programs[bpf.NodeportProgCilToNetdev]); err != nil {
		return fmt.Errorf("uplink device %s egress: %w", dev, err)
	}
	n.on[dev] = nodePortDevice{ifindex: ifindex, snat: snat}
	return nil
}

// prune detaches the programs from the pinned devices not in keep.
func (n *NodePort) prune(keep []string) error {
	var errs []error
	for _, dir := range []string{n.Layout.NodePortDir(), n.Layout.NodePortEgressDir()} {
		entries, err := os.ReadDir(dir)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("read %s: %w", dir, err))
			continue
		}
		for _, e := range entries {
			if slices.Contains(keep, e.Name()) {
				continue
			}
			delete(n.on, e.Name())
			if err := removeLinkPin(filepath.Join(dir, e.Name())); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// Remove detaches the program from every device and removes the pins
// (--kube-proxy-replacement off); nothing pinned is fine.
func (n *NodePort) Remove() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.prune(nil)
}

func pinnedOn(pin string, ifindex int, t ebpf.AttachType) bool {
	l, err := link.LoadPinnedLink(pin, nil)
	if err != nil {
		return false
	}
	defer l.Close()
	return linkOn(l, ifindex, t)
}

// firstIPv4 is the first global IPv4 address of l (invalid: none; the
// program then uses each frontend's own address as SNAT source).
func firstIPv4(h *netlink.Handle, l netlink.Link) (netip.Addr, error) {
	addrs, err := h.AddrList(l, netlink.FAMILY_V4)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("addresses of %s: %w", l.Attrs().Name, err)
	}
	for _, a := range addrs {
		if ip, ok := netip.AddrFromSlice(a.IP); ok && a.Scope == int(netlink.SCOPE_UNIVERSE) {
			return ip.Unmap(), nil
		}
	}
	return netip.Addr{}, nil
}

func (n *NodePort) load(snat netip.Addr) (*ebpf.Collection, error) {
	m, err := maps.Open(n.Layout.Dir())
	if err != nil {
		return nil, err
	}
	defer m.Close()
	lb, err := maps.OpenLBWith(n.Layout.Dir(), maps.LBOptions{MapMax: n.LBMapMax})
	if err != nil {
		return nil, err
	}
	defer lb.Close()
	mg, err := maps.OpenMaglev(n.Layout.Dir(), n.LBMapMax)
	if err != nil {
		return nil, err
	}
	defer mg.Close()
	spec, err := maps.LoadNodePortSpec()
	if err != nil {
		return nil, err
	}
	consts := bpf.NodePortConstants{SNATIPv4: snat, MaglevTableSize: n.MaglevTableSize, MaglevSeed: n.MaglevSeed, LBMode: n.LBMode}
	if err := consts.Apply(spec); err != nil {
		return nil, fmt.Errorf("%w: rebuild bpf/ (make bpf)", err)
	}
	repl := m.NodePortReplacements(lb)
	repl[maps.MaglevMapName] = mg.Map()
	maps.FitReplacements(spec, repl)
	coll, err := ebpf.NewCollectionWithOptions(spec, ebpf.CollectionOptions{MapReplacements: repl})
	if err != nil {
		var ve *ebpf.VerifierError
		if errors.As(err, &ve) {
			return nil, fmt.Errorf("load nodeport program: %+v", ve)
		}
		return nil, fmt.Errorf("load nodeport program: %w", err)
	}
	return coll, nil
}

// DetectNodePortDevices returns the uplink devices when --devices is
// empty: the devices of n's IPv4 default routes, else the device holding
// nodeIP (a node without a default route), sorted; none is an empty
// list.
func DetectNodePortDevices(n Netns, nodeIP netip.Addr) ([]string, error) {
	var out []string
	err := n.do(func(h *netlink.Handle) error {
		routes, err := h.RouteList(nil, netlink.FAMILY_V4)
		if err != nil {
			return fmt.Errorf("list routes: %w", err)
		}
		for _, r := range routes {
			if r.Dst != nil && !r.Dst.IP.IsUnspecified() {
				continue
			}
			if r.Dst != nil {
				if ones, _ := r.Dst.Mask.Size(); ones != 0 {
					continue
				}
			}
			if r.LinkIndex == 0 {
				continue
			}
			l, err := h.LinkByIndex(r.LinkIndex)
			if err != nil {
				return fmt.Errorf("link of the default route: %w", err)
			}
			out = append(out, l.Attrs().Name)
		}
		if len(out) > 0 || !nodeIP.Is4() {
			return nil
		}
		addrs, err := h.AddrList(nil, netlink.FAMILY_V4)
		if err != nil {
			return fmt.Errorf("list addresses: %w", err)
		}
		for _, a := range addrs {
			if ip, ok := netip.AddrFromSlice(a.IP); ok && ip.Unmap() == nodeIP {
				l, err := h.LinkByIndex(a.LinkIndex)
				if err != nil {
					return fmt.Errorf("link of %s: %w", nodeIP, err)
				}
				out = append(out, l.Attrs().Name)
			}
		}
		return nil
	})
	slices.Sort(out)
	return slices.Compact(out), err
}
