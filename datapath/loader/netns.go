package loader

import (
	"errors"
	"fmt"

	"github.com/vishvananda/netlink"

	"github.com/cellium/cellium/datapath/netns"
)

// Netns is the network namespace of the host veths: the node's.
type Netns struct {
	// Path names the namespace; empty is the calling process's.
	Path string
}

// do runs f on a thread inside n with a netlink handle there: attaching a
// tcx link names its device by ifindex, which the kernel resolves in the
// calling thread's namespace.
func (n Netns) do(f func(h *netlink.Handle) error) error { return netns.DoWithHandle(n.Path, f) }

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
