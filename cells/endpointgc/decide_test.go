package endpointgc

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
)

type fakeLookups struct {
	pods  map[string]*corev1.Pod
	nodes map[string]bool
}

func (f fakeLookups) pod(ns, name string) (*corev1.Pod, bool) {
	p, ok := f.pods[ns+"/"+name]
	return p, ok
}
func (f fakeLookups) nodeExists(name string) bool { return f.nodes[name] }

func TestDecide(t *testing.T) {
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	const interval = 5 * time.Minute
	pod := func(name, uid string, phase corev1.PodPhase) *corev1.Pod {
		return &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: types.UID(uid)},
			Status:     corev1.PodStatus{Phase: phase},
		}
	}
	look := fakeLookups{
		pods: map[string]*corev1.Pod{
			"ns/running":   pod("running", "uid-running", corev1.PodRunning),
			"ns/pending":   pod("pending", "uid-pending", corev1.PodPending),
			"ns/succeeded": pod("succeeded", "uid-succeeded", corev1.PodSucceeded),
			"ns/failed":    pod("failed", "uid-failed", corev1.PodFailed),
			// A pod that happens to have a health endpoint's name.
			"ns/cilium-health-podnode": pod("cilium-health-podnode", "uid-hp", corev1.PodRunning),
		},
		nodes: map[string]bool{"node-a": true, "podnode": false},
	}
	owner := func(kind, name, uid string) metav1.OwnerReference {
		return metav1.OwnerReference{APIVersion: "v1", Kind: kind, Name: name, UID: types.UID(uid)}
	}
	cep := func(name string, age time.Duration, owners ...metav1.OwnerReference) *ciliumv2.CiliumEndpoint {
		return &ciliumv2.CiliumEndpoint{ObjectMeta: metav1.ObjectMeta{
			Namespace: "ns", Name: name, UID: "cep-uid",
			CreationTimestamp: metav1.NewTime(now.Add(-age)),
			OwnerReferences:   owners,
		}}
	}
	old := time.Hour
	for _, tc := range []struct {
		name   string
		cep    *ciliumv2.CiliumEndpoint
		delete bool
		reason string
	}{
		{"live pod owner", cep("running", old, owner("Pod", "running", "uid-running")), false, "is live"},
		{"pending pod owner", cep("pending", old, owner("Pod", "pending", "uid-pending")), false, "is live"},
		{"pod gone", cep("gone", old, owner("Pod", "gone", "uid-gone")), true, "is gone"},
		{"pod succeeded", cep("succeeded", old, owner("Pod", "succeeded", "uid-succeeded")), true, "has finished (Succeeded)"},
		{"pod failed", cep("failed", old, owner("Pod", "failed", "uid-failed")), true, "has finished (Failed)"},
		{"pod re-created with another UID", cep("running", old, owner("Pod", "running", "uid-old")), true, "is another pod"},
		{"owner without UID, live pod", cep("running", old, owner("Pod", "running", "")), false, "is live"},
		{"young, pod gone", cep("gone", interval-time.Second, owner("Pod", "gone", "uid-gone")), false, "less than one GC interval"},
		{"exactly one interval old, pod gone", cep("gone", interval, owner("Pod", "gone", "uid-gone")), true, "is gone"},
		{"one of two pod owners live", cep("x", old, owner("Pod", "gone", "u"), owner("Pod", "running", "uid-running")), false, "is live"},
		{"two pod owners gone", cep("x", old, owner("Pod", "gone", "u"), owner("Pod", "gone2", "v")), true, "gone2 is gone"},
		{"owned by something else", cep("gone", old, owner("ReplicaSet", "rs", "u")), false, "owned by ReplicaSet/rs"},
		{"no owner, pod by name live", cep("running", old), false, "is live"},
		{"no owner, pod by name gone", cep("gone", old), true, "is gone"},
		{"no owner, pod by name finished", cep("failed", old), true, "has finished"},
		{"health endpoint, node exists", cep("cilium-health-node-a", old), false, "health endpoint of CiliumNode node-a"},
		{"health endpoint, node gone", cep("cilium-health-node-b", old), true, "node-b, which is gone"},
		{"health endpoint owned by the CiliumNode, node gone", cep("cilium-health-node-b", old, owner("CiliumNode", "node-b", "n")), true, "which is gone"},
		{"health endpoint owned by the CiliumNode, node exists", cep("cilium-health-node-a", old, owner("CiliumNode", "node-a", "n")), false, "health endpoint"},
		{"young health endpoint, node gone", cep("cilium-health-node-b", time.Second), false, "less than one GC interval"},
		{"pod named like a health endpoint, live", cep("cilium-health-podnode", old), false, "is live"},
		{"health-named CEP of a gone pod", cep("cilium-health-node-a", old, owner("Pod", "cilium-health-node-a", "u")), true, "is gone"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			del, reason := decide(tc.cep, now, interval, look)
			if del != tc.delete || !strings.Contains(reason, tc.reason) {
				t.Errorf("decide = %v %q, want %v and a reason containing %q", del, reason, tc.delete, tc.reason)
			}
		})
	}
}
