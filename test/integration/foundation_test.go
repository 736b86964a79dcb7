package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextclientset "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	"github.com/cellium/cellium/api/client/clientset/versioned"
	"github.com/cellium/cellium/api/v1/models"
	"github.com/cellium/cellium/install"
)

// TestOperatorAndAgent runs both binaries against the real apiserver: the
// operator registers the CRDs and leads; the agent mirrors its node's pods
// into statedb; both stop on SIGTERM within 5 s.
func TestOperatorAndAgent(t *testing.T) {
	c := cluster.Get(t)
	ctx := t.Context()
	// Each binary runs with its ServiceAccount's token, bound to the roles
	// of install/kubernetes/cellium.yaml: never as system:masters.
	opKubeconfig, err := c.OperatorKubeconfig(ctx)
	if err != nil {
		t.Fatal(err)
	}
	agentKubeconfig, err := c.AgentKubeconfig(ctx)
	if err != nil {
		t.Fatal(err)
	}

	// The operator: CRDs, leader election, health. The chart lets it hold
	// a Lease in its own namespace only.
	opHealth := freeAddr(t)
	operator := startDaemon(t, "cellium-operator", nil, "--k8s-kubeconfig-path="+opKubeconfig,
		"--operator-api-serve-addr="+opHealth, "--leader-election-namespace="+install.Namespace)

	apiext := apiextclientset.NewForConfigOrDie(c.RESTConfig())
	want := map[string]string{
		"ciliumendpoints.cilium.io":                  "v2",
		"ciliumidentities.cilium.io":                 "v2",
		"ciliumnodes.cilium.io":                      "v2",
		"ciliumnetworkpolicies.cilium.io":            "v2",
		"ciliumclusterwidenetworkpolicies.cilium.io": "v2",
		"ciliumendpointslices.cilium.io":             "v2alpha1",
		"ciliumloadbalancerippools.cilium.io":        "v2",
	}
	eventually(t, 60*time.Second, "the seven CRDs Established", func() error {
		for name := range want {
			crd, err := apiext.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if !established(crd) {
				return fmt.Errorf("%s not Established yet", name)
			}
		}
		return nil
	})
	// All seven are served: discovery lists them.
	served := map[string]string{}
	for _, gv := range []string{"cilium.io/v2", "cilium.io/v2alpha1"} {
		eventually(t, 30*time.Second, "discovery of "+gv, func() error {
			list, err := c.Clientset().Discovery().ServerResourcesForGroupVersion(gv)
			if err != nil {
				return err
			}
			for _, r := range list.APIResources {
				if !strings.Contains(r.Name, "/") {
					served[r.Name+".cilium.io"] = strings.TrimPrefix(gv, "cilium.io/")
				}
			}
			return nil
		})
	}
	for name, version := range want {
		if served[name] != version {
			t.Errorf("%s not served at %s (served: %v)", name, version, served)
		}
	}

	// Leader: the Lease names this operator.
	eventually(t, 30*time.Second, "the operator to hold the Lease", func() error {
		lease, err := c.Clientset().CoordinationV1().Leases(install.Namespace).Get(ctx, "cellium-operator-resource-lock", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if lease.Spec.HolderIdentity == nil || *lease.Spec.HolderIdentity == "" {
			return fmt.Errorf("no holder")
		}
		return nil
	})
	eventually(t, 10*time.Second, "operator /healthz", func() error {
		resp, err := http.Get("http://" + opHealth + "/healthz")
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("status %s", resp.Status)
		}
		return nil
	})

	// `kubectl get cep` columns come from the CRD: the server-side table.
	ns := c.TestNamespace(t)
	checkCEPTable(t, c.RESTConfig(), ns)

	// The agent, for node-a, whose Node object a kubelet would have
	// registered (the local node, and with it the ipcache's host entries,
	// come from it).
	nodeA := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a"},
		Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "192.0.2.10"}}}}
	if _, err := c.Clientset().CoreV1().Nodes().Create(ctx, nodeA, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create node node-a: %v", err)
	}
	t.Cleanup(func() {
		_ = c.Clientset().CoreV1().Nodes().Delete(context.Background(), "node-a", metav1.DeleteOptions{})
	})
	socket := filepath.Join(t.TempDir(), "cellium.sock")
	metricsAddr := freeAddr(t)
	agent := startDaemon(t, "cellium-agent", []string{"K8S_NODE_NAME=node-a"}, "--k8s-kubeconfig-path="+agentKubeconfig,
		"--socket-path="+socket, "--prometheus-serve-addr="+metricsAddr,
		"--state-dir="+t.TempDir(), "--write-cni-conf-when-ready=",
		"--enable-endpoint-routes=false", "--enable-bpf-datapath=false", "--enable-endpoint-health-checking=false") // never program this machine's own namespace

	pods := c.Clientset().CoreV1().Pods(ns)
	for _, p := range []struct{ name, node string }{{"web-1", "node-a"}, {"web-2", "node-a"}, {"elsewhere", "node-b"}} {
		if _, err := pods.Create(ctx, pod(p.name, p.node), metav1.CreateOptions{}); err != nil {
			t.Fatalf("create pod %s: %v", p.name, err)
		}
	}
	api := unixClient(socket)
	podsInAgent := func() ([]string, error) {
		var objs []corev1.Pod
		if err := getJSON(api, "http://agent/v1/statedb/k8s-pods", &objs); err != nil {
			return nil, err
		}
		var names []string
		for _, p := range objs {
			if p.Namespace == ns {
				names = append(names, p.Name)
			}
		}
		slices.Sort(names)
		return names, nil
	}
	eventually(t, 30*time.Second, "node-a's pods in the agent's table", func() error {
		names, err := podsInAgent()
		if err != nil {
			return err
		}
		if !slices.Equal(names, []string{"web-1", "web-2"}) {
			return fmt.Errorf("pods in table: %v", names)
		}
		return nil
	})
	eventually(t, 30*time.Second, "every table initialized", func() error {
		var tables []models.TableInfo
		if err := getJSON(api, "http://agent/v1/statedb", &tables); err != nil {
			return err
		}
		if len(tables) < 12 {
			return fmt.Errorf("want the 9 resource tables and the agent's own, got %+v", tables)
		}
		for _, tbl := range tables {
			if !tbl.Initialized {
				return fmt.Errorf("table %s not initialized: pending %v", tbl.Name, tbl.Pending)
			}
		}
		return nil
	})

	if err := pods.Delete(ctx, "web-1", metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "the deleted pod to leave the table", func() error {
		names, err := podsInAgent()
		if err != nil {
			return err
		}
		if !slices.Equal(names, []string{"web-2"}) {
			return fmt.Errorf("pods in table: %v", names)
		}
		return nil
	})

	// Metrics: table sizes and hook durations.
	eventually(t, 10*time.Second, "agent metrics", func() error {
		resp, err := http.Get("http://" + metricsAddr + "/metrics")
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		var b strings.Builder
		_, _ = fmt.Fprint(&b, "")
		buf := make([]byte, 1<<20)
		for {
			n, err := resp.Body.Read(buf)
			b.Write(buf[:n])
			if err != nil {
				break
			}
		}
		for _, m := range []string{`cellium_statedb_table_objects{table="k8s-pods"}`, `cellium_hive_hook_duration_seconds{hook="agent-api-server",module="agent.infra.agent-api",phase="start"}`} {
			if !strings.Contains(b.String(), m) {
				return fmt.Errorf("metric %s missing", m)
			}
		}
		return nil
	})

	// Both stop cleanly on SIGTERM within 5 s.
	if d := agent.sigterm(t); d > 5*time.Second {
		t.Errorf("agent took %s to stop", d)
	} else {
		t.Logf("agent stopped %s after SIGTERM", d)
	}
	if d := operator.sigterm(t); d > 5*time.Second {
		t.Errorf("operator took %s to stop", d)
	} else {
		t.Logf("operator stopped %s after SIGTERM", d)
	}
}

