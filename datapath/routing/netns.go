package routing

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"syscall"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
)

// dumpAttempts bounds retries of dumps the kernel flags as interrupted.
const dumpAttempts = 10

// Netns is the network namespace the operations act on: the node's.
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

// handle runs f with a netlink handle whose socket lives in n.
func (n Netns) handle(f func(h *netlink.Handle) error) error {
	nsh, err := ns.GetNS(n.path())
	if err != nil {
		return fmt.Errorf("open netns %s: %w", n.path(), err)
	}
	defer nsh.Close()
	var h *netlink.Handle
	err = nsh.Do(func(ns.NetNS) error {
		var err error
		h, err = netlink.NewHandle(syscall.NETLINK_ROUTE)
		return err
	})
	if err != nil {
		return fmt.Errorf("netlink handle in %s: %w", n.path(), err)
	}
	defer h.Close()
	return f(h)
}

// do runs f on a thread inside n (for /proc/sys/net, which shows the
// namespace of the thread that opens it).
func (n Netns) do(f func() error) error {
	nsh, err := ns.GetNS(n.path())
	if err != nil {
		return fmt.Errorf("open netns %s: %w", n.path(), err)
	}
	defer nsh.Close()
	return nsh.Do(func(ns.NetNS) error { return f() })
}

// writeSysctl writes value to /proc/sys/<path> in n, unless it already
// reads value.
func (n Netns) writeSysctl(path, value string) error {
	return n.do(func() error {
		file := "/proc/sys/" + path
		if cur, err := os.ReadFile(file); err == nil && strings.TrimSpace(string(cur)) == value {
			return nil
		}
		return os.WriteFile(file, []byte(value+"\n"), 0)
	})
}

// retryDump calls f until its result is not flagged as interrupted.
func retryDump[T any](f func() (T, error)) (T, error) {
	var v T
	var err error
	for range dumpAttempts {
		v, err = f()
		if !errors.Is(err, netlink.ErrDumpInterrupted) {
			return v, err
		}
	}
	return v, fmt.Errorf("netlink dump interrupted %d times in a row: %w", dumpAttempts, err)
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
