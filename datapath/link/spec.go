package link

import (
	"crypto/rand"
	"fmt"
	"net"
	"slices"
)

const (
	// DefaultMTU is the device MTU when Spec.MTU is 0.
	DefaultMTU = 1500

	// minMTU is the smallest MTU IPv4 allows (RFC 791); maxMTU is the
	// largest a veth accepts.
	minMTU = 68
	maxMTU = 65535

	// txQueueLen is the veth transmit queue length on both ends, as Cilium
	// sets it (a zero-length queue would make qdiscs on the veth drop).
	txQueueLen = 1000
)

// Spec describes one pod interface.
type Spec struct {
	// ContainerID identifies the container (sandbox). Required. It is
	// recorded in the host-side link's alias.
	ContainerID string

	// NetnsPath is the path of the pod's network namespace, e.g.
	// /var/run/netns/cni-1234. Required.
	NetnsPath string

	// IfName is the interface name inside the pod. Default DefaultIfName.
	IfName string

	// HostIfName is the host-side link name. Default
	// HostInterfaceName(ContainerID, IfName). ListHostInterfaces only sees
	// names that start with HostIfPrefix.
	HostIfName string

	// MTU of both ends of the veth. Default DefaultMTU.
	MTU int

	// RouteMTU, when not 0, is set on the routes via Gateway (Cilium's
	// "route MTU": the device MTU minus tunnel or encryption overhead).
	RouteMTU int

	// MAC is the pod-side MAC address. Default: a random locally
	// administered unicast address.
	MAC net.HardwareAddr

	// IPv4 is the pod's address. Required. It is installed as a /32, so the
	// pod has no on-link neighbours: everything goes through Gateway.
	IPv4 net.IP

	// Gateway is the node's router IP (Cilium's cilium_host address). The
	// pod reaches it over the veth through a scope-link /32 route, so the
	// node must answer ARP for it on the host link: the kernel does when
	// the address is assigned to any device of the node (arp_ignore=0, the
	// default), as it is on cilium_host. Required.
	Gateway net.IP

	// Routes are the routes via Gateway installed in the pod after the
	// gateway's /32. Default: a single default route (0.0.0.0/0).
	Routes []Route
}

// Route is a route inside the pod.
type Route struct {
	// Dst is the destination prefix.
	Dst net.IPNet

	// Via is the next hop. In Spec.Routes it must be nil (Gateway is used)
	// or an address reachable on the pod interface. In Result.Routes it is
	// nil for the scope-link route to the gateway.
	Via net.IP

	// MTU is the route MTU; 0 means Spec.RouteMTU.
	MTU int
}

func (r Route) String() string {
	s := r.Dst.String()
	if r.Via != nil {
		s += " via " + r.Via.String()
	}
	if r.MTU != 0 {
		s += fmt.Sprintf(" mtu %d", r.MTU)
	}
	return s
}

// Result is what SetupEndpoint made: everything a CNI result and an
// endpoint record need.
type Result struct {
	HostIfName  string
	HostIfIndex int
	HostMAC     net.HardwareAddr

	PodIfName  string
	PodIfIndex int
	PodMAC     net.HardwareAddr
	NetnsPath  string

	MTU int

	// IPv4 is the pod address with its /32 mask.
	IPv4    net.IPNet
	Gateway net.IP

	// Routes are the routes in the pod, in the order they were added: the
	// scope-link route to Gateway first, then the routes via Gateway.
	Routes []Route
}

// HostLink is a host-side endpoint link, as ListHostInterfaces finds it.
type HostLink struct {
	Name  string
	Index int
	Kind  string // "veth" for links made by SetupEndpoint
	MAC   net.HardwareAddr
	MTU   int
	Up    bool

	// ContainerID and IfName come from the link's alias; both are empty
	// when the link was not made by this package.
	ContainerID string
	IfName      string

	// PeerIndex is the ifindex of the other end in its own namespace and
	// PeerNetnsID the host's ID for that namespace (-1 when the peer is in
	// the host namespace or unknown).
	PeerIndex   int
	PeerNetnsID int
}

