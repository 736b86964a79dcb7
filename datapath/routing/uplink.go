package routing

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/vishvananda/netlink"
)

// Uplink is the node's device towards the other nodes.
type Uplink struct {
	// Name is the device's name and MTU its MTU.
	Name string
	MTU  int
	// Subnets are its IPv4 subnets: nodes with an address in one of them
	// are on the same L2 segment (native routing's direct routes).
	Subnets []netip.Prefix
}

// ErrNoUplink is returned by DetectUplink when no device qualifies.
var ErrNoUplink = errors.New("no uplink device found")

// DetectUplink finds the uplink in n: the first of devices when the user
// named them (--devices), else the device holding nodeIP (the node's
// InternalIP: a node whose namespace has no default route still has it),
// else the device of the IPv4 default route.
func DetectUplink(n Netns, devices []string, nodeIP netip.Addr) (Uplink, error) {
	var up Uplink
	err := n.handle(func(h *netlink.Handle) error {
		var l netlink.Link
		switch {
		case len(devices) > 0:
			var err error
			if l, err = linkByName(h, devices[0]); err != nil {
				return err
			}
			if l == nil {
				return fmt.Errorf("%w: --devices names %s, which does not exist", ErrNoUplink, devices[0])
			}
		default:
			if nodeIP.Is4() {
				addrs, err := retryDump(func() ([]netlink.Addr, error) { return h.AddrList(nil, netlink.FAMILY_V4) })
				if err != nil {
					return fmt.Errorf("list addresses: %w", err)
				}
				for _, a := range addrs {
					if ip, ok := netip.AddrFromSlice(a.IP); ok && ip.Unmap() == nodeIP {
						if l, err = h.LinkByIndex(a.LinkIndex); err != nil {
							return fmt.Errorf("link of %s: %w", nodeIP, err)
						}
						break
					}
				}
			}
			if l == nil {
				rs, err := retryDump(func() ([]netlink.Route, error) { return h.RouteList(nil, netlink.FAMILY_V4) })
				if err != nil {
					return fmt.Errorf("list routes: %w", err)
				}
				for _, r := range rs {
					if (r.Dst == nil || r.Dst.IP.IsUnspecified()) && r.LinkIndex > 0 {
						if l, err = h.LinkByIndex(r.LinkIndex); err != nil {
							return fmt.Errorf("link of the default route: %w", err)
						}
						break
					}
				}
			}
			if l == nil {
				return fmt.Errorf("%w: no device holds the node IP %v and there is no default route; name it with --devices", ErrNoUplink, nodeIP)
			}
		}
		up.Name, up.MTU = l.Attrs().Name, l.Attrs().MTU
		addrs, err := retryDump(func() ([]netlink.Addr, error) { return h.AddrList(l, netlink.FAMILY_V4) })
		if err != nil {
			return fmt.Errorf("list addresses of %s: %w", up.Name, err)
		}
		for _, a := range addrs {
			if ip, ok := netip.AddrFromSlice(a.IP); ok {
				ones, _ := a.Mask.Size()
				up.Subnets = append(up.Subnets, netip.PrefixFrom(ip.Unmap(), ones).Masked())
			}
		}
		return nil
	})
	return up, err
}

// SameSubnet reports whether ip is in one of u's subnets.
func (u Uplink) SameSubnet(ip netip.Addr) bool {
	for _, p := range u.Subnets {
		if p.Contains(ip) {
			return true
		}
	}
	return false
}
