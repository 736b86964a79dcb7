package realnode

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Addresses of the nodes' network: the nodes' uplinks meet on a bridge in
// the host's network namespace (BridgeAddr/24); node i (1-based) has
// NodeNetworkBase+i on its eth0. No other test of the project uses
// 10.250.0.0/24.
var (
	// NodeNetwork is the bridge's subnet.
	NodeNetwork = netip.MustParsePrefix("10.250.0.0/24")
	// BridgeAddr is the host's address on the bridge: the API server
	// listens there for the nodes.
	BridgeAddr = netip.MustParseAddr("10.250.0.254")
)

// MaxNodes is the most nodes a cluster may have ([ClusterOptions].Nodes).
const MaxNodes = 4

// NodeIPAt is the address of node i (1..MaxNodes) on the nodes' network.
func NodeIPAt(i int) (netip.Addr, error) {
	if i < 1 || i > MaxNodes {
		return netip.Addr{}, fmt.Errorf("node %d: a cluster has 1 to %d nodes", i, MaxNodes)
	}
	b := NodeNetwork.Addr().As4()
	b[3] = byte(i)
	return netip.AddrFrom4(b), nil
}

// StandardPaths are the host paths every node has of its own: in the
// node's mount namespace each is a bind mount of a folder of the node's
// directory (NodeNamespaces.RootDir()/<path>), so that one DaemonSet's
// hostPaths mean each node's own folders, as on separate machines.
var StandardPaths = []string{
	"/var/lib/kubelet",
	"/var/lib/cni",
	"/var/log/pods",
	"/var/log/containers",
	"/run/containerd",
	"/run/netns",
	"/run/cellium",
	"/etc/cni/net.d",
	"/opt/cni/bin",
}

// NodeNamespaces are a node's network namespace (its eth0 on the nodes'
// bridge) and its mount namespace, both kept alive by bind mounts of
// their files in Dir/ns (no process needs to hold them). In the mount
// namespace, every [StandardPaths] entry is the node's own folder, /sys is
// a sysfs of the node's network namespace with a bpffs of its own at
// /sys/fs/bpf and the host's cgroup hierarchies at /sys/fs/cgroup, and /
// is a shared mount (containerd's mount propagation) whose events never
// reach the host. Processes enter both with [NodeNamespaces.Command].
type NodeNamespaces struct {
	// Name names the network namespace (ip netns) and the host end of the
	// uplink veth (Name+"h"); short (link names have 15 bytes).
	Name string
	// Dir is the node's directory.
	Dir string
	// IP is the node's address on eth0 (NodeNetwork).
	IP netip.Addr
}

// NetnsPath is the file of the node's network namespace.
func (s NodeNamespaces) NetnsPath() string { return filepath.Join("/run/netns", s.Name) }

// MountNSPath is the file that keeps the node's mount namespace.
func (s NodeNamespaces) MountNSPath() string { return filepath.Join(s.nsDir(), "mnt") }

// RootDir holds the node's own folders of StandardPaths.
func (s NodeNamespaces) RootDir() string { return filepath.Join(s.Dir, "root") }

// HostLink is the host end of the node's uplink (on the bridge).
func (s NodeNamespaces) HostLink() string { return s.Name + "h" }

func (s NodeNamespaces) nsDir() string { return filepath.Join(s.Dir, "ns") }

// Command returns a command that runs path with args inside the node's
// network and mount namespaces (nsenter of util-linux).
func (s NodeNamespaces) Command(ctx context.Context, path string, args ...string) *exec.Cmd {
	return exec.CommandContext(ctx, "nsenter", s.Wrap(path, args...)...)
}

// Wrap returns the arguments of nsenter that run path with args inside the
// node's namespaces (for a process started by the harness: Path
// "nsenter", Args Wrap(...)).
func (s NodeNamespaces) Wrap(path string, args ...string) []string {
	return append([]string{"--net=" + s.NetnsPath(), "--mount=" + s.MountNSPath(), "--", path}, args...)
}

