package main

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/cellium/cellium/api/client/clientset/versioned"
	"github.com/cellium/cellium/test/devkubelet"
	"github.com/cellium/cellium/test/devkubelet/devnode"
	"github.com/cellium/cellium/test/harness"
	"github.com/cellium/cellium/test/privileged"
)

func TestCheckRoot(t *testing.T) {
	err := checkRoot(1000, false)
	if !errors.Is(err, errNotRoot) {
		t.Fatalf("checkRoot(1000) = %v", err)
	}
	for _, want := range []string{"needs root", "network namespaces and veths", "sudo make up", "--control-plane-only"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("message %q lacks %q", err, want)
		}
	}
	if err := checkRoot(1000, true); err != nil {
		t.Errorf("control plane only, not root: %v", err)
	}
	if err := checkRoot(0, false); err != nil {
		t.Errorf("root: %v", err)
	}
}

func TestStopOrder(t *testing.T) {
	got := stopOrder([]string{"etcd", "kube-apiserver", "cellium-operator", "devkubelet", "cellium-agent"})
	want := []string{"devkubelet", "cellium-agent", "cellium-operator", "kube-apiserver", "etcd"}
	if !slices.Equal(got, want) {
		t.Errorf("stopOrder = %v, want %v (the kubelet first: it needs the agent to tear down its pods)", got, want)
	}
	if got := stopOrder([]string{"etcd", "kube-apiserver"}); !slices.Equal(got, []string{"kube-apiserver", "etcd"}) {
		t.Errorf("control plane only: %v", got)
	}
}

// TestPrivilegedUpDown runs what `make up` runs: the control plane, the
// operator, the agent and the devkubelet, with the demo pods running and
// their CiliumEndpoints ready; down stops everything and leaves no
// network namespace or veth behind.
func TestPrivilegedUpDown(t *testing.T) {
	privileged.Require(t)
	ctx := t.Context()
	bins, err := devnode.BuildBinaries(ctx, filepath.Join(t.TempDir(), "bin"),
		devnode.Agent, devnode.Operator, devnode.CNIPlugin, devnode.Kubelet)
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "devc-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = run(context.Background(), "down", "--dir", dir)
		_ = os.RemoveAll(dir)
	})
	out, err := run(ctx, "up", "--dir", dir, "--bin-dir", filepath.Dir(bins.Agent),
		"--node-name", "devc-node", "--node-ip", "127.0.0.3", "--cluster-pool-ipv4-cidr", "10.245.0.0/16",
		// Never program this machine's own routing table from a test.
		"--host-routing=false")
	if err != nil {
		for _, name := range []string{"cellium-agent", "cellium-operator", "devkubelet"} {
			b, _ := os.ReadFile(filepath.Join(dir, name+".log"))
			t.Logf("--- %s.log ---\n%s", name, b)
		}
		t.Fatalf("up: %v\n%s", err, out)
	}
	for _, want := range []string{"demo pods in namespace demo on node devc-node", "web-1", "web-2", "db-1",
		"kubeconfig: ", "get cep -A", "endpoint list", "ip netns exec cellium-demo-web-1-"} {
		if !strings.Contains(out, want) {
			t.Errorf("up's output lacks %q:\n%s", want, out)
		}
	}
	procs := []string{harness.Etcd, harness.KubeAPIServer, devnode.Operator, devnode.Kubelet, devnode.Agent}
	for _, name := range procs {
		if _, running, err := harness.ReadPidFile(filepath.Join(dir, name+".pid")); err != nil || !running {
			t.Errorf("%s not running after up (%v)", name, err)
		}
	}
	sbs, err := devkubelet.LoadSandboxes(filepath.Join(dir, kubeletStateDir))
	if err != nil || len(sbs) != len(demoPods) {
		t.Fatalf("sandboxes after up: %v, %v", sbs, err)
	}
	rc, err := clientcmd.BuildConfigFromFlags("", filepath.Join(dir, harness.KubeconfigFile))
	if err != nil {
		t.Fatal(err)
	}
	cilium := versioned.NewForConfigOrDie(rc)
	ceps, err := cilium.CiliumV2().CiliumEndpoints(demoNamespace).List(ctx, metav1.ListOptions{})
	if err != nil || len(ceps.Items) != len(demoPods) {
		t.Fatalf("CiliumEndpoints in %s: %v, %v", demoNamespace, ceps, err)
	}

	if out, err := run(ctx, "down", "--dir", dir); err != nil {
		t.Fatalf("down: %v\n%s", err, out)
	}
	for _, sb := range sbs {
		if _, err := os.Stat(sb.NetnsPath); !os.IsNotExist(err) {
			t.Errorf("netns %s left after down (%v)", sb.NetnsName(), err)
		}
		for _, name := range sb.HostInterfaces {
			if _, err := netlink.LinkByName(name); err == nil {
				t.Errorf("veth %s of %s left after down", name, sb.Key())
			}
		}
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("%s left after down", dir)
	}
}
