package k8s

import (
	"runtime"
	"testing"

	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
)

func slimTestCEP(name string, id int64, labels ...string) *ciliumv2.CiliumEndpoint {
	return &ciliumv2.CiliumEndpoint{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", UID: "u-1",
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "agent"}}},
		Status: ciliumv2.EndpointStatus{ID: 3, State: ciliumv2.EndpointStateReady, ServiceAccount: "sa",
			Identity:   &ciliumv2.EndpointIdentity{ID: id, Labels: labels},
			Networking: &ciliumv2.EndpointNetworking{NodeIP: "192.0.2.1", Addressing: ciliumv2.AddressPairList{{IPV4: "10.0.0.1"}}}},
	}
}

// The slimmed CEP says what the CEP says, but for the managed fields; the
// CEP is not changed; equal identities are one object, different ones
// are not.
func TestCEPSlimmer(t *testing.T) {
	s := newCEPSlimmer()
	a := slimTestCEP("a", 1000, "k8s:app=x", "k8s:io.kubernetes.pod.namespace=ns")
	orig := a.DeepCopy()
	sa := s.slim(a)
	if !equality.Semantic.DeepEqual(a, orig) {
		t.Error("slim changed its input")
	}
	want := orig.DeepCopy()
	want.ManagedFields = nil
	if !equality.Semantic.DeepEqual(sa, want) {
		t.Errorf("slimmed %+v, want %+v", sa, want)
	}
	sb := s.slim(slimTestCEP("b", 1000, "k8s:app=x", "k8s:io.kubernetes.pod.namespace=ns"))
	if sb.Status.Identity != sa.Status.Identity {
		t.Error("two CEPs of one identity do not share it")
	}
	for name, c := range map[string]*ciliumv2.CiliumEndpoint{
		"other labels":   slimTestCEP("c", 1000, "k8s:app=y", "k8s:io.kubernetes.pod.namespace=ns"),
		"no labels":      slimTestCEP("d", 1000),
		"other identity": slimTestCEP("e", 1001, "k8s:app=x", "k8s:io.kubernetes.pod.namespace=ns"),
	} {
		sc := s.slim(c)
		if sc.Status.Identity == sa.Status.Identity || !equality.Semantic.DeepEqual(sc.Status.Identity, c.Status.Identity) {
			t.Errorf("%s: identity %+v shared with %+v", name, sc.Status.Identity, sa.Status.Identity)
		}
	}
	// An identity no row uses any more is forgotten.
	sa, sb = nil, nil
	runtime.GC()
	s.sweepAt = 0
	s.slim(slimTestCEP("f", 2000))
	if _, ok := s.ids[1000]; ok {
		t.Errorf("identity 1000 still remembered: %d entries", len(s.ids))
	}
}

// The slimmed CiliumIdentity says what the identity says, but for the
// managed fields; equal metadata label maps are shared.
func TestIdentitySlimmer(t *testing.T) {
	s := newIdentitySlimmer()
	mk := func(name, ns string) *ciliumv2.CiliumIdentity {
		return &ciliumv2.CiliumIdentity{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"io.kubernetes.pod.namespace": ns},
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "agent"}}},
			SecurityLabels: map[string]string{"k8s:io.kubernetes.pod.namespace": ns, "k8s:app": name}}
	}
	a := mk("1000", "ns")
	orig := a.DeepCopy()
	sa := s.slim(a)
	want := orig.DeepCopy()
	want.ManagedFields = nil
	if !equality.Semantic.DeepEqual(a, orig) || !equality.Semantic.DeepEqual(sa, want) {
		t.Errorf("slimmed %+v, want %+v (input after: %+v)", sa, want, a)
	}
	sb, sc := s.slim(mk("1001", "ns")), s.slim(mk("1002", "other"))
	sa.Labels["probe"] = "x" // the maps are one: the probe shows in b
	if sb.Labels["probe"] != "x" {
		t.Error("equal metadata labels are not shared")
	}
	if sc.Labels["probe"] == "x" || sc.Labels["io.kubernetes.pod.namespace"] != "other" {
		t.Errorf("other labels %v share the map", sc.Labels)
	}
	if a.Labels["probe"] == "x" {
		t.Error("the input's map is shared")
	}
}