// EnsureBridge creates the nodes' bridge (name, BridgeAddr/24, up) in the
// host's network namespace unless it exists, and reports whether it did.
func EnsureBridge(name string) (created bool, err error) {
	if _, err := netlink.LinkByName(name); err == nil {
		return false, nil
	}
	la := netlink.NewLinkAttrs()
	la.Name = name
	br := &netlink.Bridge{LinkAttrs: la}
	if err := netlink.LinkAdd(br); err != nil {
		return false, fmt.Errorf("nodes' bridge %s: %w", name, err)
	}
	addr := &netlink.Addr{IPNet: &net.IPNet{IP: BridgeAddr.AsSlice(), Mask: net.CIDRMask(NodeNetwork.Bits(), 32)}}
	if err := netlink.AddrAdd(br, addr); err != nil {
		return true, errors.Join(fmt.Errorf("nodes' bridge %s: %w", name, err), deleteLink(name))
	}
	if err := netlink.LinkSetUp(br); err != nil {
		return true, errors.Join(fmt.Errorf("nodes' bridge %s: %w", name, err), deleteLink(name))
	}
	return true, nil
}

// Create makes the node's namespaces: the network namespace with lo, eth0
// (IP/24, the peer of HostLink on bridge) and the sysctls a node needs
// (forwarding on, rp_filter off: a new namespace does not inherit them
// all), no default route (nothing leaves the machine through the host);
// the mount namespace as NodeNamespaces says. Missing mount points of
// StandardPaths are created on the host (empty directories): it returns
// those, for [NodeNamespaces.Remove].
//
// Errors: not root; util-linux's unshare or nsenter is missing; a step
// fails (with its output).
func (s NodeNamespaces) Create(ctx context.Context, bridge string) (madeDirs []string, err error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("node namespaces: need root")
	}
	for _, tool := range []string{"unshare", "nsenter", "ip", "mount"} {
		if _, err := exec.LookPath(tool); err != nil {
			return nil, fmt.Errorf("node namespaces: %s is missing (util-linux, iproute2): %w", tool, err)
		}
	}
	defer func() {
		if err != nil {
			err = errors.Join(fmt.Errorf("node namespaces %s: %w", s.Name, err), s.Remove(madeDirs))
			madeDirs = nil
		}
	}()
	// The network.
	if err := run(ctx, "ip", "netns", "add", s.Name); err != nil {
		return nil, err
	}
	br, err := netlink.LinkByName(bridge)
	if err != nil {
		return nil, fmt.Errorf("bridge %s: %w", bridge, err)
	}
	la := netlink.NewLinkAttrs()
	la.Name = s.HostLink()
	la.MasterIndex = br.Attrs().Index
	if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: la, PeerName: s.Name + "n"}); err != nil {
		return nil, fmt.Errorf("uplink %s: %w", s.HostLink(), err)
	}
	host, err := netlink.LinkByName(s.HostLink())
	if err == nil {
		err = netlink.LinkSetUp(host)
	}
	if err != nil {
		return nil, fmt.Errorf("uplink %s: %w", s.HostLink(), err)
	}
	ipn := "ip -n " + s.Name + " "
	for _, c := range []string{
		"ip link set " + s.Name + "n netns " + s.Name,
		ipn + "link set " + s.Name + "n name eth0",
		ipn + "addr add " + s.IP.String() + "/" + strconv.Itoa(NodeNetwork.Bits()) + " dev eth0",
		ipn + "link set eth0 up",
		ipn + "link set lo up",
		"ip netns exec " + s.Name + " sysctl -qw net.ipv4.ip_forward=1 net.ipv4.conf.all.rp_filter=0 net.ipv4.conf.default.rp_filter=0 net.ipv4.conf.eth0.rp_filter=0",
	} {
		if err := run(ctx, strings.Fields(c)...); err != nil {
			return nil, err
		}
	}
	// The mount namespace, kept by a bind mount of its file on a private
	// mount of the node's ns directory (unshare refuses a shared one).
	for _, p := range StandardPaths {
		if top := topMissing(p); top != "" {
			// Recorded before it is made: the topmost directory made.
			madeDirs = append(madeDirs, top)
			if err := os.MkdirAll(p, 0o755); err != nil {
				return madeDirs, err
			}
		}
		if err := os.MkdirAll(filepath.Join(s.RootDir(), p), 0o755); err != nil {
			return madeDirs, err
		}
	}
	if err := os.MkdirAll(s.nsDir(), 0o755); err != nil {
		return madeDirs, err
	}
	if err := unix.Mount(s.nsDir(), s.nsDir(), "", unix.MS_BIND, ""); err != nil {
		return madeDirs, fmt.Errorf("bind-mount %s: %w", s.nsDir(), err)
	}
	if err := unix.Mount("", s.nsDir(), "", unix.MS_PRIVATE, ""); err != nil {
		return madeDirs, fmt.Errorf("make %s private: %w", s.nsDir(), err)
	}
	if err := os.WriteFile(s.MountNSPath(), nil, 0o644); err != nil {
		return madeDirs, err
	}
	if err := run(ctx, "unshare", "--mount="+s.MountNSPath(), "--propagation", "private", "true"); err != nil {
		return madeDirs, err
	}
	cg := filepath.Join(s.nsDir(), "cgroup")
	if err := os.MkdirAll(cg, 0o755); err != nil {
		return madeDirs, err
	}
	script := []string{
		"set -e",
		// The namespace copied the host's mounts, among them the files
		// that keep other nodes' namespaces (ip netns's, the ns/mnt ones):
		// dropped, or this node would keep another removed node's
		// namespaces (its routes, its links) alive.
		"findmnt -rn -t nsfs -o TARGET | while read -r m; do umount -l \"$(printf '%b' \"$m\")\" || true; done",
		// The host's cgroup hierarchies, kept aside while /sys is replaced.
		"mount --rbind /sys/fs/cgroup " + cg,
		// A sysfs of the node's network namespace (its /sys/class/net).
		"mount -t sysfs sysfs /sys",
		"mount --move " + cg + " /sys/fs/cgroup",
		"mount -t bpf bpffs /sys/fs/bpf",
	}
	for _, p := range StandardPaths {
		script = append(script, "mount --bind "+filepath.Join(s.RootDir(), p)+" "+p)
	}
	// Shared inside the node (the DaemonSet's Bidirectional mounts);
	// the namespace was made private, so nothing reaches the host.
	script = append(script, "mount --make-rshared /")
	cmd := s.Command(ctx, "sh", "-c", strings.Join(script, "\n"))
	if out, err := cmd.CombinedOutput(); err != nil {
		return madeDirs, fmt.Errorf("set up the mount namespace: %w: %s", err, strings.TrimSpace(string(out)))
	}
	return madeDirs, nil
}

