package main

import (
	"context"
	"net"
	"os"
	"strings"
	"testing"

	"github.com/cellium/cellium/statedb/routes"
	"github.com/cellium/cellium/test/harness"
	"github.com/cellium/cellium/test/privileged"
	"github.com/cellium/cellium/test/realnode"
)

// TestPrivilegedUpDownRealNode is make up and make down: `up --node real`
// starts the control plane and the real node with cellium from its chart,
// the cluster DNS and the demo pods and prints what to try; status lists the node's
// processes; down removes everything (realnode.ClusterLeftovers) and the
// directory. Needs the node binaries (make node-binaries): skipped without
// them unless CELLIUM_REAL_NODE=1, which builds them.
func TestPrivilegedUpDownRealNode(t *testing.T) {
	privileged.Require(t)
	if _, missing, err := harness.CachedNodeBinaries(); err != nil {
		t.Fatal(err)
	} else if len(missing) > 0 && os.Getenv("CELLIUM_REAL_NODE") != "1" {
		t.Skipf("real node skipped: %s not built yet; run `make node-binaries` once", strings.Join(missing, ", "))
	}
	// Another node with kube-proxy or host-routing agent on the machine is
	// waited for (realnode.Start).
	ctx := t.Context()
	dir, err := os.MkdirTemp("", "devr-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = run(context.Background(), "down", "--dir", dir)
		_ = os.RemoveAll(dir)
	})
	out, err := run(ctx, "up", "--dir", dir, "--node", "real")
	if err != nil {
		t.Fatalf("up: %v\n%s", err, out)
	}
	for _, want := range []string{"cellium installed from its chart", "web-1", "web-2", "db-1",
		// The chart sets CELLIUM_SOCK in the agent's container: no --host.
		"exec ds/cellium-agent -c cellium-agent -- cellium status",
		"exec web-1 -- demoapp --get http://10.236.", "logs web-2", "run hello", "make down",
		"cluster DNS: CoreDNS v1.", "Service kube-dns 10.237.0.10", "exec web-1 -- demoapp --get http://db.demo:8080/",
		// hubble-relay is deployed (Up waited for it) and how to reach it printed.
		"port-forward svc/hubble-relay 4245:80", "--pod demo/web-1 --follow"} {
		if !strings.Contains(out, want) {
			t.Errorf("up's output lacks %q:\n%s", want, out)
		}
	}
	st, err := run(ctx, "status", "--dir", dir)
	if err != nil {
		t.Errorf("status: %v\n%s", err, st)
	}
	for _, want := range []string{harness.KubeControllerManager, realnode.Containerd, realnode.Kubelet, realnode.KubeProxy, realnode.KubeScheduler} {
		if !strings.Contains(st, want) {
			t.Errorf("status lacks %s:\n%s", want, st)
		}
	}
	// down fails when realnode.ClusterLeftovers finds anything left.
	if out, err := run(ctx, "down", "--dir", dir); err != nil {
		t.Fatalf("down: %v\n%s", err, out)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("%s left after down", dir)
	}
	if _, err := net.InterfaceByName(routes.HostDevice); err == nil {
		t.Errorf("%s left after down", routes.HostDevice)
	}
	if _, err := realnode.NFT(ctx, "list", "table", "ip", "kube-proxy"); err == nil {
		t.Error("kube-proxy's nftables table left after down")
	}
}

// TestHubbleTry: up's Hubble hints reach the relay the way users do (a
// port-forward to the hubble-relay Service's port 80, then the CLI on
// localhost:4245), follow the demo pod, and name the exec form.
func TestHubbleTry(t *testing.T) {
	got := strings.Join(hubbleTry("kubectl --kubeconfig k", "/cache/hubble", "web-1"), "\n")
	for _, want := range []string{
		"kubectl --kubeconfig k -n kube-system port-forward svc/hubble-relay 4245:80",
		"/cache/hubble list nodes --server localhost:4245",
		"/cache/hubble observe --server localhost:4245 --pod demo/web-1 --follow",
		"kubectl --kubeconfig k -n kube-system exec ds/cellium-agent -c cellium-agent -- hubble observe",
		"kubectl --kubeconfig k -n kube-system port-forward deploy/cellium-operator 12000 &   # then open http://localhost:12000/",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("hints lack %q:\n%s", want, got)
		}
	}
	if got := strings.Join(hubbleTry("kubectl", "hubble", ""), "\n"); !strings.Contains(got, "hubble observe --server localhost:4245 --follow") {
		t.Errorf("hints without demo pods:\n%s", got)
	}
}
