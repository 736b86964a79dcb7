package realnode

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// nodeLink puts ip/32 on the host end of a veth pair named name and
// name's peer, both up: a local address the kubelet accepts as the node's
// IP (it refuses loopback addresses; this kernel has no dummy device).
// Packets to it never leave the machine.
func nodeLink(name, peer string, ip netip.Addr) error {
	la := netlink.NewLinkAttrs()
	la.Name = name
	veth := &netlink.Veth{LinkAttrs: la, PeerName: peer}
	if err := netlink.LinkAdd(veth); err != nil {
		return fmt.Errorf("node link %s: %w", name, err)
	}
	l, err := netlink.LinkByName(name)
	if err == nil {
		err = netlink.AddrAdd(l, &netlink.Addr{IPNet: netlink.NewIPNet(ip.AsSlice())})
	}
	if err == nil {
		err = netlink.LinkSetUp(l)
	}
	if err == nil {
		var p netlink.Link
		if p, err = netlink.LinkByName(peer); err == nil {
			err = netlink.LinkSetUp(p)
		}
	}
	if err != nil {
		_ = deleteLink(name)
		return fmt.Errorf("node link %s: %w", name, err)
	}
	return nil
}

// deleteLink deletes a veth (and so its peer); a missing one is no error.
func deleteLink(name string) error {
	l, err := netlink.LinkByName(name)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return nil
		}
		return fmt.Errorf("delete link %s: %w", name, err)
	}
	if err := netlink.LinkDel(l); err != nil {
		return fmt.Errorf("delete link %s: %w", name, err)
	}
	return nil
}

// KubeletSysctls are the sysctls the kubelet sets at start (its kernel
// tunables), and kube-proxy's: the node saves them before and restores
// them after.
var KubeletSysctls = []string{
	"vm.overcommit_memory",
	"vm.panic_on_oom",
	"kernel.panic",
	"kernel.panic_on_oops",
	"kernel.keys.root_maxkeys",
	"kernel.keys.root_maxbytes",
	// kube-proxy's conntrack settings (its configuration leaves them
	// alone; restored all the same).
	"net.netfilter.nf_conntrack_max",
	"net.netfilter.nf_conntrack_tcp_timeout_established",
	"net.netfilter.nf_conntrack_tcp_timeout_close_wait",
	// The forwarding settings of cellium's agent when it runs as a pod
	// with host routing (the node's Options.Agent empty).
	"net.ipv4.ip_forward",
	"net.ipv4.conf.all.rp_filter",
}

func sysctlPath(name string) string {
	return filepath.Join("/proc/sys", strings.ReplaceAll(name, ".", "/"))
}

// readSysctls returns the current values of names (those that exist).
func readSysctls(names []string) (map[string]string, error) {
	out := map[string]string{}
	for _, n := range names {
		b, err := os.ReadFile(sysctlPath(n))
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("read sysctl %s: %w", n, err)
		}
		out[n] = strings.TrimSpace(string(b))
	}
	return out, nil
}

// writeSysctls sets the sysctls to the values, where they differ.
func writeSysctls(values map[string]string) error {
	now, err := readSysctls(slices.Collect(func(yield func(string) bool) {
		for k := range values {
			if !yield(k) {
				return
			}
		}
	}))
	if err != nil {
		return err
	}
	var errs []error
	for n, v := range values {
		if now[n] == v {
			continue
		}
		if err := os.WriteFile(sysctlPath(n), []byte(v+"\n"), 0o644); err != nil {
			errs = append(errs, fmt.Errorf("restore sysctl %s=%s: %w", n, v, err))
		}
	}
	return errors.Join(errs...)
}

// cgroupMounts returns the directories of this machine's cgroup
// hierarchies (/sys/fs/cgroup/<controllers>, and unified, the v2 one of a
// hybrid machine, where runc makes cgroups too), without symbolic links
// (cpu -> cpu,cpuacct).
func cgroupMounts() ([]string, error) {
	const base = "/sys/fs/cgroup"
	entries, err := os.ReadDir(base)
	if err != nil {
		return nil, fmt.Errorf("list cgroup hierarchies: %w", err)
	}
	var out []string
	for _, e := range entries {
		if !e.IsDir() || e.Type()&os.ModeSymlink != 0 {
			continue
		}
		out = append(out, filepath.Join(base, e.Name()))
	}
	return out, nil
}

// makeCgroupRoot creates the cgroup root (e.g. "/cellium-10-254-3-7") in
// every hierarchy: the kubelet refuses a root that does not exist, and
// puts its kubepods tree under it.
func makeCgroupRoot(root string) error {
	mounts, err := cgroupMounts()
	if err != nil {
		return err
	}
	for _, m := range mounts {
		if err := os.Mkdir(filepath.Join(m, root), 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			return fmt.Errorf("create cgroup %s in %s: %w", root, m, err)
		}
	}
	return nil
}

