package realnode

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/cellium/cellium/test/harness"
)

// TestCoreDNSWithItsRBAC runs the cached CoreDNS build as a process on
// 127.0.0.1 against a harness API server, with the Corefile of the
// cluster DNS's ConfigMap (its ports moved to free ones of 127.0.0.1, the
// API server reached through a kubeconfig) and a token of its
// ServiceAccount, so with exactly the manifest's ClusterRole: it becomes
// ready (the kubernetes plugin listed and watched what it needs), answers
// the cluster's names (a Service of the test, the kubernetes Service), and
// fails a name outside the cluster at once (nothing is forwarded). No node,
// no root. Skips unless CoreDNS is cached (make coredns-binary) or
// CELLIUM_REAL_NODE=1, which builds it.
func TestCoreDNSWithItsRBAC(t *testing.T) {
	if testing.Short() {
		t.Skip("starts an API server")
	}
	bins, missing, err := harness.CachedNodeBinaries()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(bins.CoreDNS); err != nil || slices.Contains(missing, "coredns") {
		if os.Getenv(realNodeEnv) != "1" {
			t.Skip("CoreDNS not built yet: run `make coredns-binary` (or make node-binaries) once")
		}
		if bins, err = harness.EnsureNodeBinaries(t.Context(), nil, harness.NodeGroupCoreDNS); err != nil {
			t.Fatal(err)
		}
	}
	ctx := t.Context()
	c := harness.ForTest(t, harness.Options{})
	cs := c.Clientset()

	dnsIP, err := DNSServiceIP("10.96.0.0/16") // the harness's default Service range
	if err != nil {
		t.Fatal(err)
	}
	objs, err := CoreDNSObjects(CoreDNSImageName(bins.CoreDNSVersion), dnsIP)
	if err != nil {
		t.Fatal(err)
	}
	// Everything but the Deployment: CoreDNS runs here as a process.
	var apply []*unstructured.Unstructured
	var corefile string
	for _, o := range objs {
		switch o.GetKind() {
		case "Deployment":
			continue
		case "ConfigMap":
			corefile, _, _ = unstructured.NestedString(o.Object, "data", "Corefile")
		}
		apply = append(apply, o)
	}
	if err := c.ApplyObjects(ctx, apply); err != nil {
		t.Fatal(err)
	}
	kubeconfig, err := c.ServiceAccountKubeconfig(ctx, metav1.NamespaceSystem, "coredns")
	if err != nil {
		t.Fatal(err)
	}

	ports, err := freePorts(4)
	if err != nil {
		t.Fatal(err)
	}
	local := func(i int) string { return "127.0.0.1:" + strconv.Itoa(ports[i]) }
	conf, err := hostCorefile(corefile, kubeconfig, ports)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	confPath := filepath.Join(dir, "Corefile")
	if err := os.WriteFile(confPath, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	logPath := filepath.Join(dir, "coredns.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close()
	cmd := exec.Command(bins.CoreDNS, "-conf", confPath)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
		if t.Failed() {
			t.Logf("--- CoreDNS's log ---\n%s", tail(logPath, 40))
		}
	})

	// Ready: the kubernetes plugin has synced (with its RBAC only).
	eventually(t, time.Minute, "CoreDNS ready", func() error {
		select {
		case err := <-exited:
			exited <- err
			t.Fatalf("CoreDNS exited: %v\n%s", err, tail(logPath, 20))
		default:
		}
		resp, err := http.Get("http://" + local(2) + "/ready")
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("/ready: %s", resp.Status)
		}
		return nil
	})

	ns := c.TestNamespace(t)
	svc, err := cs.CoreV1().Services(ns).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "db"},
		Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 8080}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	r := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, local(0))
	}}
	for name, want := range map[string]string{
		"db." + ns + ".svc.cluster.local.":        svc.Spec.ClusterIP,
		"kubernetes.default.svc.cluster.local.":   "10.96.0.1",
		"kube-dns.kube-system.svc.cluster.local.": dnsIP.String(),
	} {
		eventually(t, 10*time.Second, name, func() error {
			qctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			defer cancel()
			addrs, err := r.LookupHost(qctx, name)
			if err != nil {
				return err
			}
			if len(addrs) != 1 || netip.MustParseAddr(addrs[0]).String() != want {
				return fmt.Errorf("%s is %v, want %s", name, addrs, want)
			}
			return nil
		})
	}
	// A name outside the cluster fails at once: CoreDNS answers it itself
	// (SERVFAIL), it has nowhere to forward it.
	qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	addrs, err := r.LookupHost(qctx, "example.com.")
	var dnsErr *net.DNSError
	if err == nil || !errors.As(err, &dnsErr) || dnsErr.IsTimeout || dnsErr.IsNotFound {
		t.Errorf("example.com: %v, %v; want a failed answer (SERVFAIL), not an address, NXDOMAIN or a timeout", addrs, err)
	}
	if log, _ := os.ReadFile(logPath); strings.Contains(string(log), "forbidden") {
		t.Errorf("CoreDNS was refused by the API server (its ClusterRole lacks a permission):\n%s", tail(logPath, 20))
	}
}

// hostCorefile turns the cluster DNS's Corefile into one for a CoreDNS
// process on this machine: the server on 127.0.0.1:ports[0], health,
// ready and prometheus on ports[1..3] of 127.0.0.1, the kubernetes plugin
// with kubeconfig (it has no in-cluster credentials here). Each of those
// lines must be in the Corefile as the manifest writes it.
func hostCorefile(corefile, kubeconfig string, ports []int) (string, error) {
	p := func(i int) string { return strconv.Itoa(ports[i]) }
	for _, r := range [][2]string{
		{".:53 {", ".:" + p(0) + " {\n    bind 127.0.0.1"},
		{"health {", "health 127.0.0.1:" + p(1) + " {"},
		{"ready\n", "ready 127.0.0.1:" + p(2) + "\n"},
		{"prometheus :9153", "prometheus 127.0.0.1:" + p(3)},
		{"kubernetes cluster.local in-addr.arpa ip6.arpa {", "kubernetes cluster.local in-addr.arpa ip6.arpa {\n       kubeconfig " + kubeconfig},
	} {
		if !strings.Contains(corefile, r[0]) {
			return "", fmt.Errorf("the Corefile has no %q:\n%s", r[0], corefile)
		}
		corefile = strings.Replace(corefile, r[0], r[1], 1)
	}
	return corefile, nil
}
