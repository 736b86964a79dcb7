package link

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"
	"syscall"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/cellium/cellium/datapath/netns"
)

// selfNetnsPath names the network namespace of the calling process.
const selfNetnsPath = netns.Self

// dumpAttempts bounds retries of netlink dumps that the kernel flags as
// interrupted (NLM_F_DUMP_INTR: links or routes changed during the dump,
// which happens all the time while other endpoints are being set up).
const dumpAttempts = 10

// openNetns opens the network namespace at path. A missing path, or a
// file that is not a network namespace, is ErrNetnsNotFound.
func openNetns(path string) (ns.NetNS, error) {
	n, err := ns.GetNS(path)
	if err == nil {
		return n, nil
	}
	var notExist ns.NSPathNotExistErr
	var notNS ns.NSPathNotNSErr
	if errors.As(err, &notExist) || errors.As(err, &notNS) || errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%w: %s: %v", ErrNetnsNotFound, path, err)
	}
	return nil, fmt.Errorf("open netns %s: %w", path, err)
}

// newHandle returns a netlink handle whose socket lives in n. The socket
// is created on a thread that ns.Do has locked and moved into n; ns.Do
// moves the thread back, and if that fails it keeps the thread locked so
// the runtime discards it instead of reusing it in the wrong namespace.
// The socket stays bound to n after the thread leaves.
func newHandle(n ns.NetNS) (*netlink.Handle, error) { return netns.NewHandleIn(n) }

// sysctl is one /proc/sys/net setting of a network namespace.
type sysctl struct {
	path  string // relative to /proc/sys, with '/' separators
	value string
	// optional settings are skipped when the file does not exist (IPv6
	// settings on a kernel booted with ipv6.disable=1).
	optional bool
}

func (s sysctl) String() string {
	return strings.ReplaceAll(s.path, "/", ".") + "=" + s.value
}

// writeSysctls applies settings inside n. /proc/sys/net shows the
// namespace of the thread that opens it, hence ns.Do.
func writeSysctls(n ns.NetNS, settings ...sysctl) error {
	return n.Do(func(ns.NetNS) error {
		for _, s := range settings {
			f, err := os.OpenFile("/proc/sys/"+s.path, os.O_WRONLY, 0)
			if err != nil {
				if s.optional && errors.Is(err, fs.ErrNotExist) {
					continue
				}
				return fmt.Errorf("sysctl %s: %w", s, err)
			}
			_, err = f.WriteString(s.value + "\n")
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return fmt.Errorf("sysctl %s: %w", s, err)
			}
		}
		return nil
	})
}

// readSysctl returns the value of a /proc/sys setting inside n, and
// fs.ErrNotExist (wrapped) when it does not exist.
func readSysctl(n ns.NetNS, path string) (string, error) {
	var v []byte
	err := n.Do(func(ns.NetNS) error {
		var err error
		v, err = os.ReadFile("/proc/sys/" + path)
		return err
	})
	return strings.TrimSpace(string(v)), err
}

func rpFilter(ifName string) string    { return "net/ipv4/conf/" + ifName + "/rp_filter" }
func disableIPv6(ifName string) string { return "net/ipv6/conf/" + ifName + "/disable_ipv6" }

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

func isLinkNotFound(err error) bool {
	var nf netlink.LinkNotFoundError
	return errors.As(err, &nf) || errors.Is(err, syscall.ENODEV)
}

// linkByName returns the link, or nil and no error when there is none.
func linkByName(h *netlink.Handle, name string) (netlink.Link, error) {
	l, err := h.LinkByName(name)
	if isLinkNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("look up link %s: %w", name, err)
	}
	return l, nil
}

// checkDistinct refuses a pod namespace that is the host namespace: setup
// deletes whatever link in the pod has the pod interface's name, which
// there would be a node interface (a hostNetwork pod sent to the CNI by
// mistake, a wrong path).
func checkDistinct(host, pod ns.NetNS) error {
	var hs, ps syscall.Stat_t
	if err := syscall.Fstat(int(host.Fd()), &hs); err != nil {
		return fmt.Errorf("stat netns %s: %w", host.Path(), err)
	}
	if err := syscall.Fstat(int(pod.Fd()), &ps); err != nil {
		return fmt.Errorf("stat netns %s: %w", pod.Path(), err)
	}
	if hs.Dev == ps.Dev && hs.Ino == ps.Ino {
		return fmt.Errorf("%w: pod netns %s is the host network namespace", ErrInvalidSpec, pod.Path())
	}
	return nil
}
