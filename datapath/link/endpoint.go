package link

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"syscall"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
)

// Steps of SetupEndpoint, in order; tests inject failures by name.
const (
	stepCreateVeth  = "create veth"
	stepLabelHost   = "label host link"
	stepHostSysctls = "host sysctls"
	stepLabelPod    = "label pod link"
	stepPodSysctls  = "pod sysctls"
	stepPodUp       = "pod link up"
	stepHostUp      = "host link up"
	stepPodAddress  = "pod address"
	stepPodRoutes   = "pod routes"
	stepReadBack    = "read back"
)

var setupSteps = []string{
	stepCreateVeth, stepLabelHost, stepHostSysctls, stepLabelPod, stepPodSysctls,
	stepPodUp, stepHostUp, stepPodAddress, stepPodRoutes, stepReadBack,
}

// hostSysctls are set on the host side of every endpoint:
//   - rp_filter=0: the host-side veth has no address and the node has no
//     route back to the pod until the route reconciler adds it, and later
//     the eBPF programs redirect traffic around the FIB; strict reverse path
//     filtering would drop the pod's packets. (The kernel uses the maximum
//     of "all" and the device's value: the agent keeps "all" at 0.)
//   - disable_ipv6=1: the endpoint is IPv4 only, so no link-local address,
//     router solicitations or MLD reports on the veth.
func hostSysctls(hostIfName string) []sysctl {
	return []sysctl{
		{path: rpFilter(hostIfName), value: "0"},
		{path: disableIPv6(hostIfName), value: "1", optional: true},
	}
}

// podSysctls are set on the pod side: disable_ipv6=1 for the same reason
// as on the host side; it is set before the link comes up, so not a single
// IPv6 packet (DAD, router solicitation) leaves the pod.
func podSysctls(ifName string) []sysctl {
	return []sysctl{
		{path: disableIPv6(ifName), value: "1", optional: true},
	}
}