// removeCgroupRoot removes the cgroup root and everything under it from
// every hierarchy, deepest first (a cgroup directory is removed with
// rmdir, and only once it has no tasks and no children).
func removeCgroupRoot(root string) error {
	mounts, err := cgroupMounts()
	if err != nil {
		return err
	}
	var errs []error
	for _, m := range mounts {
		top := filepath.Join(m, root)
		var dirs []string
		err := filepath.WalkDir(top, func(p string, d os.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for i := len(dirs) - 1; i >= 0; i-- {
			if err := removeCgroupDir(dirs[i]); err != nil {
				errs = append(errs, fmt.Errorf("remove cgroup %s: %w", dirs[i], err))
			}
		}
	}
	return errors.Join(errs...)
}

// cgroupRootExists reports in which hierarchies the cgroup root exists.
func cgroupRootExists(root string) []string {
	mounts, err := cgroupMounts()
	if err != nil {
		return nil
	}
	var out []string
	for _, m := range mounts {
		if _, err := os.Stat(filepath.Join(m, root)); err == nil {
			out = append(out, filepath.Join(m, root))
		}
	}
	return out
}

// Blackhole adds a blackhole route for prefix to the host's main table,
// so that a packet to it that no more specific route claims (a pod
// address the node has no route to) is dropped here instead of following
// the default route off the machine. The returned function removes it; a
// route that was there already is left alone.
func Blackhole(prefix netip.Prefix) (remove func() error, err error) {
	added, err := addBlackhole(prefix)
	if err != nil {
		return nil, err
	}
	if !added {
		return func() error { return nil }, nil
	}
	return func() error { return removeBlackhole(prefix) }, nil
}

func blackholeRoute(prefix netip.Prefix) *netlink.Route {
	r := &netlink.Route{
		Dst:      netlink.NewIPNet(prefix.Addr().AsSlice()),
		Type:     unix.RTN_BLACKHOLE,
		Protocol: unix.RTPROT_STATIC,
	}
	r.Dst.Mask = net.CIDRMask(prefix.Bits(), prefix.Addr().BitLen())
	return r
}

// addBlackhole adds the blackhole route for prefix and reports whether it
// did (false: a route for prefix was there already).
func addBlackhole(prefix netip.Prefix) (bool, error) {
	if err := netlink.RouteAdd(blackholeRoute(prefix)); err != nil {
		if errors.Is(err, unix.EEXIST) {
			return false, nil
		}
		return false, fmt.Errorf("blackhole %s: %w", prefix, err)
	}
	return true, nil
}

// removeBlackhole removes the blackhole route for prefix; a missing one is
// no error.
func removeBlackhole(prefix netip.Prefix) error {
	if err := netlink.RouteDel(blackholeRoute(prefix)); err != nil && !errors.Is(err, unix.ESRCH) {
		return fmt.Errorf("remove blackhole %s: %w", prefix, err)
	}
	return nil
}

// blackholeExists reports whether the main table has a blackhole route
// for prefix.
func blackholeExists(prefix netip.Prefix) bool {
	rs, err := netlink.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Dst: blackholeRoute(prefix).Dst, Table: unix.RT_TABLE_MAIN},
		netlink.RT_FILTER_DST|netlink.RT_FILTER_TABLE)
	if err != nil {
		return false
	}
	for _, r := range rs {
		if r.Type == unix.RTN_BLACKHOLE {
			return true
		}
	}
	return false
}

// routesInto lists the routes of the main table whose destination lies
// inside pool (a route to a pod, to the router IP), blackholes aside.
func routesInto(pool netip.Prefix) []string {
	rs, err := netlink.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Table: unix.RT_TABLE_MAIN}, netlink.RT_FILTER_TABLE)
	if err != nil {
		return []string{"list routes: " + err.Error()}
	}
	var out []string
	for _, r := range rs {
		if r.Dst == nil || r.Type == unix.RTN_BLACKHOLE {
			continue
		}
		dst, ok := netip.AddrFromSlice(r.Dst.IP)
		if ok && pool.Contains(dst.Unmap()) {
			out = append(out, "route "+r.Dst.String())
		}
	}
	return out
}

// removeCgroupDir removes one cgroup directory. A task killed a moment ago
// keeps its cgroup busy until it is reaped (its parent, a killed shim, was
// reparented to init): EBUSY is retried for up to 5 seconds.
func removeCgroupDir(dir string) error {
	deadline := time.Now().Add(5 * time.Second)
	for {
		err := os.Remove(dir)
		if err == nil || errors.Is(err, os.ErrNotExist) {
			return nil
		}
		if !errors.Is(err, unix.EBUSY) || time.Now().After(deadline) {
			return err
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// hostOwnerCommands are the programs that make what [WaitHostFree] waits
// for in a network namespace.
var hostOwnerCommands = []string{"kube-proxy", "cellium-agent", "kubelet", "devcluster"}

// hostNetworkOwners lists the processes of [hostOwnerCommands] in the
// calling thread's network namespace, as "pid N: command line", for an error that
// says who holds the host's network.
func hostNetworkOwners() []string {
	self, err := os.Readlink("/proc/thread-self/ns/net")
	if err != nil {
		return nil
	}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var out []string
	for _, e := range entries {
		pid := e.Name()
		if pid == "" || pid[0] < '0' || pid[0] > '9' {
			continue
		}
		comm, err := os.ReadFile(filepath.Join("/proc", pid, "comm"))
		if err != nil || !slices.Contains(hostOwnerCommands, strings.TrimSpace(string(comm))) {
			continue
		}
		if netns, err := os.Readlink(filepath.Join("/proc", pid, "ns", "net")); err != nil || netns != self {
			continue
		}
		cmdline, _ := os.ReadFile(filepath.Join("/proc", pid, "cmdline"))
		line := strings.TrimSpace(strings.ReplaceAll(string(cmdline), "\x00", " "))
		if len(line) > 200 {
			line = line[:200] + "..."
		}
		out = append(out, "pid "+pid+": "+line)
	}
	return out
}
