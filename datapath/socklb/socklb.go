// Package socklb attaches the socket load balancer's cgroup programs
// (bpf/sock.c) to the cgroup v2 root and detaches them. The attachments
// are BPF links pinned in a directory on bpffs, so that they outlive the
// agent: a restarted agent finds the pins and swaps the programs in place
// (no moment without translation), and turning the feature off removes the
// pins, which detaches the programs.
package socklb

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/cellium/cellium/datapath/bpf"
	"github.com/cellium/cellium/datapath/maps"
)

// Program is one cgroup program and where it attaches.
type Program struct {
	Name   string
	Attach ebpf.AttachType
}

// Programs are the socket load balancer's programs; each link is pinned
// under its Name. The cil_sock6 ones serve dual-stack AF_INET6 sockets
// and frontends written IPv4-mapped; there is no sendmsg6 program, as the
// kernel runs sendmsg4 for a v4-mapped destination (bpf/sock.c).
var Programs = []Program{
	{bpf.SockProgCilSock4Connect, ebpf.AttachCGroupInet4Connect},
	{bpf.SockProgCilSock4Sendmsg, ebpf.AttachCGroupUDP4Sendmsg},
	{bpf.SockProgCilSock4Recvmsg, ebpf.AttachCGroupUDP4Recvmsg},
	{bpf.SockProgCilSock4Getpeername, ebpf.AttachCgroupInet4GetPeername},
	{bpf.SockProgCilSock6Connect, ebpf.AttachCGroupInet6Connect},
	{bpf.SockProgCilSock6Recvmsg, ebpf.AttachCGroupUDP6Recvmsg},
	{bpf.SockProgCilSock6Getpeername, ebpf.AttachCgroupInet6GetPeername},
}

// IsCgroup2 reports whether path is the mount of a cgroup v2 hierarchy.
func IsCgroup2(path string) (bool, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return false, fmt.Errorf("statfs %s: %w", path, err)
	}
	return st.Type == unix.CGROUP2_SUPER_MAGIC, nil
}

// EnsureCgroup2 makes path a cgroup v2 mount: it creates the directory if
// missing and mounts cgroup2 there unless it already is one (as Cilium does
// with /run/cilium/cgroupv2). The root of a cgroup2 mount is the root of
// the one cgroup v2 hierarchy of the machine, wherever it is mounted. It
// reports whether it mounted. Needs root to mount.
func EnsureCgroup2(path string) (mounted bool, err error) {
	if err := os.MkdirAll(path, 0o755); err != nil {
		return false, fmt.Errorf("create cgroup2 mount point: %w", err)
	}
	ok, err := IsCgroup2(path)
	if err != nil || ok {
		return false, err
	}
	if err := unix.Mount("none", path, "cgroup2", 0, ""); err != nil {
		return false, fmt.Errorf("mount cgroup2 at %s: %w", path, err)
	}
	return true, nil
}

// Attach loads the programs with the maps m and attaches each to the
// cgroup v2 hierarchy mounted at cgroupRoot, pinning its link in linkDir
// (a bpffs directory, created if missing). A link already pinned there
// gets the new program in place (link update); a pin that cannot be
// updated is replaced by a new attachment. A program without a pin yet
// (an agent upgraded from one without it) is attached; a pin in linkDir
// that is none of Programs (left by another version of the agent) is
// removed, which detaches its program.
func Attach(m *maps.LBMaps, cgroupRoot, linkDir string) error {
	return AttachWith(m, cgroupRoot, linkDir, Options{})
}

// Options are the programs' load-time settings.
type Options struct {
	// HostNetnsCookie is the cookie of the node's host network namespace
	// (NetnsCookie of the agent's): there, 127.0.0.1:nodePort reaches a
	// NodePort. 0 stands for the machine's initial namespace.
	HostNetnsCookie uint64
}

// NetnsCookie returns the cookie of the calling thread's network
// namespace (SO_NETNS_COOKIE, Linux 5.14+).
func NetnsCookie() (uint64, error) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return 0, fmt.Errorf("netns cookie: %w", err)
	}
	defer unix.Close(fd)
	c, err := unix.GetsockoptUint64(fd, unix.SOL_SOCKET, unix.SO_NETNS_COOKIE)
	if err != nil {
		return 0, fmt.Errorf("netns cookie (SO_NETNS_COOKIE): %w", err)
	}
	return c, nil
}

