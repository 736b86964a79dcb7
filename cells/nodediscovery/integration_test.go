package nodediscovery_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"path/filepath"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextclientset "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	"github.com/cellium/cellium/api/client/clientset/versioned"
	"github.com/cellium/cellium/api/crds"
	"github.com/cellium/cellium/api/v1/models"
	"github.com/cellium/cellium/cells/agentapi"
	"github.com/cellium/cellium/cells/crdregister"
	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/cells/hive/hivetest"
	"github.com/cellium/cellium/cells/ipam"
	"github.com/cellium/cellium/cells/k8s"
	"github.com/cellium/cellium/cells/nodediscovery"
	"github.com/cellium/cellium/cells/statedir"
)

// agentAPI is a client of the agent API's unix socket.
type agentAPI struct{ c *http.Client }

func newAgentAPI(t *testing.T, socket string) *agentAPI {
	tr := &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", socket)
	}}
	t.Cleanup(tr.CloseIdleConnections)
	return &agentAPI{c: &http.Client{Timeout: 40 * time.Second, Transport: tr}}
}

// call sends a request and decodes a 2xx answer into out; it returns the
// status code and the body.
func (a *agentAPI) call(t *testing.T, method, path string, out any) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, "http://agent"+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := a.c.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if out != nil && resp.StatusCode/100 == 2 {
		if err := json.Unmarshal(body, out); err != nil {
			t.Fatalf("%s %s: decode %q: %v", method, path, body, err)
		}
	}
	return resp.StatusCode, string(bytes.TrimSpace(body))
}

// startAgent runs what this test needs of the agent against the real API
// server: the k8s client and resource tables, the state directory, IPAM,
// node discovery and the API socket.
func startAgent(t *testing.T, kubeconfig, stateDir, socket string) *hive.Hive {
	t.Helper()
	h := hivetest.New(t, []string{
		"--k8s-kubeconfig-path=" + kubeconfig, "--state-dir=" + stateDir, "--socket-path=" + socket,
	},
		k8s.ClientCell, statedir.Cell, agentapi.Cell,
		hive.Provide(k8s.NodeNameFromEnv),
		k8s.AgentResourcesCell,
		ipam.Cell, nodediscovery.Cell,
	)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := h.Start(ctx); err != nil {
		t.Fatal(err)
	}
	return h
}