// SetupEndpoint creates the veth pair for spec: the host side named
// spec.HostIfName in h's namespace, the pod side named spec.IfName in
// spec.NetnsPath, both with spec.MTU, explicit MACs and transmit queue
// length 1000, both up, the pod address as a /32, a scope-link route to
// the gateway and spec.Routes via it in the pod, and the sysctls listed at
// hostSysctls and podSysctls. It does not add the host route to the pod;
// see EnsurePodRoute.
//
// A host link with the same name left by an earlier attempt for the same
// container is removed first, and so is any link named spec.IfName in the
// pod. The pod side is created directly in the pod's namespace under its
// final name (one netlink request with the peer's namespace set), so it
// never exists in the host namespace, never clashes with a host interface
// of the same name, and is not moved or renamed afterwards.
//
// On any error, everything SetupEndpoint created is removed (deleting the
// host end deletes the pair, wherever the peer is); an error during that
// clean-up is joined to the returned one.
//
// Errors: ErrInvalidSpec, also when spec.NetnsPath is the host namespace
// (nothing changed); ErrNetnsNotFound for the pod or host namespace
// (nothing changed); ErrHostLinkInUse when the name is taken by a link
// that is not this container's veth, or is its veth with the peer in
// another network namespace (left untouched); ctx's error when it
// ends between steps; netlink and sysctl errors.
func (h Host) SetupEndpoint(ctx context.Context, spec Spec) (res Result, err error) {
	s, err := spec.normalize()
	if err != nil {
		return Result{}, fmt.Errorf("setup endpoint: %w", err)
	}
	defer func() {
		if err != nil {
			err = fmt.Errorf("setup endpoint %s for container %s: %w", s.HostIfName, s.ContainerID, err)
		}
	}()
	if err := ctx.Err(); err != nil {
		return Result{}, err
	}

	hostNS, err := h.open()
	if err != nil {
		return Result{}, err
	}
	defer hostNS.Close()
	podNS, err := openNetns(s.NetnsPath)
	if err != nil {
		return Result{}, err
	}
	defer podNS.Close()
	if err := checkDistinct(hostNS, podNS); err != nil {
		return Result{}, err
	}
	hostH, err := newHandle(hostNS)
	if err != nil {
		return Result{}, err
	}
	defer hostH.Close()
	podH, err := newHandle(podNS)
	if err != nil {
		return Result{}, err
	}
	defer podH.Close()

	if err := removeLeftovers(hostH, podH, podNS, s); err != nil {
		return Result{}, err
	}

	hostMAC, err := randomMAC()
	if err != nil {
		return Result{}, err
	}
	podMAC := s.MAC
	if podMAC == nil {
		if podMAC, err = randomMAC(); err != nil {
			return Result{}, err
		}
	}

	step := func(name string, f func() error) error {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		if h.fail != nil {
			if err := h.fail(name); err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
		}
		if err := f(); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		return nil
	}

	veth := &netlink.Veth{
		LinkAttrs: netlink.LinkAttrs{
			Name:         s.HostIfName,
			MTU:          s.MTU,
			TxQLen:       txQueueLen,
			HardwareAddr: hostMAC,
		},
		PeerName:         s.IfName,
		PeerHardwareAddr: podMAC,
		PeerMTU:          uint32(s.MTU),
		PeerTxQLen:       txQueueLen,
		PeerNamespace:    netlink.NsFd(podNS.Fd()),
	}
	if err := step(stepCreateVeth, func() error { return hostH.LinkAdd(veth) }); err != nil {
		return Result{}, err
	}
	// From here on the pair exists: undo it on any failure. LinkAdd
	// looked up the new link's ifindex; deleting by index (and name)
	// removes exactly the link this call made, and with it the peer.
	defer func() {
		if err != nil {
			if rerr := deleteCreated(hostH, veth.Index, s.HostIfName); rerr != nil {
				err = errors.Join(err, fmt.Errorf("roll back: %w", rerr))
			}
		}
	}()

	hostLink := netlink.Link(veth)
	var podLink netlink.Link
	if err := step(stepLabelHost, func() error {
		// The kernel ignores IFLA_IFALIAS when it creates a link.
		return hostH.LinkSetAlias(hostLink, hostAlias(s.ContainerID, s.IfName))
	}); err != nil {
		return Result{}, err
	}
	if err := step(stepHostSysctls, func() error {
		return writeSysctls(hostNS, hostSysctls(s.HostIfName)...)
	}); err != nil {
		return Result{}, err
	}
	if err := step(stepLabelPod, func() error {
		var err error
		if podLink, err = podH.LinkByName(s.IfName); err != nil {
			return err
		}
		if podLink.Attrs().ParentIndex != hostLink.Attrs().Index {
			// Not our peer: the pair was deleted and the name reused.
			return fmt.Errorf("pod link %s is not the peer of %s", s.IfName, s.HostIfName)
		}
		return podH.LinkSetAlias(podLink, podAlias(s.HostIfName))
	}); err != nil {
		return Result{}, err
	}
	if err := step(stepPodSysctls, func() error {
		return writeSysctls(podNS, podSysctls(s.IfName)...)
	}); err != nil {
		return Result{}, err
	}
	if err := step(stepPodUp, func() error {
		return podH.LinkSetUp(podLink)
	}); err != nil {
		return Result{}, err
	}
	if err := step(stepHostUp, func() error {
		return hostH.LinkSetUp(hostLink)
	}); err != nil {
		return Result{}, err
	}
	podAddr := hostNet(s.IPv4)
	if err := step(stepPodAddress, func() error {
		return podH.AddrAdd(podLink, &netlink.Addr{IPNet: &podAddr})
	}); err != nil {
		return Result{}, err
	}
	routes := s.podRoutes()
	if err := step(stepPodRoutes, func() error {
		for _, r := range routes {
			if err := podH.RouteAdd(netlinkRoute(podLink.Attrs().Index, r)); err != nil {
				return fmt.Errorf("route %s: %w", r, err)
			}
		}
		return nil
	}); err != nil {
		return Result{}, err
	}
	if err := step(stepReadBack, func() error {
		var err error
		if hostLink, err = hostH.LinkByIndex(hostLink.Attrs().Index); err != nil {
			return fmt.Errorf("host link: %w", err)
		}
		if podLink, err = podH.LinkByIndex(podLink.Attrs().Index); err != nil {
			return fmt.Errorf("pod link: %w", err)
		}
		return nil
	}); err != nil {
		return Result{}, err
	}

	return Result{
		HostIfName:  s.HostIfName,
		HostIfIndex: hostLink.Attrs().Index,
		HostMAC:     hostLink.Attrs().HardwareAddr,
		PodIfName:   s.IfName,
		PodIfIndex:  podLink.Attrs().Index,
		PodMAC:      podLink.Attrs().HardwareAddr,
		NetnsPath:   s.NetnsPath,
		MTU:         s.MTU,
		IPv4:        podAddr,
		Gateway:     s.Gateway,
		Routes:      routes,
	}, nil
}

