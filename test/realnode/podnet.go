package realnode

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"time"

	"golang.org/x/sys/unix"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/cellium/cellium/api/v1/client"
	"github.com/cellium/cellium/datapath/routing"
	"github.com/cellium/cellium/statedb/routes"
	"github.com/cellium/cellium/test/devkubelet/devnode"
)

// sharedMount bind-mounts dir onto itself and makes it a shared mount
// (recursively): containerd refuses the DaemonSet's Bidirectional and
// HostToContainer mounts of host paths that are not on a shared (or
// slave) mount, and this machine's root mount is private.
func sharedMount(dir string) error {
	if err := unix.Mount(dir, dir, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind-mount %s onto itself: %w", dir, err)
	}
	if err := unix.Mount("", dir, "", unix.MS_SHARED|unix.MS_REC, ""); err != nil {
		return errors.Join(fmt.Errorf("make %s a shared mount: %w", dir, err), unmountDir(dir))
	}
	return nil
}

// unmountDir unmounts dir itself (sharedMount's bind mount), every mount
// stacked on it; not being a mount point is no error.
func unmountDir(dir string) error {
	for isMountPoint(dir) {
		if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
			if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOENT) {
				return nil
			}
			return fmt.Errorf("unmount %s: %w", dir, err)
		}
	}
	return nil
}

// isMountPoint reports whether dir is a mount point of this mount
// namespace.
func isMountPoint(dir string) bool {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return false
	}
	for line := range strings.Lines(string(b)) {
		if f := strings.Fields(line); len(f) >= 5 && unescapeMount(f[4]) == dir {
			return true
		}
	}
	return false
}

// agentHostNetworkLeftovers lists what an agent with host routing left in
// the host's network namespace (devnode.RemoveAgentHostNetwork removes
// it): its devices and its nftables table.
func agentHostNetworkLeftovers() []string {
	var out []string
	for _, dev := range []string{routes.HostDevice, "cilium_net", "lxc_health"} {
		if _, err := net.InterfaceByName(dev); err == nil {
			out = append(out, "link "+dev)
		}
	}
	if nftTableExists("ip " + routing.NFTable) {
		out = append(out, "nftables table ip "+routing.NFTable)
	}
	return out
}

// DrainPodNetwork deletes the pods bound to the node that are not in the
// host network (cellium's own pods are) and waits until none is left and
// the agent on socket no longer has an endpoint of a pod: the kubelet has
// stopped their sandboxes and containerd released their network through
// CNI DEL while the agent still runs. Pods a controller recreates are
// deleted again. It gives up after a minute, at once if the agent or the
// API server does not answer.
//
// Errors: the API server or the agent does not answer; pods remain.
func DrainPodNetwork(ctx context.Context, cs kubernetes.Interface, node, socket string) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	agent := client.New(socket)
	defer agent.Close()
	// An API server or agent that does not answer at all is not waited
	// for.
	pctx, pcancel := context.WithTimeout(ctx, 5*time.Second)
	defer pcancel()
	if _, err := agent.GetEndpoints(pctx); err != nil {
		return fmt.Errorf("drain: the agent on %s: %w", socket, err)
	}
	if _, err := cs.CoreV1().Nodes().Get(pctx, node, metav1.GetOptions{}); err != nil {
		return fmt.Errorf("drain: %w", err)
	}
	zero := int64(0)
	return devnode.WaitFor(ctx, nil, func() error {
		pods, err := cs.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + node})
		if err != nil {
			return fmt.Errorf("drain: %w", err)
		}
		left := 0
		for _, p := range pods.Items {
			if p.Spec.HostNetwork {
				continue
			}
			left++
			err := cs.CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero})
			if err != nil && !apierrors.IsNotFound(err) {
				return fmt.Errorf("drain: %w", err)
			}
		}
		if left > 0 {
			return fmt.Errorf("drain: %d pods still bound to node %s", left, node)
		}
		eps, err := agent.GetEndpoints(ctx)
		if err != nil {
			return fmt.Errorf("drain: %w", err)
		}
		for _, ep := range eps {
			if ep.Spec != nil && ep.Spec.K8sPodName != "" {
				return fmt.Errorf("drain: the agent still has the endpoint %d of pod %s/%s", ep.ID, ep.Spec.K8sNamespace, ep.Spec.K8sPodName)
			}
		}
		return nil
	})
}
