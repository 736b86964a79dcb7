package link

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"syscall"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
)

// Host is the network namespace that holds the host side of endpoint links
// and the routes to pods. The zero Host is the namespace of the calling
// process, which is what the agent uses; the package-level functions act
// on it.
type Host struct {
	// NetnsPath is the path of the host namespace; empty means the
	// calling process's namespace.
	NetnsPath string

	// fail, set only by this package's tests, is called before each step
	// of SetupEndpoint; an error it returns fails that step.
	fail func(step string) error
}

func (h Host) open() (ns.NetNS, error) {
	path := h.NetnsPath
	if path == "" {
		path = selfNetnsPath
	}
	return openNetns(path)
}

// withHandle runs f with a netlink handle in the host namespace.
func (h Host) withHandle(f func(n ns.NetNS, nh *netlink.Handle) error) error {
	n, err := h.open()
	if err != nil {
		return err
	}
	defer n.Close()
	nh, err := newHandle(n)
	if err != nil {
		return err
	}
	defer nh.Close()
	return f(n, nh)
}

// SetupEndpoint is Host{}.SetupEndpoint: the host side goes into the
// calling process's namespace.
func SetupEndpoint(ctx context.Context, spec Spec) (Result, error) {
	return Host{}.SetupEndpoint(ctx, spec)
}

// RemoveEndpoint is Host{}.RemoveEndpoint.
func RemoveEndpoint(ctx context.Context, hostIfName, netnsPath string) error {
	return Host{}.RemoveEndpoint(ctx, hostIfName, netnsPath)
}

// CheckEndpoint is Host{}.CheckEndpoint.
func CheckEndpoint(ctx context.Context, spec Spec) error {
	return Host{}.CheckEndpoint(ctx, spec)
}

// ListHostInterfaces is Host{}.ListHostInterfaces.
func ListHostInterfaces() ([]HostLink, error) {
	return Host{}.ListHostInterfaces()
}

// EnsurePodRoute is Host{}.EnsurePodRoute.
func EnsurePodRoute(ctx context.Context, hostIfName string, podIP net.IP) error {
	return Host{}.EnsurePodRoute(ctx, hostIfName, podIP)
}

// DeletePodRoute is Host{}.DeletePodRoute.
func DeletePodRoute(ctx context.Context, hostIfName string, podIP net.IP) error {
	return Host{}.DeletePodRoute(ctx, hostIfName, podIP)
}

// ListHostInterfaces returns every link in the host namespace whose name
// starts with HostIfPrefix, made by this package or not, in ifindex order.
// The agent uses it on restore to find the links to keep and the orphans
// to remove.
//
// Errors: ErrNetnsNotFound for a missing host namespace; netlink errors.
func (h Host) ListHostInterfaces() ([]HostLink, error) {
	var out []HostLink
	err := h.withHandle(func(_ ns.NetNS, nh *netlink.Handle) error {
		links, err := retryDump(nh.LinkList)
		if err != nil {
			return err
		}
		for _, l := range links {
			a := l.Attrs()
			if !strings.HasPrefix(a.Name, HostIfPrefix) {
				continue
			}
			hl := HostLink{
				Name:        a.Name,
				Index:       a.Index,
				Kind:        l.Type(),
				MAC:         a.HardwareAddr,
				MTU:         a.MTU,
				Up:          a.Flags&net.FlagUp != 0,
				PeerIndex:   a.ParentIndex,
				PeerNetnsID: a.NetNsID,
			}
			if cid, ifName, ok := parseHostAlias(a.Alias); ok {
				hl.ContainerID, hl.IfName = cid, ifName
			}
			out = append(out, hl)
		}
		slices.SortFunc(out, func(a, b HostLink) int { return a.Index - b.Index })
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list host interfaces: %w", err)
	}
	return out, nil
}

// EnsurePodRoute makes the host route to podIP (/32, or /128 for IPv6)
// through the link hostIfName, scope link, in the main table, replacing
// any route to that prefix. Calling it again is harmless.
//
// Errors: ErrInvalidSpec for a bad name or address; ErrLinkNotFound when
// hostIfName does not exist; ErrNetnsNotFound for a missing host
// namespace; netlink errors.
func (h Host) EnsurePodRoute(ctx context.Context, hostIfName string, podIP net.IP) error {
	err := h.podRoute(ctx, hostIfName, podIP, func(nh *netlink.Handle, l netlink.Link, r *netlink.Route) error {
		if l == nil {
			return fmt.Errorf("%w: %s", ErrLinkNotFound, hostIfName)
		}
		return nh.RouteReplace(r)
	})
	if err != nil {
		return fmt.Errorf("ensure route to pod %s via %s: %w", podIP, hostIfName, err)
	}
	return nil
}

// DeletePodRoute removes the route EnsurePodRoute made. A missing route or
// a missing link (its routes went with it) is not an error.
//
// Errors: ErrInvalidSpec for a bad name or address; ErrNetnsNotFound for a
// missing host namespace; netlink errors.
func (h Host) DeletePodRoute(ctx context.Context, hostIfName string, podIP net.IP) error {
	err := h.podRoute(ctx, hostIfName, podIP, func(nh *netlink.Handle, l netlink.Link, r *netlink.Route) error {
		if l == nil {
			return nil
		}
		if err := nh.RouteDel(r); err != nil && !errors.Is(err, syscall.ESRCH) {
			return err
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("delete route to pod %s via %s: %w", podIP, hostIfName, err)
	}
	return nil
}

func (h Host) podRoute(ctx context.Context, hostIfName string, podIP net.IP,
	f func(nh *netlink.Handle, l netlink.Link, r *netlink.Route) error,
) error {
	if err := checkIfName(hostIfName); err != nil {
		return fmt.Errorf("%w: %v", ErrInvalidSpec, err)
	}
	if podIP.To16() == nil || podIP.IsUnspecified() {
		return fmt.Errorf("%w: pod address %q", ErrInvalidSpec, podIP)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	return h.withHandle(func(_ ns.NetNS, nh *netlink.Handle) error {
		l, err := linkByName(nh, hostIfName)
		if err != nil {
			return err
		}
		dst := hostNet(podIP)
		r := &netlink.Route{
			Dst:   &dst,
			Scope: netlink.SCOPE_LINK,
			Table: syscall.RT_TABLE_MAIN,
		}
		if l != nil {
			r.LinkIndex = l.Attrs().Index
		}
		return f(nh, l, r)
	})
}
