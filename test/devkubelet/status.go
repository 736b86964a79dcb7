package devkubelet

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// runtimeScheme prefixes the container IDs the kubelet reports, as
// "containerd://" does for containerd.
const runtimeScheme = "devkubelet://"

// writeRunning reports the pod Running with podIP, unless its status says
// so already. The patch carries the pod's UID, so it fails on a pod
// re-created under the same name meanwhile.
func (k *Kubelet) writeRunning(pod *corev1.Pod, podIP string) error {
	hostIP := k.cfg.NodeIP.String()
	if pod.Status.Phase == corev1.PodRunning && pod.Status.PodIP == podIP && pod.Status.HostIP == hostIP {
		return nil
	}
	now := metav1.NewTime(time.Now())
	start := now
	if pod.Status.StartTime != nil {
		start = *pod.Status.StartTime
	}
	var conds []corev1.PodCondition
	for _, t := range []corev1.PodConditionType{
		corev1.PodScheduled, corev1.PodReadyToStartContainers, corev1.PodInitialized,
		corev1.ContainersReady, corev1.PodReady,
	} {
		conds = append(conds, corev1.PodCondition{Type: t, Status: corev1.ConditionTrue, LastTransitionTime: now})
	}
	var containers []corev1.ContainerStatus
	started := true
	for _, c := range pod.Spec.Containers {
		containers = append(containers, corev1.ContainerStatus{
			Name:        c.Name,
			Image:       c.Image,
			ImageID:     c.Image,
			ContainerID: runtimeScheme + shortID(string(pod.UID)) + "-" + c.Name,
			Ready:       true,
			Started:     &started,
			State:       corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}},
		})
	}
	status := corev1.PodStatus{
		Phase:             corev1.PodRunning,
		Conditions:        conds,
		HostIP:            hostIP,
		HostIPs:           []corev1.HostIP{{IP: hostIP}},
		PodIP:             podIP,
		PodIPs:            []corev1.PodIP{{IP: podIP}},
		StartTime:         &start,
		ContainerStatuses: containers,
		QOSClass:          pod.Status.QOSClass,
	}
	patch, err := json.Marshal(map[string]any{
		"metadata": map[string]any{"uid": pod.UID},
		"status":   status,
	})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), apiTimeout)
	defer cancel()
	_, err = k.cs.CoreV1().Pods(pod.Namespace).Patch(ctx, pod.Name, types.MergePatchType, patch, metav1.PatchOptions{}, "status")
	if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
		return nil // gone or replaced: its own event follows
	}
	if err != nil {
		return fmt.Errorf("write status of pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	k.noteRunning(pod.UID)
	return nil
}

// reportFailure records a Warning event on the pod, once per distinct
// message, as kubelet does for sandbox failures.
func (k *Kubelet) reportFailure(pod *corev1.Pod, reason string, err error) {
	msg := err.Error()
	if len(msg) > 1024 {
		msg = msg[:1024]
	}
	key := pod.Namespace + "/" + pod.Name
	k.mu.Lock()
	same := k.lastEvent[key] == msg
	k.lastEvent[key] = msg
	k.mu.Unlock()
	if same {
		return
	}
	now := metav1.NewTime(time.Now())
	ev := &corev1.Event{
		ObjectMeta: metav1.ObjectMeta{
			Name:      fmt.Sprintf("%s.%x", pod.Name, now.UnixNano()),
			Namespace: pod.Namespace,
		},
		InvolvedObject: corev1.ObjectReference{
			Kind: "Pod", APIVersion: "v1", Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID,
		},
		Reason:         reason,
		Message:        strings.TrimSpace(msg),
		Type:           corev1.EventTypeWarning,
		Source:         corev1.EventSource{Component: "devkubelet", Host: k.cfg.NodeName},
		FirstTimestamp: now,
		LastTimestamp:  now,
		Count:          1,
	}
	ctx, cancel := context.WithTimeout(context.Background(), apiTimeout)
	defer cancel()
	if _, err := k.cs.CoreV1().Events(pod.Namespace).Create(ctx, ev, metav1.CreateOptions{}); err != nil {
		k.log.Debug("cannot record event", "pod", key, "error", err)
	}
}
