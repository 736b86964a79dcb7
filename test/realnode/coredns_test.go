package realnode

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// TestDNSServiceIP: the kube-dns ClusterIP is the 10th address of the
// Service range, as kubeadm's (10.96.0.10 of 10.96.0.0/12).
func TestDNSServiceIP(t *testing.T) {
	for cidr, want := range map[string]string{
		"10.96.0.0/12":     "10.96.0.10",
		DefaultServiceCIDR: "10.237.0.10",
		"10.237.5.7/16":    "10.237.0.10",
	} {
		got, err := DNSServiceIP(cidr)
		if err != nil || got != netip.MustParseAddr(want) {
			t.Errorf("DNSServiceIP(%s) = %s, %v; want %s", cidr, got, err, want)
		}
	}
	for _, bad := range []string{"10.1.1.0/29", "fd00::/108", "nonsense"} {
		if got, err := DNSServiceIP(bad); err == nil {
			t.Errorf("DNSServiceIP(%s) = %s, want an error", bad, got)
		}
	}
}

// TestCoreDNSObjects: the cluster DNS's manifest renders kubeadm's objects
// with the image and ClusterIP given; the Corefile answers the cluster's
// zones and forwards nothing off the machine; the ClusterRole lets CoreDNS
// list and watch what its kubernetes plugin reads.
func TestCoreDNSObjects(t *testing.T) {
	objs, err := CoreDNSObjects("registry.k8s.io/coredns/coredns:v1.15.0", netip.MustParseAddr("10.237.0.10"))
	if err != nil {
		t.Fatal(err)
	}
	byKind := map[string]*unstructured.Unstructured{}
	var kinds []string
	for _, o := range objs {
		kinds = append(kinds, o.GetKind()+"/"+o.GetName())
		byKind[o.GetKind()] = o
		if ns := o.GetNamespace(); ns != "" && ns != "kube-system" {
			t.Errorf("%s %s in namespace %s", o.GetKind(), o.GetName(), ns)
		}
	}
	want := []string{"ServiceAccount/coredns", "ClusterRole/system:coredns", "ClusterRoleBinding/system:coredns",
		"ConfigMap/coredns", "Deployment/coredns", "Service/kube-dns"}
	if !slices.Equal(kinds, want) {
		t.Fatalf("objects %v, want %v", kinds, want)
	}

	ip, _, _ := unstructured.NestedString(byKind["Service"].Object, "spec", "clusterIP")
	if ip != "10.237.0.10" {
		t.Errorf("kube-dns ClusterIP %q", ip)
	}
	containers, _, _ := unstructured.NestedSlice(byKind["Deployment"].Object, "spec", "template", "spec", "containers")
	if len(containers) != 1 {
		t.Fatalf("Deployment containers %v", containers)
	}
	c := containers[0].(map[string]any)
	if c["image"] != "registry.k8s.io/coredns/coredns:v1.15.0" || c["imagePullPolicy"] != "Never" {
		t.Errorf("CoreDNS image %v, pull policy %v", c["image"], c["imagePullPolicy"])
	}

	corefile, _, _ := unstructured.NestedString(byKind["ConfigMap"].Object, "data", "Corefile")
	for _, want := range []string{"kubernetes cluster.local in-addr.arpa ip6.arpa", "ready", "health"} {
		if !strings.Contains(corefile, want) {
			t.Errorf("Corefile lacks %q:\n%s", want, corefile)
		}
	}
	for _, never := range []string{"forward", "proxy", "/etc/resolv.conf"} {
		if strings.Contains(corefile, never) {
			t.Errorf("Corefile has %q: names outside the cluster would leave the machine:\n%s", never, corefile)
		}
	}

	rules, _, _ := unstructured.NestedSlice(byKind["ClusterRole"].Object, "rules")
	allowed := map[string]bool{}
	for _, r := range rules {
		rule := r.(map[string]any)
		verbs, _, _ := unstructured.NestedStringSlice(rule, "verbs")
		resources, _, _ := unstructured.NestedStringSlice(rule, "resources")
		if slices.Contains(verbs, "list") && slices.Contains(verbs, "watch") {
			for _, res := range resources {
				allowed[res] = true
			}
		}
	}
	for _, res := range []string{"endpointslices", "services", "pods", "namespaces"} {
		if !allowed[res] {
			t.Errorf("the ClusterRole does not let CoreDNS list and watch %s: %v", res, rules)
		}
	}
}
