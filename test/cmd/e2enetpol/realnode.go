package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"time"

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
func startRealNode(ctx context.Context, log *slog.Logger, dir string, images ...string) (_ *realNodeCluster, err error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("--realnode needs root (it runs containerd, the kubelet and cellium-agent)")
	}
	if out, _ := exec.CommandContext(ctx, "pgrep", "-a", "kubelet").Output(); len(out) > 0 {
		return nil, fmt.Errorf("a kubelet runs already (another real node; kube-proxy's nftables tables are the machine's, so only one node can run at a time):\n%s", out)
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

	cellium, err := devnode.BuildBinaries(ctx, filepath.Join(dir, "bin"), devnode.Agent, devnode.Operator, devnode.CNIPlugin)
	if err != nil {
		return nil, err
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

	node, err := realnode.Start(ctx, realnode.Options{
		Cluster:         c,
		Binaries:        nodeBins,
		Agent:           cellium.Agent,
		CNIPlugin:       cellium.CNIPlugin,
		AgentKubeconfig: agentKubeconfig,
		Dir:             filepath.Join(dir, "node"),
		Images:          append([]string{pause}, images...),
		Scheduler:       true,
		KubeProxy:       true,
		ClusterCIDR:     realnodePodPool,
		StartTimeout:    3 * time.Minute,
		Logger:          log,
	})
	if err != nil {
		return nil, err
	}
	rn.cleanups = append(rn.cleanups, func() error { return node.Stop(context.Background()) })
	log.Info("cluster with a real node is up", "node", node.Name, "kubeconfig", rn.kubeconfig, "logs", dir)
	return rn, nil
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
