package lb

import (
	"net/netip"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// loadBalancerSourceRanges reach a LoadBalancer Service's LoadBalancer
// and externalIP frontends (IPv4, masked, sorted, unique; bad and IPv6
// entries left out), its NodePort frontends only with
// SourceRangeAllTypes, never its ClusterIP; not without
// SourceRangeCheck, kube-proxy replacement or type LoadBalancer; and a
// change of them alone makes a frontend differ (SameAs).
func TestDeriveFrontendsSourceRanges(t *testing.T) {
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "s"}, Spec: corev1.ServiceSpec{
		Type: corev1.ServiceTypeLoadBalancer, ClusterIP: "10.96.0.20", ExternalIPs: []string{"198.51.100.7"},
		Ports:                    []corev1.ServicePort{{Name: "a", Port: 80, NodePort: 30080}},
		LoadBalancerSourceRanges: []string{"192.168.1.77/24", "10.0.0.0/8", "bogus", "2001:db8::/32", " 10.0.0.0/8 "},
	}}
	svc.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "172.16.0.10"}}
	want := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("192.168.1.0/24")}
	node := []netip.Addr{netip.MustParseAddr("192.168.56.11")}
	ranges := func(o Options) map[string][]netip.Prefix {
		out := map[string][]netip.Prefix{}
		for _, f := range DeriveFrontends(svc, nil, o) {
			out[f.TypeName()+" "+f.Address.String()] = f.SourceRanges
		}
		return out
	}
	check := func(name string, got map[string][]netip.Prefix, with ...string) {
		t.Helper()
		for fe, rs := range got {
			if slices.Contains(with, fe) != (len(rs) > 0) || (len(rs) > 0 && !slices.Equal(rs, want)) {
				t.Errorf("%s: %s has ranges %v, want %v only on %q", name, fe, rs, want, with)
			}
		}
	}
	lbAndExt := []string{"LoadBalancer 172.16.0.10:80/TCP", "ExternalIPs 198.51.100.7:80/TCP"}
	check("default", ranges(Options{KubeProxyReplacement: true, NodeAddrs: node, SourceRangeCheck: true}), lbAndExt...)
	check("all types", ranges(Options{KubeProxyReplacement: true, NodeAddrs: node, SourceRangeCheck: true, SourceRangeAllTypes: true}),
		append(lbAndExt, "NodePort 192.168.56.11:30080/TCP", "NodePort 0.0.0.0:30080/TCP")...)
	check("check off", ranges(Options{KubeProxyReplacement: true, NodeAddrs: node}))
	check("no kube-proxy replacement", ranges(Options{SourceRangeCheck: true}))
	np := svc.DeepCopy()
	np.Spec.Type = corev1.ServiceTypeNodePort
	for _, f := range DeriveFrontends(np, nil, Options{KubeProxyReplacement: true, NodeAddrs: node, SourceRangeCheck: true, SourceRangeAllTypes: true}) {
		if len(f.SourceRanges) > 0 {
			t.Errorf("type NodePort: %v has ranges %v", f.Address, f.SourceRanges)
		}
	}
	a := &Frontend{Service: "ns/s", SourceRanges: want}
	b := *a
	b.SourceRanges = want[:1]
	if a.SameAs(&b) {
		t.Error("SameAs ignores the source ranges")
	}
	if got := a.FlagsString(); got != "source-ranges=10.0.0.0/8+192.168.1.0/24" {
		t.Errorf("FlagsString %q", got)
	}
}