// netlinkRoute is r on the pod link: scope link without a next hop, else
// via r.Via.
func netlinkRoute(linkIndex int, r Route) *netlink.Route {
	dst := r.Dst
	nr := &netlink.Route{
		LinkIndex: linkIndex,
		Dst:       &dst,
		Table:     syscall.RT_TABLE_MAIN,
		MTU:       r.MTU,
	}
	if r.Via == nil {
		nr.Scope = netlink.SCOPE_LINK
	} else {
		nr.Gw = r.Via
	}
	return nr
}

// removeLeftovers deletes what an earlier attempt for the same endpoint
// may have left: the host link (only a veth that is unlabelled or labelled
// with this container, and whose peer is in the host or in this pod's
// namespace: a peer in another namespace is a live attachment of the same
// container ID, which an ADD into another namespace must not destroy), a
// stray temporary peer, and any link named s.IfName in the pod, as
// Cilium's CNI does before creating one.
func removeLeftovers(hostH, podH *netlink.Handle, podNS ns.NetNS, s Spec) error {
	l, err := linkByName(hostH, s.HostIfName)
	if err != nil {
		return err
	}
	if l != nil {
		if l.Type() != "veth" {
			return fmt.Errorf("%w: %s is a %s link", ErrHostLinkInUse, s.HostIfName, l.Type())
		}
		if cid, ifName, ok := parseHostAlias(l.Attrs().Alias); ok && (cid != s.ContainerID || ifName != s.IfName) {
			return fmt.Errorf("%w: %s belongs to container %s interface %s", ErrHostLinkInUse, s.HostIfName, cid, ifName)
		}
		if err := checkPeerHere(hostH, podNS, l, s); err != nil {
			return err
		}
		if err := deleteLink(hostH, s.HostIfName); err != nil {
			return fmt.Errorf("remove earlier link: %w", err)
		}
	}
	tmpName := tempPeerName(s.HostIfName)
	l, err = linkByName(hostH, tmpName)
	if err != nil {
		return err
	}
	if l != nil {
		if l.Type() != "veth" {
			return fmt.Errorf("%w: temporary name %s is a %s link", ErrHostLinkInUse, tmpName, l.Type())
		}
		if err := deleteLink(hostH, tmpName); err != nil {
			return fmt.Errorf("remove earlier temporary link: %w", err)
		}
	}
	if err := deleteLink(podH, s.IfName); err != nil {
		return fmt.Errorf("remove earlier pod interface: %w", err)
	}
	return nil
}

// checkPeerHere refuses a host veth whose peer lives in a network
// namespace other than the host's and the pod's of s. The kernel reports
// the peer's namespace as an ID local to the host namespace (-1: the same
// namespace); the pod namespace's ID is looked up the same way (-1: the
// host has never named it, so no peer can live there).
func checkPeerHere(hostH *netlink.Handle, podNS ns.NetNS, l netlink.Link, s Spec) error {
	peerNS := l.Attrs().NetNsID
	if peerNS < 0 {
		return nil // peer in the host namespace: a half-made pair
	}
	podID, err := hostH.GetNetNsIdByFd(int(podNS.Fd()))
	if err != nil {
		return fmt.Errorf("look up the ID of network namespace %s: %w", s.NetnsPath, err)
	}
	if podID >= 0 && podID == peerNS {
		return nil
	}
	return fmt.Errorf("%w: %s is the live interface of container %s in another network namespace (ID %d), not %s; it is left alone: run DEL for the container first",
		ErrHostLinkInUse, s.HostIfName, s.ContainerID, peerNS, s.NetnsPath)
}

// deleteLink deletes the link called name; a missing link is not an error.
func deleteLink(h *netlink.Handle, name string) error {
	l, err := linkByName(h, name)
	if err != nil || l == nil {
		return err
	}
	if err := h.LinkDel(l); err != nil && !isLinkNotFound(err) {
		return fmt.Errorf("delete link %s: %w", name, err)
	}
	return nil
}

// deleteCreated deletes the link with ifindex index if it is still called
// name, or the link called name when the index is unknown (0). A missing
// link is not an error.
func deleteCreated(h *netlink.Handle, index int, name string) error {
	if index == 0 {
		return deleteLink(h, name)
	}
	l, err := h.LinkByIndex(index)
	if isLinkNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("look up link %d: %w", index, err)
	}
	if l.Attrs().Name != name {
		return nil
	}
	if err := h.LinkDel(l); err != nil && !isLinkNotFound(err) {
		return fmt.Errorf("delete link %s: %w", name, err)
	}
	return nil
}

