package realnode

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cellium/cellium/test/privileged"
)

// TestPrivilegedRealClusterDNS is make up's cluster DNS (realnode.Up):
// CoreDNS, built from tools/coredns and packed as upstream's image, runs
// Ready in kube-system behind the kube-dns Service at the 10th address of
// the Service range; it reached the API server from its pod through the
// kubernetes Service, whose endpoint is the node's IP. The kubelet gives
// pods that nameserver and the cluster's search domains; a pod resolves
// kubernetes.default.svc.cluster.local and reaches a Service by its name
// (demoapp --resolve, --get); the test process's own query to the
// kube-dns ClusterIP is answered, and a name outside the cluster is not
// (nothing is forwarded off the machine).
func TestPrivilegedRealClusterDNS(t *testing.T) {
	privileged.Require(t)
	bins := nodeBinaries(t)
	ctx := t.Context()
	logger := slog.New(slog.NewTextHandler(t.Output(), nil))
	dir, err := os.MkdirTemp("", "crd-")
	if err != nil {
		t.Fatal(err)
	}
	c, err := Up(ctx, ClusterOptions{Dir: dir, NodeBinaries: bins, Logger: logger})
	if err != nil {
		_ = os.RemoveAll(dir)
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			for _, name := range []string{Kubelet, KubeProxy} {
				t.Logf("--- last lines of %s ---\n%s", name, tail(c.Node.LogFile(name), 25))
			}
			logs, _ := filepath.Glob(filepath.Join(c.Node.Dir, "pod-logs", "*", "*", "*.log"))
			for _, l := range logs {
				t.Logf("--- last lines of %s ---\n%s", l, tail(l, 15))
			}
		}
		if err := c.Stop(context.Background()); err != nil {
			t.Errorf("stop: %v", err)
		}
		if left := c.Leftovers(); len(left) > 0 {
			t.Errorf("the cluster left on the host:\n  %s", strings.Join(left, "\n  "))
		}
		if t.Failed() {
			t.Logf("cluster logs kept in %s", dir)
			return
		}
		_ = os.RemoveAll(dir)
	})
	cs := c.Control.Clientset()

	// The kube-dns Service at the 10th address, as kubeadm's.
	wantIP, err := DNSServiceIP(DefaultServiceCIDR)
	if err != nil {
		t.Fatal(err)
	}
	if wantIP.String() != "10.237.0.10" || c.DNSServiceIP != wantIP {
		t.Fatalf("cluster DNS address %s (Cluster.DNSServiceIP %s), want 10.237.0.10", wantIP, c.DNSServiceIP)
	}
	svc, err := cs.CoreV1().Services(metav1.NamespaceSystem).Get(ctx, DNSService, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if svc.Spec.ClusterIP != wantIP.String() {
		t.Errorf("Service %s has ClusterIP %s, want %s", DNSService, svc.Spec.ClusterIP, wantIP)
	}

	// CoreDNS runs Ready on the node, from upstream's image name.
	pods, err := cs.CoreV1().Pods(metav1.NamespaceSystem).List(ctx, metav1.ListOptions{LabelSelector: "k8s-app=kube-dns"})
	if err != nil {
		t.Fatal(err)
	}
	if len(pods.Items) != 1 {
		t.Fatalf("%d CoreDNS pods, want 1", len(pods.Items))
	}
	dnsPod := pods.Items[0]
	if dnsPod.Status.Phase != corev1.PodRunning || !podReady(&dnsPod) || dnsPod.Spec.NodeName != c.Node.Name {
		t.Fatalf("CoreDNS pod %s: %s, ready %v, on %q", dnsPod.Name, dnsPod.Status.Phase, podReady(&dnsPod), dnsPod.Spec.NodeName)
	}
	if img := dnsPod.Spec.Containers[0].Image; img != CoreDNSImageName(bins.CoreDNSVersion) || !strings.HasPrefix(img, "registry.k8s.io/coredns/coredns:v1.") {
		t.Errorf("CoreDNS image %s, want %s", img, CoreDNSImageName(bins.CoreDNSVersion))
	}

	// The kubernetes Service's endpoint is the node's IP (a pod reaches
	// it; 127.0.0.1 would be the pod's own loopback).
	eps, err := cs.DiscoveryV1().EndpointSlices(metav1.NamespaceDefault).List(ctx, metav1.ListOptions{LabelSelector: "kubernetes.io/service-name=kubernetes"})
	if err != nil {
		t.Fatal(err)
	}
	var apiAddrs []string
	for _, s := range eps.Items {
		for _, e := range s.Endpoints {
			apiAddrs = append(apiAddrs, e.Addresses...)
		}
	}
	if !slices.Equal(apiAddrs, []string{c.Node.IP.String()}) {
		t.Errorf("the kubernetes Service's endpoints %v, want the node IP %s", apiAddrs, c.Node.IP)
	}

	demo, err := c.DeployDemo(ctx, 2*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	// The kubelet wrote the cluster's nameserver and search domains into
	// the pods' resolv.conf.
	pid := taskPID(t, c.Node, DemoNamespace, demo[0].Name)
	conf, err := os.ReadFile(fmt.Sprintf("/proc/%d/root/etc/resolv.conf", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"nameserver " + wantIP.String(), "search demo.svc.cluster.local svc.cluster.local cluster.local", "ndots:5"} {
		if !strings.Contains(string(conf), want) {
			t.Errorf("resolv.conf of %s lacks %q:\n%s", demo[0].Name, want, conf)
		}
	}

	// A pod resolves the API server's Service name, and reaches the
	// Service db by its short name (search domains) and by <svc>.<ns>.
	resolved := runDemoClient(t, c, "dns-resolve", "--resolve", "kubernetes.default.svc.cluster.local")
	t.Logf("in a pod, kubernetes.default.svc.cluster.local is %s", strings.TrimSpace(resolved))
	if strings.TrimSpace(resolved) != "10.237.0.1" {
		t.Errorf("kubernetes.default.svc.cluster.local resolved in a pod to %q, want 10.237.0.1", resolved)
	}
	for _, url := range []string{"http://db:8080/", "http://db.demo:8080/"} {
		got := runDemoClient(t, c, fmt.Sprintf("dns-get-%d", strings.Count(url, ".")), "--get", url)
		t.Logf("in a pod, GET %s: %q", url, got)
		if got != "hello from db-1\n" {
			t.Errorf("GET %s in a pod: %q, want hello from db-1", url, got)
		}
	}

	// The test process asks the kube-dns ClusterIP itself.
	r := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, net.JoinHostPort(wantIP.String(), "53"))
	}}
	eventually(t, 30*time.Second, "an answer from "+wantIP.String(), func() error {
		qctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		defer cancel()
		addrs, err := r.LookupHost(qctx, "db.demo.svc.cluster.local.")
		if err != nil {
			return err
		}
		if !slices.Equal(addrs, []string{demo[len(demo)-1].ServiceIP}) {
			return fmt.Errorf("db.demo.svc.cluster.local is %v, want %s", addrs, demo[len(demo)-1].ServiceIP)
		}
		t.Logf("from the test process, %s answers db.demo.svc.cluster.local: %v", wantIP, addrs)
		return nil
	})
	// Names outside the cluster are not forwarded anywhere: CoreDNS fails
	// them itself.
	qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	addrs, err := r.LookupHost(qctx, "example.com.")
	var dnsErr *net.DNSError
	t.Logf("example.com through the cluster DNS: %v", err)
	if err == nil || !errors.As(err, &dnsErr) || dnsErr.IsTimeout {
		t.Errorf("example.com through the cluster DNS: %v, %v; want a failed answer (no forwarding), not a timeout", addrs, err)
	}
}