// Remove deletes what Create made: the uplink, the network namespace, the
// mount namespace's file and the private mount of the ns directory, and
// the host directories in madeDirs (if still empty). Missing pieces are no
// error. The processes inside must be gone.
func (s NodeNamespaces) Remove(madeDirs []string) error {
	var errs []error
	errs = append(errs, deleteLink(s.HostLink()))
	if exists(s.NetnsPath()) {
		if err := run(context.Background(), "ip", "netns", "delete", s.Name); err != nil {
			errs = append(errs, err)
		}
	}
	if exists(s.MountNSPath()) {
		if err := unix.Unmount(s.MountNSPath(), unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) {
			errs = append(errs, fmt.Errorf("unmount %s: %w", s.MountNSPath(), err))
		}
	}
	errs = append(errs, unmountDir(s.nsDir()))
	for i := len(madeDirs) - 1; i >= 0; i-- {
		errs = append(errs, removeEmptyTree(madeDirs[i], false))
	}
	return errors.Join(errs...)
}

// Leftovers lists what of the node's namespaces is still on the host.
func (s NodeNamespaces) Leftovers(madeDirs []string) []string {
	var out []string
	if _, err := net.InterfaceByName(s.HostLink()); err == nil {
		out = append(out, "link "+s.HostLink())
	}
	if exists(s.NetnsPath()) {
		out = append(out, "netns "+s.Name)
	}
	if isMountPoint(s.MountNSPath()) || isMountPoint(s.nsDir()) {
		out = append(out, "mount "+s.nsDir())
	}
	for _, d := range madeDirs {
		if exists(d) {
			out = append(out, "directory "+d)
		}
	}
	return out
}

// topMissing returns the topmost ancestor of p (p included) that does not
// exist, or "" if p exists.
func topMissing(p string) string {
	top := ""
	for d := p; d != "/" && d != "." && !exists(d); d = filepath.Dir(d) {
		top = d
	}
	return top
}

// run runs a command and returns its output in the error.
func run(ctx context.Context, args ...string) error {
	out, err := exec.CommandContext(ctx, args[0], args[1:]...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}
