package parser

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cellium/cellium/statedb/policy"
)

func TestWorkloadOf(t *testing.T) {
	ctl := true
	pod := func(generate string, hash string, kind, name string) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", GenerateName: generate, Labels: map[string]string{}}}
		if hash != "" {
			p.Labels["pod-template-hash"] = hash
		}
		if kind != "" {
			p.OwnerReferences = []metav1.OwnerReference{{Kind: "Other", Name: "not-controller"}, {Kind: kind, Name: name, Controller: &ctl}}
		}
		return p
	}
	tests := []struct {
		name       string
		pod        *corev1.Pod
		kind, want string
	}{
		{"deployment", pod("web-7d4b9c-", "7d4b9c", "ReplicaSet", "web-7d4b9c"), "Deployment", "web"},
		{"bare replicaset", pod("rs-", "", "ReplicaSet", "rs"), "ReplicaSet", "rs"},
		{"daemonset", pod("agent-", "", "DaemonSet", "agent"), "DaemonSet", "agent"},
		{"statefulset", pod("db-", "", "StatefulSet", "db"), "StatefulSet", "db"},
		{"cronjob", pod("backup-29012345-", "", "Job", "backup-29012345"), "CronJob", "backup"},
		{"plain job", pod("once-", "", "Job", "once"), "Job", "once"},
		{"no generated name", pod("", "", "ReplicaSet", "rs"), "", ""},
		{"no controller", pod("x-", "", "", ""), "", ""},
	}
	for _, tc := range tests {
		w := WorkloadOf(tc.pod)
		if w.GetKind() != tc.kind || w.GetName() != tc.want {
			t.Errorf("%s: got %s/%s, want %s/%s", tc.name, w.GetKind(), w.GetName(), tc.kind, tc.want)
		}
	}
}

func TestPolicyOfAndMatchType(t *testing.T) {
	p := PolicyOf("CiliumClusterwideNetworkPolicy/allow-dns[2]", 3)
	if p.Kind != "CiliumClusterwideNetworkPolicy" || p.Name != "allow-dns" || p.Namespace != "" || p.Revision != 3 || len(p.Labels) != 2 {
		t.Errorf("CCNP: %v", p)
	}
	if l := PolicyList([]string{"NetworkPolicy/a/x", "NetworkPolicy/a/x[1]", "NetworkPolicy/b/x"}, 1); len(l) != 2 {
		t.Errorf("PolicyList merged %d policies, want 2", len(l))
	}
	for _, tc := range []struct {
		k    policy.Key
		want uint32
	}{
		{policy.NewKey(5, policy.Ingress, 0, 0, 0), PolicyMatchL3Only},
		{policy.NewKey(0, policy.Ingress, 0, 0, 0), PolicyMatchAll},
		{policy.NewKey(5, policy.Ingress, 6, 0, 0), PolicyMatchL3Proto},
		{policy.NewKey(0, policy.Ingress, 6, 0, 0), PolicyMatchProtoOnly},
		{policy.NewKey(5, policy.Ingress, 6, 80, 16), PolicyMatchL3L4},
		{policy.NewKey(0, policy.Ingress, 6, 80, 16), PolicyMatchL4Only},
	} {
		if got := MatchType(tc.k); got != tc.want {
			t.Errorf("MatchType(%s) = %d, want %d", tc.k, got, tc.want)
		}
	}
}
