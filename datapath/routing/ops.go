package routing

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"net"
	"net/netip"
	"syscall"

	"github.com/cilium/statedb"
	"github.com/vishvananda/netlink"

	"github.com/cellium/cellium/statedb/reconciler"
	"github.com/cellium/cellium/statedb/routes"
)

// deviceAlias labels the devices the agent made, so that pruning removes
// only those.
const deviceAlias = "cellium-host-device"

// ErrLinkNotFound is returned by RouteOps.Update when the route's device
// does not exist (yet); the reconciler retries.
var ErrLinkNotFound = errors.New("link not found")

// RouteOps reconciles the routes table into the main routing table of its
// namespace. Every route it writes carries routes.Protocol; Prune deletes
// only routes with that protocol.
type RouteOps struct{ Netns Netns }

func (o RouteOps) route(h *netlink.Handle, r *routes.Route, needLink bool) (*netlink.Route, error) {
	dst := net.IPNet{IP: r.Prefix.Addr().AsSlice(), Mask: net.CIDRMask(r.Prefix.Bits(), r.Prefix.Addr().BitLen())}
	nr := &netlink.Route{
		Dst: &dst, Scope: netlink.SCOPE_LINK, Table: syscall.RT_TABLE_MAIN,
		Protocol: netlink.RouteProtocol(routes.Protocol),
	}
	if r.Gateway.IsValid() {
		// A direct route to another node's pod CIDR: the kernel finds
		// the device that reaches the gateway.
		nr.Scope = netlink.SCOPE_UNIVERSE
		nr.Gw = r.Gateway.AsSlice()
		return nr, nil
	}
	l, err := linkByName(h, r.Device)
	if err != nil {
		return nil, err
	}
	if l == nil {
		if needLink {
			return nil, fmt.Errorf("%w: %s", ErrLinkNotFound, r.Device)
		}
		return nil, nil
	}
	nr.LinkIndex = l.Attrs().Index
	return nr, nil
}

// Update implements reconciler.Operations: it replaces the route to
// r.Prefix with one through r.Device.
func (o RouteOps) Update(_ context.Context, _ statedb.ReadTxn, r *routes.Route) error {
	return o.Netns.handle(func(h *netlink.Handle) error { return o.update(h, r) })
}

func (o RouteOps) update(h *netlink.Handle, r *routes.Route) error {
	nr, err := o.route(h, r, true)
	if err == nil {
		err = h.RouteReplace(nr)
	}
	if err != nil {
		if r.Gateway.IsValid() {
			return fmt.Errorf("route %s via %s: %w", r.Prefix, r.Gateway, err)
		}
		return fmt.Errorf("route %s dev %s: %w", r.Prefix, r.Device, err)
	}
	return nil
}

// UpdateBatch implements reconciler.BatchOperations: Update of every
// entry over one netlink handle.
func (o RouteOps) UpdateBatch(_ context.Context, _ statedb.ReadTxn, batch []reconciler.BatchEntry[*routes.Route]) {
	err := o.Netns.handle(func(h *netlink.Handle) error {
		for i := range batch {
			batch[i].Result = o.update(h, batch[i].Object)
		}
		return nil
	})
	setAll(batch, err)
}

// DeleteBatch implements reconciler.BatchOperations: Delete of every
// entry, with one listing of the agent's routes.
func (o RouteOps) DeleteBatch(_ context.Context, _ statedb.ReadTxn, batch []reconciler.BatchEntry[*routes.Route]) {
	err := o.Netns.handle(func(h *netlink.Handle) error {
		owned, err := o.list(h)
		if err != nil {
			return fmt.Errorf("list routes: %w", err)
		}
		byDst := map[string][]netlink.Route{}
		for _, nr := range owned {
			if nr.Dst != nil {
				byDst[nr.Dst.String()] = append(byDst[nr.Dst.String()], nr)
			}
		}
		for i := range batch {
			for _, nr := range byDst[batch[i].Object.Prefix.String()] {
				if err := h.RouteDel(&nr); err != nil && !errors.Is(err, syscall.ESRCH) {
					batch[i].Result = fmt.Errorf("delete route %s: %w", batch[i].Object.Prefix, err)
				}
			}
		}
		return nil
	})
	setAll(batch, err)
}

