package realnode

import (
	"bytes"
	"context"
	_ "embed"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"text/template"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/kubernetes"

	"github.com/cellium/cellium/install"
	"github.com/cellium/cellium/test/devkubelet/devnode"
	"github.com/cellium/cellium/test/harness"
	"github.com/cellium/cellium/test/ociimage"
)

// ClusterDomain is the cluster's DNS domain: the kubelet's clusterDomain
// and the zone CoreDNS answers for.
const ClusterDomain = "cluster.local"

// Names of the cluster DNS's objects in kube-system, as kubeadm names them.
const (
	CoreDNSDeployment = "coredns"
	DNSService        = "kube-dns"
)

// dnsServiceIndex is the offset of the kube-dns ClusterIP in the Service
// range: the 10th address, as kubeadm picks it (10.96.0.10 in 10.96.0.0/12).
const dnsServiceIndex = 10

//go:embed manifests/coredns.yaml
var corednsManifest string

var corednsTemplate = template.Must(template.New("coredns").Parse(corednsManifest))

// DNSServiceIP is the ClusterIP of the kube-dns Service in serviceCIDR: its
// 10th address.
//
// Errors: serviceCIDR is no IPv4 prefix or too small.
func DNSServiceIP(serviceCIDR string) (netip.Addr, error) {
	p, err := netip.ParsePrefix(serviceCIDR)
	if err != nil || !p.Addr().Is4() {
		return netip.Addr{}, fmt.Errorf("cluster DNS address: %q is no IPv4 prefix", serviceCIDR)
	}
	p = p.Masked()
	a := p.Addr()
	for range dnsServiceIndex {
		a = a.Next()
	}
	if !p.Contains(a) {
		return netip.Addr{}, fmt.Errorf("cluster DNS address: %s has no %dth address", p, dnsServiceIndex)
	}
	return a, nil
}

// CoreDNSImageName is the name of upstream's CoreDNS image of version
// (e.g. "v1.15.0"), under which [CoreDNSImage] packs the node's build.
func CoreDNSImageName(version string) string {
	return "registry.k8s.io/coredns/coredns:" + version
}

// CoreDNSImage packs bins.CoreDNS as the image CoreDNSImageName names, into
// the OCI archive dir/coredns.tar, and returns the archive's path and the
// image's name. Like upstream's image it holds /coredns as its
// entrypoint and nothing else (no shell); unlike it, it runs as root (the
// Deployment drops every capability but NET_BIND_SERVICE), since the
// packer sets no file capabilities.
//
// Errors: packing fails.
func CoreDNSImage(dir string, bins harness.NodeBinaries) (archive, name string, err error) {
	name = CoreDNSImageName(bins.CoreDNSVersion)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", "", fmt.Errorf("CoreDNS image: %w", err)
	}
	archive = filepath.Join(dir, safeName(name)+".tar")
	img := ociimage.Image{
		Name:       name,
		Entrypoint: []string{"/coredns"},
		Files:      []ociimage.File{{Path: "/coredns", Source: bins.CoreDNS}},
	}
	if _, err := ociimage.WriteFile(archive, img); err != nil {
		return "", "", fmt.Errorf("CoreDNS image: %w", err)
	}
	return archive, name, nil
}

// CoreDNSObjects are the objects of the cluster DNS (manifests/coredns.yaml):
// CoreDNS's ServiceAccount, ClusterRole and binding, the Corefile's
// ConfigMap, the Deployment running image and the kube-dns Service at
// clusterIP.
//
// Errors: the manifest does not render.
func CoreDNSObjects(image string, clusterIP netip.Addr) ([]*unstructured.Unstructured, error) {
	var b bytes.Buffer
	err := corednsTemplate.Execute(&b, struct {
		Image, Domain string
		ClusterIP     netip.Addr
	}{image, ClusterDomain, clusterIP})
	if err != nil {
		return nil, fmt.Errorf("render the CoreDNS manifest: %w", err)
	}
	return install.Objects(b.Bytes())
}

// DeployCoreDNS applies [CoreDNSObjects] to the cluster (server-side
// apply). It does not wait: see [WaitCoreDNS].
//
// Errors: as CoreDNSObjects; the API server refuses an object.
func DeployCoreDNS(ctx context.Context, c *harness.Cluster, image string, clusterIP netip.Addr) error {
	objs, err := CoreDNSObjects(image, clusterIP)
	if err != nil {
		return err
	}
	if err := c.ApplyObjects(ctx, objs); err != nil {
		return fmt.Errorf("deploy CoreDNS: %w", err)
	}
	return nil
}

// WaitCoreDNS waits until the CoreDNS Deployment has a ready replica (its
// readiness probe: the kubernetes plugin has synced with the API server,
// which it reached through the kubernetes Service) and the kube-dns
// Service has a ready endpoint.
//
// Errors: ctx ends first (with what is not ready).
func WaitCoreDNS(ctx context.Context, cs kubernetes.Interface) error {
	return devnode.WaitFor(ctx, nil, func() error {
		dep, err := cs.AppsV1().Deployments(metav1.NamespaceSystem).Get(ctx, CoreDNSDeployment, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if dep.Status.ReadyReplicas < 1 {
			return fmt.Errorf("Deployment %s: no ready replica", CoreDNSDeployment)
		}
		slices, err := cs.DiscoveryV1().EndpointSlices(metav1.NamespaceSystem).List(ctx, metav1.ListOptions{LabelSelector: "kubernetes.io/service-name=" + DNSService})
		if err != nil {
			return err
		}
		for _, s := range slices.Items {
			for _, e := range s.Endpoints {
				if e.Conditions.Ready != nil && *e.Conditions.Ready {
					return nil
				}
			}
		}
		return fmt.Errorf("Service %s: no ready endpoint", DNSService)
	})
}