// RemoveEndpoint deletes the endpoint whose host-side link is hostIfName.
// Deleting the host end of the veth deletes the pod end too; when
// netnsPath is not empty, any link left in that namespace that
// SetupEndpoint labelled as belonging to hostIfName is deleted as well.
// A missing link or a missing pod namespace is not an error, so the call
// can be repeated.
//
// Errors: ErrInvalidSpec for a bad name or a netnsPath that is the host
// namespace; ErrHostLinkInUse when hostIfName is not a veth (it is left
// alone); ErrNetnsNotFound for a missing host namespace; ctx's error;
// netlink errors.
func (h Host) RemoveEndpoint(ctx context.Context, hostIfName, netnsPath string) error {
	if err := checkIfName(hostIfName); err != nil {
		return fmt.Errorf("remove endpoint: %w: %v", ErrInvalidSpec, err)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("remove endpoint %s: %w", hostIfName, err)
	}
	err := h.withHandle(func(_ ns.NetNS, nh *netlink.Handle) error {
		l, err := linkByName(nh, hostIfName)
		if err != nil || l == nil {
			return err
		}
		if l.Type() != "veth" {
			return fmt.Errorf("%w: %s is a %s link, not an endpoint veth", ErrHostLinkInUse, hostIfName, l.Type())
		}
		if err := nh.LinkDel(l); err != nil && !isLinkNotFound(err) {
			return fmt.Errorf("delete link %s: %w", hostIfName, err)
		}
		return nil
	})
	if err == nil && netnsPath != "" {
		err = h.removePodLeftovers(hostIfName, netnsPath)
	}
	if err != nil {
		return fmt.Errorf("remove endpoint %s: %w", hostIfName, err)
	}
	return nil
}