// setAll gives every entry err when the batch as a whole failed.
func setAll[T any](batch []reconciler.BatchEntry[T], err error) {
	if err == nil {
		return
	}
	for i := range batch {
		batch[i].Result = err
	}
}

// Delete implements reconciler.Operations: it removes the route to
// r.Prefix if it is the agent's. A missing route or device is not an
// error (deleting a veth removes its routes).
func (o RouteOps) Delete(_ context.Context, _ statedb.ReadTxn, r *routes.Route) error {
	err := o.Netns.handle(func(h *netlink.Handle) error {
		owned, err := o.list(h)
		if err != nil {
			return err
		}
		for _, nr := range owned {
			if nr.Dst != nil && nr.Dst.String() == r.Prefix.String() {
				if err := h.RouteDel(&nr); err != nil && !errors.Is(err, syscall.ESRCH) {
					return err
				}
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("delete route %s: %w", r.Prefix, err)
	}
	return nil
}

// list returns the routes of the main table with the agent's protocol.
func (o RouteOps) list(h *netlink.Handle) ([]netlink.Route, error) {
	return retryDump(func() ([]netlink.Route, error) {
		return h.RouteListFiltered(netlink.FAMILY_V4,
			&netlink.Route{Table: syscall.RT_TABLE_MAIN, Protocol: netlink.RouteProtocol(routes.Protocol)},
			netlink.RT_FILTER_TABLE|netlink.RT_FILTER_PROTOCOL)
	})
}

// Prune implements reconciler.Operations: it lists the agent's routes,
// then deletes those whose prefix is not desired or that go through
// another device than desired.
func (o RouteOps) Prune(_ context.Context, _ statedb.ReadTxn, desired iter.Seq2[*routes.Route, statedb.Revision]) error {
	return o.Netns.handle(func(h *netlink.Handle) error {
		owned, err := o.list(h)
		if err != nil {
			return fmt.Errorf("list routes: %w", err)
		}
		want := map[netip.Prefix]*routes.Route{}
		for r := range desired {
			want[r.Prefix] = r
		}
		var errs []error
		for _, nr := range owned {
			if nr.Dst == nil {
				continue
			}
			p, ok := netipPrefix(nr.Dst)
			if r, desired := want[p]; ok && desired {
				if r.Gateway.IsValid() {
					if gw, gok := netip.AddrFromSlice(nr.Gw); gok && gw.Unmap() == r.Gateway {
						continue
					}
				} else if l, err := h.LinkByIndex(nr.LinkIndex); err == nil && l.Attrs().Name == r.Device {
					continue
				}
			}
			if err := h.RouteDel(&nr); err != nil && !errors.Is(err, syscall.ESRCH) {
				errs = append(errs, fmt.Errorf("delete route %s: %w", nr.Dst, err))
			}
		}
		return errors.Join(errs...)
	})
}

func netipPrefix(n *net.IPNet) (netip.Prefix, bool) {
	a, ok := netip.AddrFromSlice(n.IP)
	if !ok {
		return netip.Prefix{}, false
	}
	ones, _ := n.Mask.Size()
	return netip.PrefixFrom(a.Unmap(), ones), true
}

// DeviceOps reconciles the devices table: each device is a veth pair
// Name/Peer, labelled as the agent's, both ends up, with exactly the
// desired addresses on Name.
type DeviceOps struct{ Netns Netns }

// Update implements reconciler.Operations.
func (o DeviceOps) Update(_ context.Context, _ statedb.ReadTxn, d *routes.Device) error {
	if d.Kind == routes.KindVXLAN {
		if err := o.Netns.handle(func(h *netlink.Handle) error { return updateVXLAN(h, d) }); err != nil {
			return fmt.Errorf("device %s: %w", d.Name, err)
		}
		return nil
	}
	err := o.Netns.handle(func(h *netlink.Handle) error {
		l, err := linkByName(h, d.Name)
		if err != nil {
			return err
		}
		if l != nil && l.Type() != "veth" {
			return fmt.Errorf("%s exists and is a %s, not a veth: delete it or stop whatever made it", d.Name, l.Type())
		}
		if l == nil {
			// A peer left without its pair (half-deleted) blocks the
			// creation: remove it.
			if stray, err := linkByName(h, d.Peer); err != nil {
				return err
			} else if stray != nil && stray.Type() == "veth" {
				if err := h.LinkDel(stray); err != nil {
					return fmt.Errorf("remove stray %s: %w", d.Peer, err)
				}
			}
			veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: d.Name, TxQLen: 1000}, PeerName: d.Peer}
			if err := h.LinkAdd(veth); err != nil {
				return fmt.Errorf("create veth %s/%s: %w", d.Name, d.Peer, err)
			}
			if l, err = h.LinkByName(d.Name); err != nil {
				return err
			}
		}
		if l.Attrs().Alias != deviceAlias {
			if err := h.LinkSetAlias(l, deviceAlias); err != nil {
				return fmt.Errorf("label %s: %w", d.Name, err)
			}
		}
		peer, err := linkByName(h, d.Peer)
		if err != nil {
			return err
		}
		if peer == nil {
			return fmt.Errorf("%w: veth peer %s of %s", ErrLinkNotFound, d.Peer, d.Name)
		}
		for _, x := range []netlink.Link{peer, l} {
			if x.Attrs().Flags&net.FlagUp == 0 {
				if err := h.LinkSetUp(x); err != nil {
					return fmt.Errorf("set %s up: %w", x.Attrs().Name, err)
				}
			}
		}
		return syncAddrs(h, l, d.Addrs)
	})
	if err != nil {
		return fmt.Errorf("device %s: %w", d.Name, err)
	}
	return nil
}

// syncAddrs makes l's IPv4 addresses exactly want.
func syncAddrs(h *netlink.Handle, l netlink.Link, want []netip.Prefix) error {
	have, err := retryDump(func() ([]netlink.Addr, error) { return h.AddrList(l, netlink.FAMILY_V4) })
	if err != nil {
		return fmt.Errorf("list addresses: %w", err)
	}
	wanted := map[string]bool{}
	for _, p := range want {
		wanted[p.String()] = true
	}
	present := map[string]bool{}
	for _, a := range have {
		s := a.IPNet.String()
		if wanted[s] {
			present[s] = true
			continue
		}
		if err := h.AddrDel(l, &a); err != nil && !errors.Is(err, syscall.EADDRNOTAVAIL) {
			return fmt.Errorf("remove address %s: %w", s, err)
		}
	}
	for _, p := range want {
		if present[p.String()] {
			continue
		}
		ipn := &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
		if err := h.AddrReplace(l, &netlink.Addr{IPNet: ipn}); err != nil {
			return fmt.Errorf("add address %s: %w", p, err)
		}
	}
	return nil
}

// Delete implements reconciler.Operations: it deletes the pair if it is
// the agent's.
func (o DeviceOps) Delete(_ context.Context, _ statedb.ReadTxn, d *routes.Device) error {
	err := o.Netns.handle(func(h *netlink.Handle) error { return deleteOwned(h, d.Name) })
	if err != nil {
		return fmt.Errorf("delete device %s: %w", d.Name, err)
	}
	return nil
}

func deleteOwned(h *netlink.Handle, name string) error {
	l, err := linkByName(h, name)
	if err != nil || l == nil {
		return err
	}
	if l.Attrs().Alias != deviceAlias {
		return nil // not ours
	}
	var nf netlink.LinkNotFoundError
	if err := h.LinkDel(l); err != nil && !errors.As(err, &nf) {
		return err
	}
	return nil
}

// Prune implements reconciler.Operations: it deletes the devices the
// agent made that are not desired any more.
func (o DeviceOps) Prune(_ context.Context, _ statedb.ReadTxn, desired iter.Seq2[*routes.Device, statedb.Revision]) error {
	return o.Netns.handle(func(h *netlink.Handle) error {
		links, err := retryDump(h.LinkList)
		if err != nil {
			return fmt.Errorf("list links: %w", err)
		}
		want := map[string]bool{}
		for d := range desired {
			want[d.Name], want[d.Peer] = true, true
		}
		var errs []error
		for _, l := range links {
			a := l.Attrs()
			if a.Alias != deviceAlias || want[a.Name] {
				continue
			}
			if err := deleteOwned(h, a.Name); err != nil {
				errs = append(errs, fmt.Errorf("delete device %s: %w", a.Name, err))
			}
		}
		return errors.Join(errs...)
	})
}

// SysctlOps reconciles the sysctls table: it writes each value. Settings
// are not undone when the row goes (the previous value is unknown), and
// Prune does nothing.
type SysctlOps struct{ Netns Netns }

// Update implements reconciler.Operations.
func (o SysctlOps) Update(_ context.Context, _ statedb.ReadTxn, s *routes.Sysctl) error {
	if err := o.Netns.writeSysctl(s.Path(), s.Value); err != nil {
		return fmt.Errorf("sysctl %s=%s: %w", s.Name, s.Value, err)
	}
	return nil
}

// Delete implements reconciler.Operations; it leaves the setting as is.
func (SysctlOps) Delete(context.Context, statedb.ReadTxn, *routes.Sysctl) error { return nil }

// Prune implements reconciler.Operations; nothing to prune.
func (SysctlOps) Prune(context.Context, statedb.ReadTxn, iter.Seq2[*routes.Sysctl, statedb.Revision]) error {
	return nil
}

// updateVXLAN makes d's VXLAN device: external (collect metadata) on UDP
// d.Port, d.MTU, ARP off (the kernel never resolves a neighbour on it: the
// programs set each packet's tunnel key), labelled as the agent's, up. A
// device of that name with another port or not external is made again; a
// device of another type, or a VXLAN device not labelled as the agent's,
// is an error.
func updateVXLAN(h *netlink.Handle, d *routes.Device) error {
	l, err := linkByName(h, d.Name)
	if err != nil {
		return err
	}
	if l != nil {
		vx, ok := l.(*netlink.Vxlan)
		if !ok {
			return fmt.Errorf("%s exists and is a %s, not a vxlan device: delete it or stop whatever made it", d.Name, l.Type())
		}
		if vx.Attrs().Alias != deviceAlias {
			return fmt.Errorf("%s exists and was not made by cellium: delete it (ip link del %s) or stop whatever made it", d.Name, d.Name)
		}
		if !vx.FlowBased || vx.Port != d.Port {
			if err := h.LinkDel(l); err != nil {
				return fmt.Errorf("remove %s to make it again (port %d, external): %w", d.Name, d.Port, err)
			}
			l = nil
		}
	}
	if l == nil {
		vx := &netlink.Vxlan{LinkAttrs: netlink.LinkAttrs{Name: d.Name, MTU: d.MTU}, FlowBased: true, Port: d.Port}
		if err := h.LinkAdd(vx); err != nil {
			if errors.Is(err, syscall.EADDRINUSE) || errors.Is(err, syscall.EEXIST) {
				return fmt.Errorf("create vxlan device %s on UDP port %d: %w (another VXLAN device uses the port: choose another --tunnel-port or remove it)", d.Name, d.Port, err)
			}
			return fmt.Errorf("create vxlan device %s on UDP port %d: %w", d.Name, d.Port, err)
		}
		if l, err = h.LinkByName(d.Name); err != nil {
			return err
		}
	}
	a := l.Attrs()
	if a.Alias != deviceAlias {
		if err := h.LinkSetAlias(l, deviceAlias); err != nil {
			return fmt.Errorf("label %s: %w", d.Name, err)
		}
	}
	if d.MTU > 0 && a.MTU != d.MTU {
		if err := h.LinkSetMTU(l, d.MTU); err != nil {
			return fmt.Errorf("set %s MTU %d: %w", d.Name, d.MTU, err)
		}
	}
	if a.RawFlags&syscall.IFF_NOARP == 0 {
		if err := h.LinkSetARPOff(l); err != nil {
			return fmt.Errorf("set %s arp off: %w", d.Name, err)
		}
	}
	if a.Flags&net.FlagUp == 0 {
		if err := h.LinkSetUp(l); err != nil {
			return fmt.Errorf("set %s up: %w", d.Name, err)
		}
	}
	return nil
}
