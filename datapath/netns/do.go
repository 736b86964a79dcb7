package netns

import (
	"fmt"
	"syscall"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
)

// Self names the network namespace of the calling process (of its main
// thread, which Go never moves).
const Self = "/proc/self/ns/net"

// orSelf is path, or Self when path is empty.
func orSelf(path string) string {
	if path == "" {
		return Self
	}
	return path
}

// Do runs f on a locked OS thread inside the namespace at path ("" is the
// calling process's): for what the kernel resolves in the calling thread's
// namespace (/proc/sys/net, an ifindex given to a tcx attach). The thread
// returns to its namespace afterwards; if it cannot, it stays locked, so
// that the runtime discards it.
func Do(path string, f func() error) error {
	path = orSelf(path)
	n, err := ns.GetNS(path)
	if err != nil {
		return fmt.Errorf("open netns %s: %w", path, err)
	}
	defer n.Close()
	return n.Do(func(ns.NetNS) error { return f() })
}

// NewHandleIn returns a netlink handle whose socket lives in n; the caller
// closes it. The socket is created on a thread inside n and stays bound
// to n after the thread leaves, so the handle may be used from any
// goroutine.
func NewHandleIn(n ns.NetNS) (*netlink.Handle, error) {
	var h *netlink.Handle
	err := n.Do(func(ns.NetNS) error {
		var err error
		h, err = netlink.NewHandle(syscall.NETLINK_ROUTE)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("netlink handle in %s: %w", n.Path(), err)
	}
	return h, nil
}

// WithHandle runs f with a netlink handle whose socket lives in the
// namespace at path ("" is the calling process's).
func WithHandle(path string, f func(h *netlink.Handle) error) error {
	path = orSelf(path)
	n, err := ns.GetNS(path)
	if err != nil {
		return fmt.Errorf("open netns %s: %w", path, err)
	}
	defer n.Close()
	h, err := NewHandleIn(n)
	if err != nil {
		return err
	}
	defer h.Close()
	return f(h)
}

// DoWithHandle is Do with a netlink handle of the namespace: f runs on
// the thread inside it.
func DoWithHandle(path string, f func(h *netlink.Handle) error) error {
	path = orSelf(path)
	return Do(path, func() error {
		h, err := netlink.NewHandle(syscall.NETLINK_ROUTE)
		if err != nil {
			return fmt.Errorf("netlink handle in %s: %w", path, err)
		}
		defer h.Close()
		return f(h)
	})
}
