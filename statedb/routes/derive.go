package routes

import (
	"iter"
	"net/netip"
	"slices"

	"github.com/cilium/statedb"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	"github.com/cellium/cellium/statedb/endpoints"
	"github.com/cellium/cellium/statedb/nodes"
	"github.com/cellium/cellium/statedb/reconciler"
)

// Desired is the node's whole desired host networking.
type Desired struct {
	Routes  []*Route
	Devices []*Device
	Sysctls []*Sysctl
}

// Derive computes the desired host networking from the local node (nil
// while unknown) and the local endpoints:
//   - with a router IP: cilium_host (veth peer cilium_net) carrying the
//     router IP as a /32, and the sysctls that let the node route between
//     pods: IPv4 forwarding on, reverse-path filtering off on "all" and on
//     cilium_host (the kernel applies the larger of the two);
//   - for every endpoint with an IPv4 address and a host interface that is
//     not being deleted: a /32 route to it through that interface.
//
// Without a router IP the pods have no gateway yet: no device and no
// sysctls are desired (routes still are, so the host reaches the pods).
// The output is sorted by key.
func Derive(local *nodes.LocalNode, eps iter.Seq[*endpoints.Endpoint]) Desired {
	var d Desired
	for ep := range eps {
		if !ep.IPv4.Is4() || ep.HostIfName == "" {
			continue
		}
		switch ep.State {
		case ciliumv2.EndpointStateDisconnecting, ciliumv2.EndpointStateDisconnected:
			continue
		}
		d.Routes = append(d.Routes, &Route{
			Prefix: netip.PrefixFrom(ep.IPv4, 32), Device: ep.HostIfName, DeviceIndex: ep.HostIfIndex,
			EndpointID: ep.ID,
		})
	}
	slices.SortFunc(d.Routes, func(a, b *Route) int { return comparePrefix(a.Prefix, b.Prefix) })
	if local == nil || !local.RouterIP.Is4() {
		return d
	}
	d.Devices = []*Device{{
		Name: HostDevice, Peer: NetDevice,
		Addrs: []netip.Prefix{netip.PrefixFrom(local.RouterIP, 32)},
	}}
	d.Sysctls = []*Sysctl{
		{Name: "net.ipv4.conf.all.rp_filter", Value: "0"},
		{Name: "net.ipv4.conf." + HostDevice + ".forwarding", Value: "1"},
		{Name: "net.ipv4.conf." + HostDevice + ".rp_filter", Value: "0"},
		{Name: "net.ipv4.ip_forward", Value: "1"},
	}
	return d
}

// Sync makes table hold exactly want (sorted or not) in wtxn: rows that
// are new or changed are inserted with a pending status, rows that are not
// wanted any more are deleted (the reconciler then removes them from the
// kernel), identical rows are left alone so that nothing is reconciled
// again for them. It reports whether it changed anything.
func Sync[Obj interface {
	SameAs(Obj) bool
	WithStatus(reconciler.Status) Obj
}](wtxn statedb.WriteTxn, table statedb.RWTable[Obj], want []Obj, getStatus func(Obj) reconciler.Status) (bool, error) {
	changed := false
	keep := map[string]bool{}
	idx := table.PrimaryIndexer()
	for _, w := range want {
		k, _ := idx.ObjectToKey(w)
		keep[string(k)] = true
		q, _ := idx.QueryFromObject(w)
		cur, _, found := table.Get(wtxn, q)
		if found && cur.SameAs(w) && getStatus(cur).Kind != reconciler.StatusPendingDelete {
			continue
		}
		if _, _, err := table.Insert(wtxn, w.WithStatus(reconciler.Pending())); err != nil {
			return changed, err
		}
		changed = true
	}
	var stale []Obj
	for cur := range table.All(wtxn) {
		if getStatus(cur).Kind == reconciler.StatusPendingDelete {
			continue // the reconciler's: its deletion is being retried
		}
		if k, _ := idx.ObjectToKey(cur); !keep[string(k)] {
			stale = append(stale, cur)
		}
	}
	for _, cur := range stale {
		if _, _, err := table.Delete(wtxn, cur); err != nil {
			return changed, err
		}
		changed = true
	}
	return changed, nil
}

// DeriveMasquerade is the masquerade rules of the local node (nil while
// unknown): one per IPv4 pod CIDR, never for traffic leaving through
// cilium_host.
func DeriveMasquerade(local *nodes.LocalNode) []*Masquerade {
	if local == nil {
		return nil
	}
	var out []*Masquerade
	for _, p := range local.PodCIDRs {
		if p.Addr().Is4() {
			out = append(out, &Masquerade{Prefix: p.Masked(), ExceptDevice: HostDevice})
		}
	}
	slices.SortFunc(out, func(a, b *Masquerade) int { return comparePrefix(a.Prefix, b.Prefix) })
	return out
}

