package e2enetpol

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

// DNSPattern matches the conformance specs that resolve names through the
// cluster's DNS server: the DNS specs that dig Service, pod and
// ExternalName records, and the Services specs whose reachability check
// (framework/service's CheckServiceReachability) first connects to the
// Service by its name (`nc -v -t -w 2 <name> 80` from an exec pod, which
// needs kube-dns and the pod's search path) or nslookups an ExternalName,
// before it tries the ClusterIP and the node ports: the basic and
// multiport endpoint specs, NodePort, the four type changes and the four
// session affinity specs (11). The other "[sig-network] DNS" specs need no
// server: "/etc/hosts entries" and "pods for Hostname" look names up in
// the pod's /etc/hosts (getent), "configurable pod DNS nameservers" reads
// the pod's resolv.conf.
const DNSPattern = `\[sig-network\] DNS should (?:provide DNS for (?:the cluster|services|pods for Subdomain|ExternalName services)|resolve DNS of partial qualified names for services)` +
	`|\[sig-network\] Services should (?:serve a basic endpoint from pods|serve multiport endpoints from pods|be able to create a functioning NodePort service|be able to change the type from |have session affinity work for |be able to switch session affinity for )`

// ClusterDomainPattern matches the specs that need the kubelet's cluster
// domain to be the suite's (cluster.local): those of [DNSPattern], and
// the two that look up "<hostname>.<subdomain>.<namespace>.svc.cluster.local"
// in the /etc/hosts the kubelet writes.
const ClusterDomainPattern = DNSPattern + `|\[sig-network\] DNS should provide (?:/etc/hosts entries for the cluster|DNS for pods for Hostname)`

// SuiteClusterDomain is the cluster domain the suite's names end in
// (e2e.test's --dns-domain default).
const SuiteClusterDomain = "cluster.local"

// kubeDNS is where the suite (and the kubelet's clusterDNS) expects the
// cluster's DNS server: the Service kube-system/kube-dns.
const (
	kubeDNSNamespace = "kube-system"
	kubeDNSName      = "kube-dns"
)

// kubeletDNS is the part of a kubelet's configuration (its /configz)
// about the pods' DNS.
type kubeletDNS struct {
	ClusterDomain string   `json:"clusterDomain"`
	ClusterDNS    []string `json:"clusterDNS"`
}

// DNSRule returns the rules that skip the specs needing what the cluster
// at kubeconfig lacks, each with what was found, in this order (a spec
// gets the first rule's reason):
//
//   - no kube-dns Service in kube-system, or a kubelet whose clusterDNS
//     is not its ClusterIP (the pods ask another server): the specs that
//     resolve names through the cluster's DNS ([DNSPattern]);
//   - a kubelet whose clusterDomain is not cluster.local: the pods'
//     /etc/hosts and search path do not have the names the suite looks up
//     ([ClusterDomainPattern]).
//
// nil when the cluster has all that.
//
// Errors: the cluster cannot be reached, a node's /configz cannot be
// read.
func DNSRule(ctx context.Context, kubeconfig string) ([]SkipRule, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("detect cluster DNS: %w", err)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("detect cluster DNS: %w", err)
	}
	nodes, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("detect cluster DNS: %w", err)
	}
	var domainRules []SkipRule
	var kubelets []kubeletDNS
	for _, n := range nodes.Items {
		raw, err := cs.CoreV1().RESTClient().Get().Resource("nodes").Name(n.Name).SubResource("proxy").Suffix("configz").DoRaw(ctx)
		if err != nil {
			return nil, fmt.Errorf("detect cluster DNS: node %s: /configz: %w", n.Name, err)
		}
		var c struct {
			Kubelet kubeletDNS `json:"kubeletconfig"`
		}
		if err := json.Unmarshal(raw, &c); err != nil {
			return nil, fmt.Errorf("detect cluster DNS: node %s: /configz: %w", n.Name, err)
		}
		kubelets = append(kubelets, c.Kubelet)
		if c.Kubelet.ClusterDomain != SuiteClusterDomain && domainRules == nil {
			domainRules = append(domainRules, SkipRule{Pattern: ClusterDomainPattern, Reason: fmt.Sprintf(
				"DNS: the kubelet of node %s has clusterDomain %q, the suite's names end in %s", n.Name, c.Kubelet.ClusterDomain, SuiteClusterDomain)})
		}
	}
	svc, err := cs.CoreV1().Services(kubeDNSNamespace).Get(ctx, kubeDNSName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return append([]SkipRule{{Pattern: DNSPattern, Reason: "DNS: the cluster has no kube-dns Service in kube-system (no cluster DNS server)"}}, domainRules...), nil
	}
	if err != nil {
		return nil, fmt.Errorf("detect cluster DNS: %w", err)
	}
	for i, k := range kubelets {
		if !slices.Contains(k.ClusterDNS, svc.Spec.ClusterIP) {
			return append([]SkipRule{{Pattern: DNSPattern, Reason: fmt.Sprintf(
				"DNS: the kubelet of node %s has clusterDNS %v, not kube-dns's ClusterIP %s", nodes.Items[i].Name, k.ClusterDNS, svc.Spec.ClusterIP)}}, domainRules...), nil
		}
	}
	// A kube-dns whose server does not answer is the cluster's failure to
	// report: the specs run.
	return domainRules, nil
}