func (h Host) removePodLeftovers(hostIfName, netnsPath string) error {
	podNS, err := openNetns(netnsPath)
	if errors.Is(err, ErrNetnsNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	defer podNS.Close()
	hostNS, err := h.open()
	if err != nil {
		return err
	}
	defer hostNS.Close()
	if err := checkDistinct(hostNS, podNS); err != nil {
		return err
	}
	podH, err := newHandle(podNS)
	if err != nil {
		return err
	}
	defer podH.Close()
	links, err := retryDump(podH.LinkList)
	if err != nil {
		return fmt.Errorf("list links in %s: %w", netnsPath, err)
	}
	alias := podAlias(hostIfName)
	for _, l := range links {
		if l.Attrs().Alias != alias {
			continue
		}
		if err := podH.LinkDel(l); err != nil && !isLinkNotFound(err) {
			return fmt.Errorf("delete pod link %s: %w", l.Attrs().Name, err)
		}
	}
	return nil
}

// CheckEndpoint verifies that what SetupEndpoint makes for spec is in
// place: both links exist, are each other's peers, are up and have
// spec.MTU (and spec.MAC, if set); the host link is labelled with this
// container and has rp_filter 0; the pod has the /32 address and every
// route. It reports every problem, not only the first.
//
// Errors: ErrInvalidSpec (as for SetupEndpoint); ErrNetnsNotFound for the
// pod or host namespace; otherwise a join of ErrLinkNotFound (a link is
// missing) and ErrMismatch (anything else) errors, one per problem, each
// saying what and where.
func (h Host) CheckEndpoint(ctx context.Context, spec Spec) (err error) {
	s, err := spec.normalize()
	if err != nil {
		return fmt.Errorf("check endpoint: %w", err)
	}
	defer func() {
		if err != nil {
			err = fmt.Errorf("check endpoint %s for container %s: %w", s.HostIfName, s.ContainerID, err)
		}
	}()
	if err := ctx.Err(); err != nil {
		return err
	}
	hostNS, err := h.open()
	if err != nil {
		return err
	}
	defer hostNS.Close()
	podNS, err := openNetns(s.NetnsPath)
	if err != nil {
		return err
	}
	defer podNS.Close()
	if err := checkDistinct(hostNS, podNS); err != nil {
		return err
	}
	hostH, err := newHandle(hostNS)
	if err != nil {
		return err
	}
	defer hostH.Close()
	podH, err := newHandle(podNS)
	if err != nil {
		return err
	}
	defer podH.Close()

	var problems []error
	mismatch := func(format string, args ...any) {
		problems = append(problems, fmt.Errorf("%w: "+format, append([]any{ErrMismatch}, args...)...))
	}

	checkLink := func(nh *netlink.Handle, name, where string) netlink.Link {
		l, err := linkByName(nh, name)
		if err != nil {
			problems = append(problems, err)
			return nil
		}
		if l == nil {
			problems = append(problems, fmt.Errorf("%w: %s link %s", ErrLinkNotFound, where, name))
			return nil
		}
		a := l.Attrs()
		if l.Type() != "veth" {
			mismatch("%s link %s is a %s, not a veth", where, name, l.Type())
		}
		if a.Flags&net.FlagUp == 0 {
			mismatch("%s link %s is down", where, name)
		}
		if a.MTU != s.MTU {
			mismatch("%s link %s has MTU %d, want %d", where, name, a.MTU, s.MTU)
		}
		return l
	}
	hostLink := checkLink(hostH, s.HostIfName, "host")
	podLink := checkLink(podH, s.IfName, "pod")

	if hostLink != nil {
		if cid, ifName, ok := parseHostAlias(hostLink.Attrs().Alias); !ok {
			mismatch("host link %s has alias %q, want %q", s.HostIfName, hostLink.Attrs().Alias, hostAlias(s.ContainerID, s.IfName))
		} else if cid != s.ContainerID || ifName != s.IfName {
			mismatch("host link %s belongs to container %s interface %s", s.HostIfName, cid, ifName)
		}
	}

	if hostLink != nil {
		v, err := readSysctl(hostNS, rpFilter(s.HostIfName))
		switch {
		case errors.Is(err, fs.ErrNotExist):
			// The link went away after it was looked up; a repeated
			// check reports it as missing.
		case err != nil:
			problems = append(problems, fmt.Errorf("read rp_filter of %s: %w", s.HostIfName, err))
		case v != "0":
			mismatch("host link %s has rp_filter %s, want 0", s.HostIfName, v)
		}
	}
	if hostLink != nil && podLink != nil {
		if hostLink.Attrs().ParentIndex != podLink.Attrs().Index || podLink.Attrs().ParentIndex != hostLink.Attrs().Index {
			mismatch("host link %s (peer ifindex %d) and pod link %s (ifindex %d) are not a veth pair",
				s.HostIfName, hostLink.Attrs().ParentIndex, s.IfName, podLink.Attrs().Index)
		}
	}
	if podLink == nil {
		return errors.Join(problems...)
	}
	if s.MAC != nil && podLink.Attrs().HardwareAddr.String() != s.MAC.String() {
		mismatch("pod link %s has MAC %s, want %s", s.IfName, podLink.Attrs().HardwareAddr, s.MAC)
	}

	podIdx := podLink.Attrs().Index
	addrs, err := retryDump(func() ([]netlink.Addr, error) { return podH.AddrList(podLink, netlink.FAMILY_V4) })
	if err != nil {
		problems = append(problems, fmt.Errorf("list addresses of pod link %s: %w", s.IfName, err))
	} else {
		want := hostNet(s.IPv4)
		found := false
		for _, a := range addrs {
			if a.IPNet != nil && a.IPNet.String() == want.String() {
				found = true
				break
			}
		}
		if !found {
			mismatch("pod link %s lacks address %s", s.IfName, &want)
		}
	}

	routes, err := retryDump(func() ([]netlink.Route, error) {
		return podH.RouteListFiltered(netlink.FAMILY_V4,
			&netlink.Route{LinkIndex: podIdx, Table: syscall.RT_TABLE_MAIN},
			netlink.RT_FILTER_OIF|netlink.RT_FILTER_TABLE)
	})
	if err != nil {
		problems = append(problems, fmt.Errorf("list routes of pod link %s: %w", s.IfName, err))
	} else {
		for _, want := range s.podRoutes() {
			if !hasRoute(routes, want) {
				mismatch("pod route %s dev %s missing", want, s.IfName)
			}
		}
	}
	return errors.Join(problems...)
}

// hasRoute reports whether routes holds want: same prefix, next hop and
// MTU, and scope link when want has no next hop.
func hasRoute(routes []netlink.Route, want Route) bool {
	for _, r := range routes {
		dst := "0.0.0.0/0"
		if r.Dst != nil {
			dst = r.Dst.String()
		}
		if dst != want.Dst.String() || r.MTU != want.MTU {
			continue
		}
		if want.Via == nil {
			if r.Gw == nil && r.Scope == netlink.SCOPE_LINK {
				return true
			}
		} else if want.Via.Equal(r.Gw) {
			return true
		}
	}
	return false
}