// Routing modes (--routing-mode), as in Cilium.
const (
	RoutingModeTunnel = "tunnel"
	RoutingModeNative = "native"
)

// TunnelDevice is the name of the tunnel device, as in Cilium.
const TunnelDevice = "cilium_vxlan"

// TunnelOverhead is what VXLAN over IPv4 adds to a packet: outer IPv4
// (20), UDP (8), VXLAN (8) and the inner Ethernet header (14).
const TunnelOverhead = 50

// Remote is how the node reaches other nodes' pods (the routing-mode
// flags of daemon/hostrouting).
type Remote struct {
	// Mode is RoutingModeTunnel or RoutingModeNative.
	Mode string
	// TunnelPort is the VXLAN UDP port.
	TunnelPort int
	// TunnelMTU is cilium_vxlan's MTU (the uplink's minus TunnelOverhead);
	// 0 leaves the kernel's default.
	TunnelMTU int
	// AutoDirectNodeRoutes routes each remote pod CIDR via its node's
	// InternalIP in native mode, for nodes on the same L2 subnet.
	AutoDirectNodeRoutes bool
	// SameSubnet reports whether a node IP is on one of the node's own
	// uplink subnets (directly reachable); nil: none is.
	SameSubnet func(netip.Addr) bool
	// NativeRoutingCIDR is the range the network routes natively, never
	// masqueraded (--ipv4-native-routing-cidr); invalid for none.
	NativeRoutingCIDR netip.Prefix
}

// DeriveRemote computes the routes and devices for other nodes' pods from
// the nodes table's rows (the local node's own row is skipped):
//   - tunnel mode: the tunnel device (KindVXLAN, external) and a route of
//     every remote IPv4 pod CIDR into it;
//   - native mode with AutoDirectNodeRoutes: a route of every remote IPv4
//     pod CIDR via its node's InternalIP, for nodes SameSubnet accepts;
//   - native mode without: nothing (the network routes pod CIDRs).
//
// The output is sorted.
func DeriveRemote(cfg Remote, localName string, all iter.Seq[*nodes.Node]) ([]*Route, []*Device) {
	var rs []*Route
	var devs []*Device
	tunnel := cfg.Mode == RoutingModeTunnel
	if tunnel {
		devs = append(devs, &Device{Name: TunnelDevice, Kind: KindVXLAN, Port: cfg.TunnelPort, MTU: cfg.TunnelMTU})
	} else if !cfg.AutoDirectNodeRoutes {
		return nil, nil
	}
	for n := range all {
		if n.Local || n.Name == localName {
			continue
		}
		ip, ok := n.Address(nodes.AddressInternalIP)
		if !tunnel && (!ok || !ip.Is4() || cfg.SameSubnet == nil || !cfg.SameSubnet(ip)) {
			continue
		}
		for _, p := range n.PodCIDRs {
			if !p.Addr().Is4() {
				continue
			}
			r := &Route{Prefix: p.Masked(), NodeBootID: n.BootID}
			if tunnel {
				r.Device = TunnelDevice
			} else {
				r.Gateway = ip
			}
			rs = append(rs, r)
		}
	}
	slices.SortFunc(rs, func(a, b *Route) int { return comparePrefix(a.Prefix, b.Prefix) })
	rs = slices.CompactFunc(rs, func(a, b *Route) bool { return a.Prefix == b.Prefix })
	return rs, devs
}

// DeriveMasqueradeExceptions are the destinations the node never
// masquerades, beyond its own pod CIDRs: every other node's pod CIDRs and
// addresses, and the native routing CIDR. Prefixes equal to a local pod
// CIDR are left out (its masquerade rule already excludes them).
func DeriveMasqueradeExceptions(cfg Remote, local *nodes.LocalNode, all iter.Seq[*nodes.Node]) []*Masquerade {
	if local == nil {
		return nil
	}
	seen := map[netip.Prefix]bool{}
	for _, p := range local.PodCIDRs {
		seen[p.Masked()] = true
	}
	var out []*Masquerade
	add := func(p netip.Prefix) {
		if !p.IsValid() || !p.Addr().Is4() || seen[p.Masked()] {
			return
		}
		seen[p.Masked()] = true
		out = append(out, &Masquerade{Prefix: p.Masked(), Except: true})
	}
	add(cfg.NativeRoutingCIDR)
	for n := range all {
		if n.Local || n.Name == local.Name {
			continue
		}
		for _, p := range n.PodCIDRs {
			add(p)
		}
		for _, a := range n.Addresses {
			if a.IP.Is4() {
				add(netip.PrefixFrom(a.IP, 32))
			}
		}
	}
	slices.SortFunc(out, func(a, b *Masquerade) int { return comparePrefix(a.Prefix, b.Prefix) })
	return out
}