// runDemoClient runs the demo image with args as pod name in
// DemoNamespace (restartPolicy Never, the cluster's DNS policy) and
// returns its log once it succeeded; the test fails if it does not.
func runDemoClient(t *testing.T, c *Cluster, name string, args ...string) string {
	t.Helper()
	ctx := t.Context()
	cs := c.Control.Clientset()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: DemoNamespace},
		Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyNever,
			Containers: []corev1.Container{{
				Name: "app", Image: DemoImage, ImagePullPolicy: corev1.PullNever,
				Args: args,
			}},
			AutomountServiceAccountToken: new(bool),
		},
	}
	if _, err := cs.CoreV1().Pods(DemoNamespace).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var phase corev1.PodPhase
	eventually(t, time.Minute, "pod "+name+" finishing", func() error {
		p, err := cs.CoreV1().Pods(DemoNamespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		phase = p.Status.Phase
		if phase != corev1.PodSucceeded && phase != corev1.PodFailed {
			return fmt.Errorf("pod %s is %s", name, phase)
		}
		return nil
	})
	rc, err := cs.CoreV1().Pods(DemoNamespace).GetLogs(name, &corev1.PodLogOptions{}).Stream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	out, err := io.ReadAll(rc)
	if err != nil {
		t.Fatal(err)
	}
	if phase != corev1.PodSucceeded {
		t.Fatalf("pod %s (demoapp %s) %s: %s", name, strings.Join(args, " "), phase, out)
	}
	return string(out)
}
