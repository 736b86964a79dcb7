package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/cellium/cellium/datapath/routing"
	"github.com/cellium/cellium/statedb/routes"
	"github.com/cellium/cellium/test/devkubelet/devnode"
	"github.com/cellium/cellium/test/harness"
	"github.com/cellium/cellium/test/realnode"
)

// The address ranges of --realnode's cluster, which no other test on the
// machine uses: pods, Services (blackholed, so that a packet to a Service
// address kube-proxy has not translated is dropped here), and the node's
// own address (realnode picks one in 10.254.0.0/16).
const (
	realnodePodPool     = "10.236.0.0/16"
	realnodeServiceCIDR = "10.237.0.0/16"
	realnodeNodeRange   = "10.254.0.0/16"
)

// realNodeCluster is the cluster --realnode starts.
type realNodeCluster struct {
	kubeconfig string
	dir        string
	log        *slog.Logger
	cleanups   []func() error // in reverse order of start
}

// startRealNode starts what the Netpol specs need of a cluster, in dir: the
// control plane with kube-controller-manager (the "default" ServiceAccount
// of the specs' namespaces, EndpointSlices for kube-proxy, the node's
// not-ready taint lifted), cellium-operator, and a real node (containerd
// with the pause image and the images given, kubelet, kube-scheduler,
// kube-proxy in nftables mode, cellium-agent as a host process). The suite
// needs no DNS: its probes go to the Services' ClusterIPs.
//
// Errors: not root; the node binaries are missing (and cannot be built);
// a component does not start. What was started is stopped again.
// celliumBin, if not empty, holds prebuilt cellium-agent, cellium-operator
// and cellium-cni to run instead of building them from the checkout.
func startRealNode(ctx context.Context, log *slog.Logger, dir, celliumBin string, images ...string) (_ *realNodeCluster, err error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("--realnode needs root (it runs containerd, the kubelet and cellium-agent)")
	}
	if out, _ := exec.CommandContext(ctx, "pgrep", "-a", "kubelet").Output(); len(out) > 0 {
		return nil, fmt.Errorf("a kubelet runs already (another real node; kube-proxy's nftables tables are the machine's, so only one node can run at a time):\n%s", out)
	}
	if _, err := netlink.LinkByName(routes.HostDevice); err == nil {
		return nil, fmt.Errorf("%s exists: another agent programs this machine's host routing (make up, a privileged test); the node's agent needs it", routes.HostDevice)
	}
	if out, _ := exec.CommandContext(ctx, "pgrep", "-a", "cellium-agent").Output(); len(out) > 0 {
		return nil, fmt.Errorf("a cellium-agent runs already (make up, a privileged test), which would share this machine's cilium_host and routes with the node's agent:\n%s", out)
	}
	nodeBins, err := harness.EnsureNodeBinaries(ctx, log)
	if err != nil {
		return nil, err
	}
	if nodeBins.Runc == "" {
		return nil, errors.New("runc is not installed: run make deps (Debian: apt-get install runc)")
	}
	if err := os.RemoveAll(dir); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	rn := &realNodeCluster{dir: dir, log: log}
	defer func() {
		if err != nil {
			err = errors.Join(err, rn.stop(true))
		}
	}()

	cellium := devnode.Binaries{
		Agent:     filepath.Join(celliumBin, devnode.Agent),
		Operator:  filepath.Join(celliumBin, devnode.Operator),
		CNIPlugin: filepath.Join(celliumBin, devnode.CNIPlugin),
	}
	if celliumBin == "" {
		if cellium, err = devnode.BuildBinaries(ctx, filepath.Join(dir, "bin"), devnode.Agent, devnode.Operator, devnode.CNIPlugin); err != nil {
			return nil, err
		}
	} else {
		for _, b := range []string{cellium.Agent, cellium.Operator, cellium.CNIPlugin} {
			if _, err := os.Stat(b); err != nil {
				return nil, fmt.Errorf("--cellium-bin-dir: %w", err)
			}
		}
	}
	pause, err := realnode.BuildImage(ctx, filepath.Join(dir, "images"), realnode.PauseSpec)
	if err != nil {
		return nil, err
	}

	for _, p := range []string{realnodePodPool, realnodeServiceCIDR, realnodeNodeRange} {
		remove, err := realnode.Blackhole(netip.MustParsePrefix(p))
		if err != nil {
			return nil, err
		}
		rn.cleanups = append(rn.cleanups, remove)
	}

	c, err := harness.Start(ctx, harness.Options{
		Dir:                   filepath.Join(dir, "control-plane"),
		ControllerManager:     true,
		NodeAuthorizer:        true,
		ServiceClusterIPRange: realnodeServiceCIDR,
		APIServerArgs:         []string{"--kubelet-preferred-address-types=InternalIP"},
		Logger:                log,
	})
	if err != nil {
		return nil, err
	}
	rn.cleanups = append(rn.cleanups, c.Stop)
	rn.kubeconfig = c.Kubeconfig()

	opKubeconfig, err := c.OperatorKubeconfig(ctx)
	if err != nil {
		return nil, err
	}
	agentKubeconfig, err := c.AgentKubeconfig(ctx)
	if err != nil {
		return nil, err
	}
	op, err := devnode.StartOperator(ctx, devnode.OperatorConfig{
		Binary:                  cellium.Operator,
		Kubeconfig:              opKubeconfig,
		Dir:                     dir,
		ClusterPoolIPv4CIDR:     realnodePodPool,
		ClusterPoolIPv4MaskSize: 24,
	})
	if err != nil {
		return nil, err
	}
	rn.cleanups = append(rn.cleanups, func() error { return op.Stop(15 * time.Second) })

	// The agent programs the host's network namespace (cilium_host, a
	// route per pod, ip_forward and rp_filter) and attaches its eBPF
	// programs to the pods' veths, pinned in a bpffs of its own: the
	// datapath under test. Without them pods do not reach each other.
	sysctls, err := readSysctls(hostSysctls)
	if err != nil {
		return nil, err
	}
	bpfRoot := filepath.Join(dir, "node", "agent", "bpffs")
	rn.cleanups = append(rn.cleanups, func() error { return restoreHostNetwork(log, sysctls, bpfRoot) })

	node, err := realnode.Start(ctx, realnode.Options{
		Cluster:         c,
		Binaries:        nodeBins,
		Agent:           cellium.Agent,
		CNIPlugin:       cellium.CNIPlugin,
		AgentKubeconfig: agentKubeconfig,
		AgentArgs: []string{
			"--enable-endpoint-routes=true",
			"--enable-bpf-datapath=true",
			"--bpf-root=" + bpfRoot,
		},
		Dir:          filepath.Join(dir, "node"),
		Images:       append([]string{pause}, images...),
		Scheduler:    true,
		KubeProxy:    true,
		ClusterCIDR:  realnodePodPool,
		StartTimeout: 3 * time.Minute,
		Logger:       log,
	})
	if err != nil {
		return nil, err
	}
	rn.cleanups = append(rn.cleanups, func() error { return node.Stop(context.Background()) })
	log.Info("cluster with a real node is up", "node", node.Name, "kubeconfig", rn.kubeconfig, "logs", dir)
	return rn, nil
}