// normalize checks s and fills in defaults. The returned spec owns copies
// of every slice, so the caller's spec is never aliased.
func (s Spec) normalize() (Spec, error) {
	bad := func(format string, args ...any) (Spec, error) {
		return Spec{}, fmt.Errorf("%w: "+format, append([]any{ErrInvalidSpec}, args...)...)
	}
	if s.ContainerID == "" {
		return bad("container ID is empty")
	}
	if s.NetnsPath == "" {
		return bad("netns path is empty")
	}
	if s.IfName == "" {
		s.IfName = DefaultIfName
	}
	if err := checkIfName(s.IfName); err != nil {
		return bad("pod interface: %v", err)
	}
	if s.HostIfName == "" {
		s.HostIfName = HostInterfaceName(s.ContainerID, s.IfName)
	}
	if err := checkIfName(s.HostIfName); err != nil {
		return bad("host interface: %v", err)
	}
	if len(hostAlias(s.ContainerID, s.IfName)) > maxAliasLen {
		return bad("container ID is %d bytes, too long to record in the link alias", len(s.ContainerID))
	}
	if s.MTU == 0 {
		s.MTU = DefaultMTU
	}
	if s.MTU < minMTU || s.MTU > maxMTU {
		return bad("MTU %d is outside %d..%d", s.MTU, minMTU, maxMTU)
	}
	if s.RouteMTU != 0 && (s.RouteMTU < minMTU || s.RouteMTU > s.MTU) {
		return bad("route MTU %d is outside %d..%d (the device MTU)", s.RouteMTU, minMTU, s.MTU)
	}
	if s.MAC != nil {
		if len(s.MAC) != 6 || s.MAC[0]&1 != 0 || isZero(s.MAC) {
			return bad("MAC %s is not a unicast Ethernet address", s.MAC)
		}
		s.MAC = append(net.HardwareAddr(nil), s.MAC...)
	}
	ip4 := s.IPv4.To4()
	if ip4 == nil || !ip4.IsGlobalUnicast() {
		return bad("pod address %q is not a unicast IPv4 address", s.IPv4)
	}
	s.IPv4 = slices.Clone(ip4)
	gw := s.Gateway.To4()
	// A link-local gateway (169.254.x.x) is allowed: the pod only reaches
	// it through the scope-link route.
	if gw == nil || !gw.IsGlobalUnicast() && !gw.IsLinkLocalUnicast() {
		return bad("gateway %q is not a unicast IPv4 address", s.Gateway)
	}
	if gw.Equal(ip4) {
		return bad("gateway %s is the pod address", gw)
	}
	s.Gateway = slices.Clone(gw)
	routes := s.Routes
	if len(routes) == 0 {
		routes = []Route{{Dst: net.IPNet{IP: net.IPv4zero.To4(), Mask: net.CIDRMask(0, 32)}}}
	}
	s.Routes = make([]Route, 0, len(routes))
	for _, r := range routes {
		dst := r.Dst.IP.To4()
		ones, bits := r.Dst.Mask.Size()
		if dst == nil || bits != 32 {
			return bad("route %s is not an IPv4 prefix", r)
		}
		if !dst.Mask(r.Dst.Mask).Equal(dst) {
			return bad("route %s has host bits set", r)
		}
		via := s.Gateway
		if r.Via != nil {
			if via = slices.Clone(r.Via.To4()); via == nil {
				return bad("route %s: next hop is not IPv4", r)
			}
		}
		mtu := r.MTU
		if mtu == 0 {
			mtu = s.RouteMTU
		}
		if mtu != 0 && (mtu < minMTU || mtu > s.MTU) {
			return bad("route %s: MTU outside %d..%d", r, minMTU, s.MTU)
		}
		s.Routes = append(s.Routes, Route{
			Dst: net.IPNet{IP: slices.Clone(dst), Mask: net.CIDRMask(ones, 32)},
			Via: via,
			MTU: mtu,
		})
	}
	return s, nil
}

// podRoutes are the routes the pod gets, in order.
func (s Spec) podRoutes() []Route {
	rs := make([]Route, 0, len(s.Routes)+1)
	rs = append(rs, Route{Dst: hostNet(s.Gateway)})
	return append(rs, s.Routes...)
}

// hostNet is ip as a single-address prefix (/32 or /128).
func hostNet(ip net.IP) net.IPNet {
	if ip4 := ip.To4(); ip4 != nil {
		return net.IPNet{IP: ip4, Mask: net.CIDRMask(32, 32)}
	}
	return net.IPNet{IP: ip.To16(), Mask: net.CIDRMask(128, 128)}
}

func isZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// randomMAC returns a random locally administered unicast MAC. SetupEndpoint
// sets explicit addresses on both ends instead of letting the kernel pick:
// udev's MACAddressPolicy=persistent rewrites kernel-random veth addresses
// asynchronously, which would race with the Result we return.
func randomMAC() (net.HardwareAddr, error) {
	mac := make(net.HardwareAddr, 6)
	if _, err := rand.Read(mac); err != nil {
		return nil, fmt.Errorf("generate MAC: %w", err)
	}
	mac[0] = mac[0]&^0x01 | 0x02 // unicast, locally administered
	return mac, nil
}
