package loader

import (
	"errors"
	"fmt"
	"syscall"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
)

// Netns is the network namespace of the host veths: the node's.
type Netns struct {
	// Path names the namespace; empty is the calling process's.
	Path string
}

func (n Netns) path() string {
	if n.Path == "" {
		return "/proc/self/ns/net"
	}
	return n.Path
}

// do runs f on a thread inside n with a netlink handle there: attaching a
// tcx link names its device by ifindex, which the kernel resolves in the
// calling thread's namespace.
func (n Netns) do(f func(h *netlink.Handle) error) error {
	nsh, err := ns.GetNS(n.path())
	if err != nil {
		return fmt.Errorf("open netns %s: %w", n.path(), err)
	}
	defer nsh.Close()
	return nsh.Do(func(ns.NetNS) error {
		h, err := netlink.NewHandle(syscall.NETLINK_ROUTE)
		if err != nil {
			return fmt.Errorf("netlink handle in %s: %w", n.path(), err)
		}
		defer h.Close()
		return f(h)
	})
}

// linkByName returns the link called name, or nil when there is none.
func linkByName(h *netlink.Handle, name string) (netlink.Link, error) {
	l, err := h.LinkByName(name)
	var nf netlink.LinkNotFoundError
	if errors.As(err, &nf) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("look up link %s: %w", name, err)
	}
	return l, nil
}