// AttachWith is Attach with load-time options.
func AttachWith(m *maps.LBMaps, cgroupRoot, linkDir string, o Options) error {
	ok, err := IsCgroup2(cgroupRoot)
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("%s is not a cgroup2 mount", cgroupRoot)
	}
	spec, err := bpf.LoadSock()
	if err != nil {
		return fmt.Errorf("load embedded socket LB object: %w", err)
	}
	if err := spec.Variables[bpf.SockVarHOST_NETNS_COOKIE].Set(o.HostNetnsCookie); err != nil {
		return fmt.Errorf("set the host netns cookie: %w", err)
	}
	repl := m.Replacements()
	maps.FitReplacements(spec, repl)
	coll, err := ebpf.NewCollectionWithOptions(spec, ebpf.CollectionOptions{MapReplacements: repl})
	if err != nil {
		return fmt.Errorf("load the socket LB programs: %w", err)
	}
	// The links hold the programs; the collection's descriptors go.
	defer coll.Close()
	if err := os.MkdirAll(linkDir, 0o700); err != nil {
		return fmt.Errorf("create link directory: %w", err)
	}
	for _, p := range Programs {
		prog := coll.Programs[p.Name]
		if prog == nil {
			return fmt.Errorf("socket LB object has no program %s", p.Name)
		}
		if err := attachOne(prog, p, cgroupRoot, filepath.Join(linkDir, p.Name)); err != nil {
			return err
		}
	}
	return removePins(linkDir, true)
}

// removePins removes the pins in linkDir, only those that are none of
// Programs if unknownOnly. A missing linkDir has none.
func removePins(linkDir string, unknownOnly bool) error {
	entries, err := os.ReadDir(linkDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("list the link pins: %w", err)
	}
	var errs []error
	for _, e := range entries {
		if unknownOnly && slices.ContainsFunc(Programs, func(p Program) bool { return p.Name == e.Name() }) {
			continue
		}
		pin := filepath.Join(linkDir, e.Name())
		// Detached now, not when the kernel frees the unpinned link
		// (deferred: a connect right after would still be translated).
		if l, err := link.LoadPinnedLink(pin, nil); err == nil {
			if err := l.Detach(); err != nil && !errors.Is(err, ebpf.ErrNotSupported) {
				errs = append(errs, fmt.Errorf("detach %s: %w", pin, err))
			}
			_ = l.Close()
		}
		if err := os.Remove(pin); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("unpin %s: %w", pin, err))
		}
	}
	return errors.Join(errs...)
}

func attachOne(prog *ebpf.Program, p Program, cgroupRoot, pin string) error {
	if l, err := link.LoadPinnedLink(pin, nil); err == nil {
		err = l.Update(prog)
		if err == nil {
			return l.Close()
		}
		// Not updatable (another attach type, a kernel that lost it):
		// detach it and attach anew.
		_ = l.Unpin()
		_ = l.Close()
	} else if !errors.Is(err, os.ErrNotExist) {
		if rmErr := os.Remove(pin); rmErr != nil && !errors.Is(rmErr, os.ErrNotExist) {
			return fmt.Errorf("replace unreadable link pin %s: %w", pin, errors.Join(err, rmErr))
		}
	}
	l, err := link.AttachCgroup(link.CgroupOptions{Path: cgroupRoot, Attach: p.Attach, Program: prog})
	if err != nil {
		return fmt.Errorf("attach %s to %s: %w", p.Name, cgroupRoot, err)
	}
	if err := l.Pin(pin); err != nil {
		_ = l.Close()
		return fmt.Errorf("pin the link of %s at %s: %w", p.Name, pin, err)
	}
	return l.Close()
}

// Detach removes the pinned links in linkDir, which detaches the programs,
// then the directory. Every pin there goes, also one that is none of
// Programs (left by another version of the agent). Missing pins are not
// an error.
func Detach(linkDir string) error {
	if err := removePins(linkDir, false); err != nil {
		return err
	}
	if err := os.Remove(linkDir); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove %s: %w", linkDir, err)
	}
	return nil
}

// Attached returns the names of the programs whose links are pinned in
// linkDir.
func Attached(linkDir string) ([]string, error) {
	var out []string
	for _, p := range Programs {
		if _, err := os.Stat(filepath.Join(linkDir, p.Name)); err == nil {
			out = append(out, p.Name)
		} else if !errors.Is(err, os.ErrNotExist) {
			return nil, err
		}
	}
	return out, nil
}