func established(crd *apiextv1.CustomResourceDefinition) bool {
	for _, c := range crd.Status.Conditions {
		if c.Type == apiextv1.Established && c.Status == apiextv1.ConditionTrue {
			return true
		}
	}
	return false
}

func pod(name, node string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"app": "web"}},
		Spec: corev1.PodSpec{
			NodeName:   node,
			Containers: []corev1.Container{{Name: "c", Image: "example.invalid/none"}},
		},
	}
}

// checkCEPTable creates a CiliumEndpoint and reads it back as the
// server-side table kubectl prints: the columns and cells come from the
// CRD's printer columns.
func checkCEPTable(t *testing.T, rc interface{}, ns string) {
	t.Helper()
	c := cluster.Get(t)
	cs := versioned.NewForConfigOrDie(c.RESTConfig())
	cep := &ciliumv2.CiliumEndpoint{
		ObjectMeta: metav1.ObjectMeta{Name: "web-0", Namespace: ns},
		Status: ciliumv2.EndpointStatus{
			ID:       42,
			Identity: &ciliumv2.EndpointIdentity{ID: 12345, Labels: []string{"k8s:app=web"}},
			State:    "ready",
			Networking: &ciliumv2.EndpointNetworking{
				Addressing: ciliumv2.AddressPairList{{IPV4: "10.0.0.7"}},
				NodeIP:     "192.0.2.1",
			},
		},
	}
	if _, err := cs.CiliumV2().CiliumEndpoints(ns).Create(t.Context(), cep, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create CEP: %v", err)
	}
	raw, err := cs.CiliumV2().RESTClient().Get().Namespace(ns).Resource("ciliumendpoints").
		SetHeader("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io").DoRaw(t.Context())
	if err != nil {
		t.Fatalf("get CEP table: %v", err)
	}
	var table metav1.Table
	if err := json.Unmarshal(raw, &table); err != nil {
		t.Fatal(err)
	}
	var cols []string
	for _, col := range table.ColumnDefinitions {
		cols = append(cols, fmt.Sprintf("%s/%d", col.Name, col.Priority))
	}
	wantCols := []string{"Name/0", "Security Identity/0", "Ingress Enforcement/1", "Egress Enforcement/1", "Endpoint State/0", "IPv4/0", "IPv6/0"}
	if !slices.Equal(cols, wantCols) {
		t.Errorf("CEP columns %v, want %v", cols, wantCols)
	}
	if len(table.Rows) != 1 {
		t.Fatalf("want 1 row, got %d", len(table.Rows))
	}
	got := fmt.Sprint(table.Rows[0].Cells)
	if want := "[web-0 12345 <nil> <nil> ready 10.0.0.7 <nil>]"; got != want {
		t.Errorf("CEP row %s, want %s", got, want)
	}
	_ = context.Background
}
