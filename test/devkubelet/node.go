package devkubelet

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	listersv1 "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/util/workqueue"
)

// Node heartbeats, as kubelet's defaults: the Lease is renewed every 10s
// and lasts 40s; the Node status is rewritten when the network readiness
// changes and at least every 5 minutes.
const (
	leaseRenewInterval = 10 * time.Second
	leaseDuration      = 40
	statusInterval     = 5 * time.Minute
	readinessPoll      = time.Second
)

// NodeLabel marks the Node objects a devkubelet registered.
const NodeLabel = "cellium.io/devkubelet"

// leaseNamespace holds the nodes' heartbeat Leases.
const leaseNamespace = "kube-node-lease"

// networkReady reports whether the CNI configuration directory holds a
// network.
func (k *Kubelet) networkReady() bool {
	_, err := k.cni.network()
	return err == nil
}

// registerNode creates the Node if it does not exist and writes its
// status.
func (k *Kubelet) registerNode(ctx context.Context, netReady bool) error {
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{
		Name: k.cfg.NodeName,
		Labels: map[string]string{
			corev1.LabelHostname:   k.cfg.NodeName,
			corev1.LabelOSStable:   runtime.GOOS,
			corev1.LabelArchStable: runtime.GOARCH,
			NodeLabel:              "true",
		},
	}}
	_, err := k.cs.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("register node %s: %w", k.cfg.NodeName, err)
	}
	if err := k.writeNodeStatus(ctx, netReady); err != nil {
		return err
	}
	return k.renewLease(ctx)
}

// nodeStatus is the status the kubelet reports.
func (k *Kubelet) nodeStatus(netReady bool) corev1.NodeStatus {
	now := metav1.NewTime(time.Now())
	ready := corev1.NodeCondition{
		Type: corev1.NodeReady, Status: corev1.ConditionTrue,
		Reason: "KubeletReady", Message: "devkubelet is posting ready status",
		LastHeartbeatTime: now, LastTransitionTime: now,
	}
	if !netReady {
		ready.Status = corev1.ConditionFalse
		ready.Reason = "KubeletNotReady"
		ready.Message = "container runtime network not ready: NetworkReady=false reason:NetworkPluginNotReady " +
			"message:no CNI network configuration in " + k.cfg.CNIConfDir
	}
	capacity := corev1.ResourceList{
		corev1.ResourceCPU:    *resource.NewQuantity(int64(runtime.NumCPU()), resource.DecimalSI),
		corev1.ResourceMemory: resource.MustParse("8Gi"),
		corev1.ResourcePods:   *resource.NewQuantity(1000, resource.DecimalSI),
	}
	return corev1.NodeStatus{
		Capacity:    capacity,
		Allocatable: capacity,
		Conditions:  []corev1.NodeCondition{ready},
		Addresses: []corev1.NodeAddress{
			{Type: corev1.NodeInternalIP, Address: k.cfg.NodeIP.String()},
			{Type: corev1.NodeHostName, Address: k.cfg.NodeName},
		},
		NodeInfo: corev1.NodeSystemInfo{
			KubeletVersion:          "v0.0.0-devkubelet",
			ContainerRuntimeVersion: "devkubelet://0.0.0",
			OperatingSystem:         runtime.GOOS,
			Architecture:            runtime.GOARCH,
		},
	}
}

// writeNodeStatus replaces the Node's status.
func (k *Kubelet) writeNodeStatus(ctx context.Context, netReady bool) error {
	patch, err := json.Marshal(map[string]any{"status": k.nodeStatus(netReady)})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, apiTimeout)
	defer cancel()
	_, err = k.cs.CoreV1().Nodes().Patch(ctx, k.cfg.NodeName, types.MergePatchType, patch, metav1.PatchOptions{}, "status")
	if err != nil {
		return fmt.Errorf("write status of node %s: %w", k.cfg.NodeName, err)
	}
	return nil
}

// renewLease creates or renews the node's Lease in kube-node-lease.
func (k *Kubelet) renewLease(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, apiTimeout)
	defer cancel()
	leases := k.cs.CoordinationV1().Leases(leaseNamespace)
	now := metav1.NewMicroTime(time.Now())
	holder, duration := k.cfg.NodeName, int32(leaseDuration)
	lease, err := leases.Get(ctx, k.cfg.NodeName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		_, err = leases.Create(ctx, &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: k.cfg.NodeName, Namespace: leaseNamespace},
			Spec: coordinationv1.LeaseSpec{
				HolderIdentity: &holder, LeaseDurationSeconds: &duration, RenewTime: &now,
			},
		}, metav1.CreateOptions{})
	} else if err == nil {
		lease.Spec.HolderIdentity, lease.Spec.LeaseDurationSeconds, lease.Spec.RenewTime = &holder, &duration, &now
		_, err = leases.Update(ctx, lease, metav1.UpdateOptions{})
	}
	if err != nil {
		return fmt.Errorf("renew lease of node %s: %w", k.cfg.NodeName, err)
	}
	return nil
}

// heartbeat keeps the Lease fresh and the Ready condition in line with
// the CNI configuration; when the network becomes ready it queues every
// pod of the node.
func (k *Kubelet) heartbeat(ctx context.Context, netReady bool, queue workqueue.TypedRateLimitingInterface[string], lister listersv1.PodLister) {
	poll := time.NewTicker(readinessPoll)
	defer poll.Stop()
	lastLease, lastStatus := time.Now(), time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case <-poll.C:
		}
		ready := k.networkReady()
		if ready != netReady || time.Since(lastStatus) >= statusInterval {
			if err := k.writeNodeStatus(ctx, ready); err != nil {
				k.log.Warn("node status", "error", err)
			} else {
				if ready != netReady {
					k.log.Info("network readiness changed", "ready", ready)
				}
				netReady, lastStatus = ready, time.Now()
			}
			if ready {
				if pods, err := lister.List(labels.Everything()); err == nil {
					for _, p := range pods {
						queue.Add(p.Namespace + "/" + p.Name)
					}
				}
			}
		}
		if time.Since(lastLease) >= leaseRenewInterval {
			if err := k.renewLease(ctx); err != nil {
				k.log.Warn("node lease", "error", err)
			} else {
				lastLease = time.Now()
			}
		}
	}
}

// unregisterNode deletes the Node and its Lease; missing ones are fine.
func (k *Kubelet) unregisterNode(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, apiTimeout)
	defer cancel()
	var errs []error
	if err := k.cs.CoreV1().Nodes().Delete(ctx, k.cfg.NodeName, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		errs = append(errs, fmt.Errorf("delete node %s: %w", k.cfg.NodeName, err))
	}
	if err := k.cs.CoordinationV1().Leases(leaseNamespace).Delete(ctx, k.cfg.NodeName, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		errs = append(errs, fmt.Errorf("delete lease of node %s: %w", k.cfg.NodeName, err))
	}
	return errors.Join(errs...)
}
