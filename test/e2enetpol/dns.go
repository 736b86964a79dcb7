package e2enetpol

import (
	"context"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

// DNSPattern matches the conformance specs that resolve names through the
// cluster's DNS server (dig of Service, pod and ExternalName records).
// The other "[sig-network] DNS" specs do not: "/etc/hosts entries" and
// "pods for Hostname" look names up in the pod's /etc/hosts (getent),
// "configurable pod DNS nameservers" reads the pod's resolv.conf.
const DNSPattern = `\[sig-network\] DNS should (?:provide DNS for (?:the cluster|services|pods for Subdomain|ExternalName services)|resolve DNS of partial qualified names for services)`

// kubeDNS is where the suite (and the kubelet's clusterDNS) expects the
// cluster's DNS server: the Service kube-system/kube-dns.
const (
	kubeDNSNamespace = "kube-system"
	kubeDNSName      = "kube-dns"
)

// DNSRule returns the rule that skips the specs needing the cluster's DNS
// server ([DNSPattern]) when the cluster at kubeconfig has no kube-dns
// Service in kube-system; nil when it has one.
//
// Errors: the cluster cannot be reached.
func DNSRule(ctx context.Context, kubeconfig string) ([]SkipRule, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("detect cluster DNS: %w", err)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("detect cluster DNS: %w", err)
	}
	_, err = cs.CoreV1().Services(kubeDNSNamespace).Get(ctx, kubeDNSName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return []SkipRule{{Pattern: DNSPattern, Reason: "DNS: the cluster has no kube-dns Service in kube-system (no cluster DNS server)"}}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("detect cluster DNS: %w", err)
	}
	// A kube-dns Service whose server does not answer is the cluster's
	// failure to report: the specs run.
	return nil, nil
}
