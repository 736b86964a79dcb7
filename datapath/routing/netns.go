package routing

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/vishvananda/netlink"

	"github.com/cellium/cellium/datapath/netns"
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
		return netns.Self
	}
	return n.Path
}

// handle runs f with a netlink handle whose socket lives in n.
func (n Netns) handle(f func(h *netlink.Handle) error) error { return netns.WithHandle(n.Path, f) }

// do runs f on a thread inside n (for /proc/sys/net, which shows the
// namespace of the thread that opens it).
func (n Netns) do(f func() error) error { return netns.Do(n.Path, f) }

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
