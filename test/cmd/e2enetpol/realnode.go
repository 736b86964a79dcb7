package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/cellium/cellium/test/e2enetpol"
	"github.com/cellium/cellium/test/harness"
	"github.com/cellium/cellium/test/realnode"
)

// realNodeCluster is the cluster --realnode starts: make up's (realnode.Up),
// in a directory of its own.
type realNodeCluster struct {
	c          *realnode.Cluster
	kubeconfig string
	dir        string
}

// startRealNode starts what the Netpol specs need of a cluster, in dir, the
// way make up does (realnode.Up): the control plane with
// kube-controller-manager (the "default" ServiceAccount of the specs'
// namespaces, EndpointSlices, the node's not-ready taint lifted), a real
// node (containerd, kubelet, kube-scheduler, kube-proxy in nftables mode)
// and cellium installed from its chart (the agent's DaemonSet with the
// eBPF datapath and the socket load balancer, the operator's Deployment).
// The images (agnhost) are imported into the node's containerd. The suite
// needs no DNS: its probes go to the Services' ClusterIPs.
//
// Errors: not root; the node binaries are missing (and cannot be built);
// a component does not start. What was started is stopped again.
func startRealNode(ctx context.Context, log *slog.Logger, dir string, images ...string) (_ *realNodeCluster, err error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("--realnode needs root (it runs containerd, the kubelet and cellium's pods)")
	}
	if err := os.RemoveAll(dir); err != nil {
		return nil, err
	}
	c, err := realnode.Up(ctx, realnode.ClusterOptions{Dir: dir, Logger: log})
	if err != nil {
		return nil, err
	}
	rn := &realNodeCluster{c: c, kubeconfig: c.Kubeconfig(), dir: dir}
	defer func() {
		if err != nil {
			err = errors.Join(err, rn.stop(true))
		}
	}()
	nb, _, err := harness.CachedNodeBinaries()
	if err != nil {
		return nil, err
	}
	if err := e2enetpol.ImportImages(ctx, nb.Ctr, c.Node.ContainerdSocket(), images...); err != nil {
		return nil, err
	}
	return rn, nil
}

// stop stops the cluster and removes everything it made; with keep the
// logs stay in the directory.
func (rn *realNodeCluster) stop(keep bool) error {
	err := rn.c.Stop(context.Background())
	if left := rn.c.Leftovers(); len(left) > 0 {
		err = errors.Join(err, fmt.Errorf("the cluster left %v", left))
	}
	if !keep {
		err = errors.Join(err, os.RemoveAll(rn.dir))
	}
	return err
}

// makeUpSockets returns the containerd sockets of the real nodes make up
// runs when the kubeconfig is that of a make up cluster (its directory is
// a realnode cluster's), nil otherwise.
func makeUpSockets(kubeconfig string) []string {
	dir := filepath.Dir(kubeconfig)
	if !realnode.IsClusterDir(dir) {
		return nil
	}
	s, err := realnode.ContainerdSockets(dir)
	if err != nil {
		return nil
	}
	return s
}