// TestIntegrationCiliumNodeAndIPAM runs the cells against the real API
// server: the agent publishes its CiliumNode from the Node object; once the
// "operator" (this test) writes the pod CIDRs, the CiliumNode gets the
// CiliumInternalIP and health IP, POST /v1/ipam hands out addresses of the
// CIDR, and a restarted agent still holds them.
func TestIntegrationCiliumNodeAndIPAM(t *testing.T) {
	if testing.Short() {
		t.Skip("integration test against kube-apiserver from test/harness; run without -short")
	}
	c := cluster.Get(t)
	ctx := t.Context()
	log := hivetest.Logger(t)

	apiext, err := apiextclientset.NewForConfig(c.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	all, err := crds.All()
	if err != nil {
		t.Fatal(err)
	}
	if err := crdregister.Register(ctx, apiext.ApiextensionsV1().CustomResourceDefinitions(), all, log); err != nil {
		t.Fatal(err)
	}
	cilium, err := versioned.NewForConfig(c.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	cns := cilium.CiliumV2().CiliumNodes()

	const nodeName = "it-node-ipam"
	t.Setenv("K8S_NODE_NAME", nodeName)
	nodes := c.Clientset().CoreV1().Nodes()
	node, err := nodes.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{
		Name: nodeName, Labels: map[string]string{"kubernetes.io/hostname": nodeName},
	}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx := context.Background()
		_ = nodes.Delete(ctx, nodeName, metav1.DeleteOptions{})
		_ = cns.Delete(ctx, nodeName, metav1.DeleteOptions{})
	})
	node.Status.Addresses = []corev1.NodeAddress{
		{Type: corev1.NodeInternalIP, Address: "192.168.50.10"},
		{Type: corev1.NodeHostName, Address: nodeName},
	}
	if _, err := nodes.UpdateStatus(ctx, node, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}

	stateDir := t.TempDir()
	socket := filepath.Join(t.TempDir(), "cellium.sock")
	h := startAgent(t, c.Kubeconfig(), stateDir, socket)
	stopped := false
	defer func() {
		if !stopped {
			_ = h.Stop(context.Background())
		}
	}()

	eventually(t, "the agent's CiliumNode", func() error {
		cn, err := cns.Get(ctx, nodeName, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if got := addrOf(cn, ciliumv2.NodeInternalIP); got != "192.168.50.10" {
			return fmt.Errorf("InternalIP %q", got)
		}
		if cn.Spec.BootID != bootID(t) {
			return fmt.Errorf("bootid %q", cn.Spec.BootID)
		}
		if len(cn.OwnerReferences) != 1 || cn.OwnerReferences[0].UID != node.UID {
			return fmt.Errorf("ownerReferences %v", cn.OwnerReferences)
		}
		return nil
	})

	// The operator's part, by hand.
	patch := []byte(`{"spec":{"ipam":{"podCIDRs":["10.200.7.0/24"]}}}`)
	if _, err := cns.Patch(ctx, nodeName, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	cidr := netip.MustParsePrefix("10.200.7.0/24")
	var health string
	eventually(t, "the CiliumInternalIP and health IP", func() error {
		cn, err := cns.Get(ctx, nodeName, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if got := addrOf(cn, ciliumv2.NodeCiliumInternalIP); got != "10.200.7.1" {
			return fmt.Errorf("CiliumInternalIP %q", got)
		}
		health = cn.Spec.HealthAddressing.IPv4
		if ip, err := netip.ParseAddr(health); err != nil || !cidr.Contains(ip) {
			return fmt.Errorf("health IP %q", health)
		}
		if !slices.Equal(cn.Spec.IPAM.PodCIDRs, []string{"10.200.7.0/24"}) {
			t.Fatalf("podCIDRs overwritten: %v", cn.Spec.IPAM.PodCIDRs)
		}
		return nil
	})

	api := newAgentAPI(t, socket)
	var resp models.IPAMResponse
	code, body := api.call(t, "POST", "/v1/ipam?owner=default/pod-a", &resp)
	if code != http.StatusCreated || resp.IPv4 == nil {
		t.Fatalf("POST /v1/ipam = %d %s", code, body)
	}
	podIP := netip.MustParseAddr(resp.IPv4.IP)
	if !cidr.Contains(podIP) || resp.IPv4.Gateway != "10.200.7.1" || resp.IPv4.IP == health ||
		!slices.Equal(resp.IPv4.CIDRs, []string{"10.200.7.0/24"}) {
		t.Fatalf("POST /v1/ipam = %+v", resp.IPv4)
	}
	eventually(t, "GET /v1/node listing the node", func() error {
		var nodeList []models.Node
		if code, body := api.call(t, "GET", "/v1/node", &nodeList); code != http.StatusOK {
			return fmt.Errorf("GET /v1/node = %d %s", code, body)
		}
		i := slices.IndexFunc(nodeList, func(n models.Node) bool { return n.Name == nodeName })
		if i < 0 || !nodeList[i].Local || nodeList[i].HealthIPv4 != health || !slices.Equal(nodeList[i].PodCIDRs, []string{"10.200.7.0/24"}) {
			return fmt.Errorf("GET /v1/node = %+v", nodeList)
		}
		return nil
	})

	// Restart: the address is still held by its owner, the health IP kept.
	if err := h.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	h = startAgent(t, c.Kubeconfig(), stateDir, socket)
	code, body = api.call(t, "POST", "/v1/ipam/"+podIP.String()+"?owner=default/intruder", nil)
	if code != http.StatusConflict {
		t.Errorf("claim of a restored address by another owner = %d %s, want 409", code, body)
	}
	var again models.IPAMResponse
	if code, body := api.call(t, "POST", "/v1/ipam/"+podIP.String()+"?owner=default/pod-a", &again); code != http.StatusCreated {
		t.Errorf("re-claim by its owner = %d %s", code, body)
	}
	var list []models.IPAMAddress
	api.call(t, "GET", "/v1/ipam", &list)
	owners := map[string]string{}
	for _, a := range list {
		owners[a.IP] = a.Owner
	}
	if owners[podIP.String()] != "default/pod-a" || owners[health] != ipam.HealthOwner {
		t.Errorf("allocations after restart = %v", owners)
	}
	cn, err := cns.Get(ctx, nodeName, metav1.GetOptions{})
	if err != nil || cn.Spec.HealthAddressing.IPv4 != health {
		t.Errorf("health IP after restart = %+v, %v; want %s", cn.Spec.HealthAddressing, err, health)
	}
	if code, body := api.call(t, "DELETE", "/v1/ipam/"+podIP.String(), nil); code != http.StatusOK {
		t.Errorf("DELETE = %d %s", code, body)
	}
	if err := h.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	stopped = true
}
