package doctor_test

import (
	"net/netip"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cellium/cellium/cells/doctor"
	"github.com/cellium/cellium/statedb/endpoints"
	"github.com/cellium/cellium/statedb/health"
	"github.com/cellium/cellium/statedb/identity"
	"github.com/cellium/cellium/statedb/ipcache"
	"github.com/cellium/cellium/statedb/nodes"
)

func podEP(id uint16, pod, ip string, ident identity.NumericIdentity) *endpoints.Endpoint {
	return &endpoints.Endpoint{ID: id, PodNamespace: "default", PodName: pod, CEPNamespace: "default", CEPName: pod,
		IPv4: netip.MustParseAddr(ip), Identity: ident}
}

func runningPod(name, ip string) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
		Spec: corev1.PodSpec{NodeName: "n"}, Status: corev1.PodStatus{PodIP: ip, Phase: corev1.PodRunning}}
}

func TestCheck(t *testing.T) {
	tests := []struct {
		name string
		f    doctor.Facts
		want []string // "kind object: message fragment"
	}{
		{
			name: "nothing known, nothing found",
			f:    doctor.Facts{Endpoints: []*endpoints.Endpoint{podEP(1, "a", "10.0.0.5", 0)}},
		},
		{
			name: "refused parts of CiliumNodes",
			f: doctor.Facts{ClusterNodesKnown: true, ClusterNodes: []*nodes.Node{
				{Name: "a"},
				{Name: "b", Refused: []nodes.Refusal{
					{Field: "spec.ipam.podCIDRs[0]", Value: "10.0.1.0/24", Reason: nodes.RefusedDuplicatePodCIDR, Holder: "a"},
					{Field: "spec.addresses[0]", Value: "300.1.1.1", Reason: nodes.RefusedMalformedAddress},
				}},
			}},
			want: []string{
				`node-refused node b spec.addresses[0]: CiliumNode b: spec.addresses[0] "300.1.1.1": malformed-address is not used`,
				`node-refused node b spec.ipam.podCIDRs[0]: CiliumNode b: spec.ipam.podCIDRs[0] "10.0.1.0/24": duplicate-pod-cidr (held by node a)`,
			},
		},
		{
			name: "refused CEPs",
			f: doctor.Facts{RefusedCEPsKnown: true, RefusedCEPs: []*ipcache.RefusedCEP{
				{CEP: "default/evil", Reason: ipcache.RefusedAddressOutsideNode, Identity: 3000, NodeIP: "192.168.0.2"},
			}},
			want: []string{`cep-refused cep default/evil: CiliumEndpoint default/evil (identity 3000, node 192.168.0.2) is refused by the ipcache: address-outside-node`},
		},
		{
			name: "unreachable node",
			f: doctor.Facts{NodePathsKnown: true, NodePaths: []*health.NodePath{
				{Node: "b", Type: "node", Protocol: "icmp", IP: netip.MustParseAddr("192.168.0.2"), Probed: true, Reachable: true},
				{Node: "b", Type: "endpoint", Protocol: "http", IP: netip.MustParseAddr("10.0.1.9"), Probed: true, Error: "timeout"},
				{Node: "c", Type: "node", Protocol: "icmp", IP: netip.MustParseAddr("192.168.0.3")}, // not probed yet
			}},
			want: []string{`node-unreachable node b: node b does not answer: endpoint http to 10.0.1.9: timeout`},
		},
		{
			name: "address allocated to another owner",
			f: doctor.Facts{Endpoints: []*endpoints.Endpoint{podEP(1, "a", "10.0.0.5", 0)}, AllocationsKnown: true,
				Allocations: []doctor.Allocation{{IP: netip.MustParseAddr("10.0.0.5"), Owner: "default/b"}}},
			want: []string{`ip-owner-mismatch 10.0.0.5: allocated to "default/b" but used by endpoint 1 (default/a)`},
		},
		{
			name: "the pod's endpoint uses another address",
			f: doctor.Facts{Endpoints: []*endpoints.Endpoint{podEP(1, "a", "10.0.0.5", 0)}, AllocationsKnown: true,
				Allocations: []doctor.Allocation{
					{IP: netip.MustParseAddr("10.0.0.5"), Owner: "default/a"},
					{IP: netip.MustParseAddr("10.0.0.6"), Owner: "default/a"},
					{IP: netip.MustParseAddr("10.0.0.1"), Owner: "router"},
				}},
			want: []string{"leaked-ip 10.0.0.6: its owner's endpoint 1 uses 10.0.0.5 instead"},
		},
		{
			name: "an owner with more than the pod (a container ID) is the pod's",
			f: doctor.Facts{Endpoints: []*endpoints.Endpoint{podEP(1, "a", "10.0.0.5", 0)}, AllocationsKnown: true,
				Allocations: []doctor.Allocation{
					{IP: netip.MustParseAddr("10.0.0.5"), Owner: "default/a/c-123"},
					{IP: netip.MustParseAddr("10.0.0.6"), Owner: "default/ab c-9"},
				}},
			want: []string{`leaked-ip 10.0.0.6: allocated to "default/ab c-9" but no endpoint uses it`},
		},
		{
			name: "health endpoint's address must be owned by health",
			f: doctor.Facts{Endpoints: []*endpoints.Endpoint{{ID: 2, Health: true, IPv4: netip.MustParseAddr("10.0.0.2")}},
				AllocationsKnown: true, Allocations: []doctor.Allocation{{IP: netip.MustParseAddr("10.0.0.2"), Owner: "default/x"}}},
			want: []string{`ip-owner-mismatch 10.0.0.2: allocated to "default/x" but used by endpoint 2`},
		},
		{
			name: "pods: a running pod without endpoint; finished and host-network pods are fine; health has no pod",
			f: doctor.Facts{PodsKnown: true,
				Endpoints: []*endpoints.Endpoint{{ID: 2, Health: true, CEPName: "cilium-health-n", CEPNamespace: "kube-system"}},
				Pods: []*corev1.Pod{
					runningPod("lost", "10.0.0.7"),
					{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "done"}, Status: corev1.PodStatus{PodIP: "10.0.0.8", Phase: corev1.PodSucceeded}},
					{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "hostnet"}, Spec: corev1.PodSpec{HostNetwork: true}, Status: corev1.PodStatus{PodIP: "192.168.0.1"}},
					{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "new"}}, // no sandbox yet
				}},
			want: []string{"pod-without-endpoint pod default/lost: has IP 10.0.0.7 but no endpoint"},
		},
		{
			name: "identity with fewer references than users; reserved identities need none",
			f: doctor.Facts{IdentityRefsKnown: true, IdentityRefs: map[identity.NumericIdentity]int{70000: 1},
				Endpoints: []*endpoints.Endpoint{podEP(1, "a", "10.0.0.5", 70000), podEP(2, "b", "10.0.0.6", 70000),
					{ID: 3, Health: true, Identity: 4}}},
			want: []string{"identity-refcount identity 70000: has 1 references from this agent but 2 endpoints use it: the identity could be released while endpoints still use it"},
		},
		{
			name: "a veth not made by cellium-cni is still an orphan, said so",
			f:    doctor.Facts{LinksKnown: true, Links: []doctor.HostLink{{Name: "lxcmanual"}}},
			want: []string{"orphan-veth lxcmanual: no container recorded"},
		},
	}
	tests = append(tests, programTests()...)
	tests = append(tests, policyMapTests()...)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := doctor.Check(&tt.f)
			if got == nil {
				t.Fatal("Check returned nil, want an empty list")
			}
			if len(got) != len(tt.want) {
				t.Fatalf("findings %+v, want %d", got, len(tt.want))
			}
			for i, w := range tt.want {
				head, frag, _ := strings.Cut(w, ": ")
				if g := got[i].Kind + " " + got[i].Object; g != head || !strings.Contains(got[i].Message, frag) {
					t.Errorf("finding %d = %s: %q, want %s with %q", i, g, got[i].Message, head, frag)
				}
			}
		})
	}
}