// hostSysctls are the settings of this machine's network namespace the
// agent's host routing changes; stop puts them back.
var hostSysctls = []string{"net/ipv4/ip_forward", "net/ipv4/conf/all/rp_filter"}

func readSysctls(names []string) (map[string]string, error) {
	out := map[string]string{}
	for _, n := range names {
		v, err := os.ReadFile(filepath.Join("/proc/sys", n))
		if err != nil {
			return nil, fmt.Errorf("read sysctl %s: %w", n, err)
		}
		out[n] = strings.TrimSpace(string(v))
	}
	return out, nil
}

// restoreHostNetwork undoes, once the agent is stopped, what its host
// routing and eBPF datapath left in this machine's namespace, and nothing
// of another agent that may have started meanwhile (a privileged test):
// the routes it owns (protocol 201) into the pod pool, cilium_host and
// cilium_net if cilium_host has the router IP from the pool, its bpffs;
// the nftables table and the sysctls only if no cilium_host is left (no
// other agent programs the host).
func restoreHostNetwork(log *slog.Logger, sysctls map[string]string, bpfRoot string) error {
	var errs []error
	pool := netip.MustParsePrefix(realnodePodPool)
	inPool := func(ipn *net.IPNet) bool {
		if ipn == nil {
			return false
		}
		a, ok := netip.AddrFromSlice(ipn.IP)
		return ok && pool.Contains(a.Unmap())
	}
	rs, err := netlink.RouteListFiltered(netlink.FAMILY_V4,
		&netlink.Route{Table: unix.RT_TABLE_MAIN, Protocol: netlink.RouteProtocol(routes.Protocol)},
		netlink.RT_FILTER_TABLE|netlink.RT_FILTER_PROTOCOL)
	errs = append(errs, err)
	for _, r := range rs {
		if inPool(r.Dst) {
			if err := netlink.RouteDel(&r); err != nil && !errors.Is(err, unix.ESRCH) {
				errs = append(errs, fmt.Errorf("remove route %s: %w", r.Dst, err))
			}
		}
	}
	if l, err := netlink.LinkByName(routes.HostDevice); err == nil {
		addrs, _ := netlink.AddrList(l, netlink.FAMILY_V4)
		if len(addrs) == 0 || slices.ContainsFunc(addrs, func(a netlink.Addr) bool { return inPool(a.IPNet) }) {
			errs = append(errs, netlink.LinkDel(l)) // takes cilium_net, its peer
		} else {
			log.Warn("another agent's cilium_host is there: leaving it, the nftables table and the sysctls alone", "addrs", addrs)
		}
	}
	if _, err := netlink.LinkByName(routes.HostDevice); err != nil {
		errs = append(errs, routing.RemoveNFTable(routing.Netns{}))
		for n, v := range sysctls {
			if err := os.WriteFile(filepath.Join("/proc/sys", n), []byte(v+"\n"), 0); err != nil {
				errs = append(errs, fmt.Errorf("restore sysctl %s: %w", n, err))
			}
		}
	}
	if err := unix.Unmount(bpfRoot, 0); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		errs = append(errs, fmt.Errorf("unmount the agent's bpffs %s: %w", bpfRoot, err))
	}
	return errors.Join(errs...)
}

// stop stops everything startRealNode started, in reverse order, and
// removes its directory unless keep.
func (rn *realNodeCluster) stop(keep bool) error {
	var errs []error
	for i := len(rn.cleanups) - 1; i >= 0; i-- {
		errs = append(errs, rn.cleanups[i]())
	}
	rn.cleanups = nil
	err := errors.Join(errs...)
	if err == nil && !keep {
		err = os.RemoveAll(rn.dir)
	} else {
		rn.log.Info("cluster logs kept", "dir", rn.dir)
	}
	return err
}
