package nodediscovery_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cilium/statedb"
	corev1 "k8s.io/api/core/v1"
	apiextclientset "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	k8serrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	k8sfake "k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"
	k8stesting "k8s.io/client-go/testing"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	"github.com/cellium/cellium/api/client/clientset/versioned"
	ciliumfake "github.com/cellium/cellium/api/client/clientset/versioned/fake"
	"github.com/cellium/cellium/api/v1/models"
	"github.com/cellium/cellium/cells/agentapi"
	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/cells/hive/hivetest"
	"github.com/cellium/cellium/cells/ipam"
	"github.com/cellium/cellium/cells/k8s"
	"github.com/cellium/cellium/cells/nodediscovery"
	"github.com/cellium/cellium/cells/statedir"
	ipamtables "github.com/cellium/cellium/statedb/ipam"
	k8stables "github.com/cellium/cellium/statedb/k8s"
	"github.com/cellium/cellium/statedb/nodes"
)

// fakeClientset is a k8s.Clientset over client-go's and cilium.io's fakes.
type fakeClientset struct {
	*k8sfake.Clientset
	cilium *ciliumfake.Clientset
}

func newFakeClientset() *fakeClientset {
	return &fakeClientset{Clientset: k8sfake.NewClientset(), cilium: ciliumfake.NewSimpleClientset()}
}

func (f *fakeClientset) Cilium() versioned.Interface              { return f.cilium }
func (f *fakeClientset) APIExtensions() apiextclientset.Interface { return nil }
func (f *fakeClientset) RESTConfig() *rest.Config                 { return &rest.Config{} }
func (f *fakeClientset) IsEnabled() bool                          { return true }

func (f *fakeClientset) ciliumNode(t *testing.T, name string) (*ciliumv2.CiliumNode, error) {
	t.Helper()
	return f.cilium.CiliumV2().CiliumNodes().Get(context.Background(), name, metav1.GetOptions{})
}

// fakeK8s stands in for the k8s resource cells: the nodes table written by
// the test, and the CiliumNodes table mirrored from the fake clientset
// (list, then watch; initialized after the list) like a reflector.
var fakeK8s = hive.Module("fake-k8s", "Fake Kubernetes resources",
	hive.Provide(
		k8stables.NewNodesTable, statedb.RWTable[*corev1.Node].ToTable,
		k8stables.NewCiliumNodesTable, statedb.RWTable[*ciliumv2.CiliumNode].ToTable,
	),
	hive.Invoke(func(db *statedb.DB, cns statedb.RWTable[*ciliumv2.CiliumNode], cs k8s.Clientset, jobs hive.Jobs) {
		txn := db.WriteTxn(cns)
		initDone := cns.RegisterInitializer(txn, "fake-reflector")
		txn.Commit()
		client := cs.Cilium().CiliumV2().CiliumNodes()
		var w watch.Interface
		jobs.Add(hive.Service("fake-reflector",
			func() (err error) {
				w, err = client.Watch(context.Background(), metav1.ListOptions{})
				return err
			},
			func(ctx context.Context, h hive.Health) {
				defer w.Stop()
				list, err := client.List(ctx, metav1.ListOptions{})
				if err != nil {
					h.Degraded("list", err)
					return
				}
				txn := db.WriteTxn(cns)
				for i := range list.Items {
					cns.Insert(txn, &list.Items[i])
				}
				initDone(txn)
				txn.Commit()
				for {
					select {
					case <-ctx.Done():
						return
					case ev, ok := <-w.ResultChan():
						if !ok {
							return
						}
						cn, ok := ev.Object.(*ciliumv2.CiliumNode)
						if !ok {
							continue
						}
						txn := db.WriteTxn(cns)
						if ev.Type == watch.Deleted {
							cns.Delete(txn, cn)
						} else {
							cns.Insert(txn, cn)
						}
						txn.Commit()
					}
				}
			}))
	}),
)

type env struct {
	h         *hive.Hive
	cs        *fakeClientset
	db        *statedb.DB
	k8sNodes  statedb.RWTable[*corev1.Node]
	nodeTable statedb.Table[*nodes.Node]
	local     nodediscovery.LocalNode
	allocs    statedb.Table[*ipamtables.Allocation]
	health    hive.HealthReporter
	client    *http.Client
}

// start runs nodediscovery with the real IPAM cell, the agent API and the
// fakes above.
func start(t *testing.T, cs *fakeClientset, stateDir string, args ...string) *env {
	t.Helper()
	e := &env{cs: cs}
	sock := filepath.Join(t.TempDir(), "cellium.sock")
	e.h = hivetest.New(t, append([]string{"--state-dir=" + stateDir, "--socket-path=" + sock}, args...),
		hive.Provide(
			func() k8s.NodeName { return "node1" },
			func() k8s.Clientset { return cs },
		),
		fakeK8s, statedir.Cell, ipam.Cell, nodediscovery.Cell, agentapi.Cell,
		hivetest.Capture(&e.db), hivetest.Capture(&e.k8sNodes), hivetest.Capture(&e.nodeTable),
		hivetest.Capture(&e.local), hivetest.Capture(&e.allocs), hivetest.Capture(&e.health),
	)
	if err := e.h.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.h.Stop(context.Background()) })
	e.client = &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", sock)
		},
	}}
	t.Cleanup(e.client.CloseIdleConnections)
	return e
}

func (e *env) stop(t *testing.T) {
	t.Helper()
	if err := e.h.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func (e *env) setNode(addrs ...corev1.NodeAddress) {
	txn := e.db.WriteTxn(e.k8sNodes)
	e.k8sNodes.Insert(txn, &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "node1", UID: "uid-1", Labels: map[string]string{"kubernetes.io/hostname": "node1"}},
		Status:     corev1.NodeStatus{Addresses: addrs},
	})
	txn.Commit()
}

var nodeAddrs = []corev1.NodeAddress{
	{Type: corev1.NodeHostName, Address: "node1"},
	{Type: corev1.NodeInternalIP, Address: "192.168.1.10"},
}

// operatorAssigns simulates the operator: it writes podCIDRs into the
// CiliumNode once it exists.
func operatorAssigns(t *testing.T, cs *fakeClientset, cidrs ...string) {
	t.Helper()
	eventually(t, "the CiliumNode to exist", func() error {
		cn, err := cs.ciliumNode(t, "node1")
		if err != nil {
			return err
		}
		cn.Spec.IPAM.PodCIDRs = cidrs
		_, err = cs.cilium.CiliumV2().CiliumNodes().Update(context.Background(), cn, metav1.UpdateOptions{})
		return err
	})
}

func eventually(t *testing.T, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s: %v", what, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func bootID(t *testing.T) string {
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		t.Skipf("no boot ID on this system: %v", err)
	}
	return strings.TrimSpace(string(b))
}

func addrOf(cn *ciliumv2.CiliumNode, typ ciliumv2.AddressType) string {
	for _, a := range cn.Spec.Addresses {
		if a.Type == typ {
			return a.IP
		}
	}
	return ""
}

func TestPublishesCiliumNode(t *testing.T) {
	cs := newFakeClientset()
	e := start(t, cs, t.TempDir())

	// Nothing is published before the Node has an InternalIP.
	e.setNode(corev1.NodeAddress{Type: corev1.NodeHostName, Address: "node1"})
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if _, err := e.local.Wait(ctx); err == nil || !strings.Contains(err.Error(), "InternalIP of node node1") {
		t.Errorf("LocalNode.Wait = %v, want a timeout naming the InternalIP", err)
	}
	if _, err := cs.ciliumNode(t, "node1"); !k8serrors.IsNotFound(err) {
		t.Errorf("CiliumNode created without an InternalIP: %v", err)
	}
	if s := partHealth(e, "nodediscovery", "job-local-node"); s.Level != hive.LevelDegraded || !strings.Contains(s.Error, "no InternalIP") {
		t.Errorf("health = %+v, want degraded naming the missing InternalIP", s)
	}

	e.setNode(nodeAddrs...)
	eventually(t, "the CiliumNode with the InternalIP and boot ID", func() error {
		cn, err := cs.ciliumNode(t, "node1")
		if err != nil {
			return err
		}
		if got := addrOf(cn, ciliumv2.NodeInternalIP); got != "192.168.1.10" {
			return fmt.Errorf("InternalIP %q", got)
		}
		if cn.Spec.BootID != bootID(t) {
			return fmt.Errorf("bootid %q", cn.Spec.BootID)
		}
		if len(cn.OwnerReferences) != 1 || cn.OwnerReferences[0].Kind != "Node" || cn.OwnerReferences[0].UID != "uid-1" {
			return fmt.Errorf("ownerReferences %v", cn.OwnerReferences)
		}
		return nil
	})
	if n, err := e.local.Wait(context.Background()); err != nil || n.InternalIP != netip.MustParseAddr("192.168.1.10") {
		t.Fatalf("LocalNode.Wait = %+v, %v", n, err)
	}

	operatorAssigns(t, cs, "10.0.3.0/24")
	var health string
	eventually(t, "the CiliumInternalIP and health IP", func() error {
		cn, err := cs.ciliumNode(t, "node1")
		if err != nil {
			return err
		}
		if got := addrOf(cn, ciliumv2.NodeCiliumInternalIP); got != "10.0.3.1" {
			return fmt.Errorf("CiliumInternalIP %q", got)
		}
		health = cn.Spec.HealthAddressing.IPv4
		if ip, err := netip.ParseAddr(health); err != nil || !netip.MustParsePrefix("10.0.3.0/24").Contains(ip) {
			return fmt.Errorf("health IP %q", health)
		}
		if !slices.Equal(cn.Spec.IPAM.PodCIDRs, []string{"10.0.3.0/24"}) {
			t.Fatalf("the operator's podCIDRs were overwritten: %v", cn.Spec.IPAM.PodCIDRs)
		}
		return nil
	})
	eventually(t, "the local node row", func() error {
		n, _ := e.local.Get()
		if n == nil || n.RouterIP.String() != "10.0.3.1" || n.HealthIPv4.String() != health ||
			!slices.Equal(n.PodCIDRs, []netip.Prefix{netip.MustParsePrefix("10.0.3.0/24")}) {
			return fmt.Errorf("local node %+v", n)
		}
		return nil
	})
	if held := ipamtables.OwnedBy(e.db.ReadTxn(), e.allocs, ipam.HealthOwner); len(held) != 1 || held[0].String() != health {
		t.Errorf("IPAM holds %v for %q, want %s", held, ipam.HealthOwner, health)
	}

	// Someone edits our fields: the agent puts them back, keeping theirs.
	cn, _ := cs.ciliumNode(t, "node1")
	cn.Spec.HealthAddressing.IPv4 = "10.9.9.9"
	cn.Spec.BootID = "tampered"
	cn.Labels["team"] = "blue"
	if _, err := cs.cilium.CiliumV2().CiliumNodes().Update(context.Background(), cn, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the CiliumNode repaired", func() error {
		cn, err := cs.ciliumNode(t, "node1")
		if err != nil {
			return err
		}
		if cn.Spec.HealthAddressing.IPv4 != health || cn.Spec.BootID != bootID(t) {
			return fmt.Errorf("health %q, bootid %q", cn.Spec.HealthAddressing.IPv4, cn.Spec.BootID)
		}
		if cn.Labels["team"] != "blue" {
			t.Fatalf("a label added by someone else was removed: %v", cn.Labels)
		}
		return nil
	})

	// Another node appears in the nodes table and in GET /v1/node.
	if _, err := cs.cilium.CiliumV2().CiliumNodes().Create(context.Background(), &ciliumv2.CiliumNode{
		ObjectMeta: metav1.ObjectMeta{Name: "node2"},
		Spec: ciliumv2.NodeSpec{
			Addresses: []ciliumv2.NodeAddress{{Type: ciliumv2.NodeInternalIP, IP: "192.168.1.11"}},
			IPAM:      ciliumv2.IPAMSpec{PodCIDRs: []string{"10.0.4.0/24"}},
		},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "GET /v1/node listing both nodes", func() error {
		var list []models.Node
		if err := getJSON(e.client, "/v1/node", &list); err != nil {
			return err
		}
		if len(list) != 2 || list[0].Name != "node1" || !list[0].Local || list[0].HealthIPv4 != health ||
			list[1].Name != "node2" || list[1].Local || !slices.Equal(list[1].PodCIDRs, []string{"10.0.4.0/24"}) {
			return fmt.Errorf("GET /v1/node = %+v", list)
		}
		return nil
	})
	if init, _ := e.nodeTable.Initialized(e.db.ReadTxn()); !init {
		t.Error("nodes table not initialized")
	}
	if err := cs.cilium.CiliumV2().CiliumNodes().Delete(context.Background(), "node2", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "node2 gone from the nodes table", func() error {
		if _, _, found := e.nodeTable.Get(e.db.ReadTxn(), nodes.NodeNameIndex.Query("node2")); found {
			return fmt.Errorf("still there")
		}
		return nil
	})

	// The CiliumNode deleted by someone: the agent creates it again.
	if err := cs.cilium.CiliumV2().CiliumNodes().Delete(context.Background(), "node1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the CiliumNode re-created", func() error {
		cn, err := cs.ciliumNode(t, "node1")
		if err != nil {
			return err
		}
		if cn.Spec.HealthAddressing.IPv4 != health || addrOf(cn, ciliumv2.NodeCiliumInternalIP) != "10.0.3.1" {
			return fmt.Errorf("re-created as %+v", cn.Spec)
		}
		return nil
	})
}

func TestHealthIPStableAcrossRestarts(t *testing.T) {
	cs := newFakeClientset()
	stateDir := t.TempDir()
	e := start(t, cs, stateDir)
	e.setNode(nodeAddrs...)
	operatorAssigns(t, cs, "10.0.3.0/24")
	healthIP := func(e *env) netip.Addr {
		t.Helper()
		var ip netip.Addr
		eventually(t, "the health IP", func() error {
			n, _ := e.local.Get()
			if n == nil || !n.HealthIPv4.IsValid() {
				return fmt.Errorf("local node %+v", n)
			}
			ip = n.HealthIPv4
			return nil
		})
		return ip
	}
	first := healthIP(e)
	e.stop(t)

	// Same state directory.
	e = start(t, cs, stateDir)
	e.setNode(nodeAddrs...)
	if got := healthIP(e); got != first {
		t.Errorf("health IP after restart = %v, want %v", got, first)
	}
	e.stop(t)

	// State lost (tmpfs after a reboot): the CiliumNode remembers it.
	e = start(t, cs, t.TempDir())
	e.setNode(nodeAddrs...)
	if got := healthIP(e); got != first {
		t.Errorf("health IP with an empty state directory = %v, want %v", got, first)
	}
	if held := ipamtables.OwnedBy(e.db.ReadTxn(), e.allocs, ipam.HealthOwner); len(held) != 1 {
		t.Errorf("health owns %v, want one address", held)
	}
}

func TestConflictsAreRetried(t *testing.T) {
	cs := newFakeClientset()
	if _, err := cs.cilium.CiliumV2().CiliumNodes().Create(context.Background(), &ciliumv2.CiliumNode{
		ObjectMeta: metav1.ObjectMeta{Name: "node1"},
		Spec:       ciliumv2.NodeSpec{IPAM: ciliumv2.IPAMSpec{PodCIDRs: []string{"10.0.3.0/24"}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var conflicts atomic.Int32
	cs.cilium.PrependReactor("update", "ciliumnodes", func(k8stesting.Action) (bool, runtime.Object, error) {
		if conflicts.Add(1) <= 3 {
			return true, nil, k8serrors.NewConflict(schema.GroupResource{Group: "cilium.io", Resource: "ciliumnodes"}, "node1", fmt.Errorf("the object has been modified"))
		}
		return false, nil, nil
	})
	e := start(t, cs, t.TempDir())
	e.setNode(nodeAddrs...)
	eventually(t, "the update through the conflicts", func() error {
		cn, err := cs.ciliumNode(t, "node1")
		if err != nil {
			return err
		}
		if addrOf(cn, ciliumv2.NodeInternalIP) != "192.168.1.10" || addrOf(cn, ciliumv2.NodeCiliumInternalIP) != "10.0.3.1" {
			return fmt.Errorf("spec %+v", cn.Spec)
		}
		return nil
	})
	if n := conflicts.Load(); n < 4 {
		t.Errorf("%d update attempts, want the 3 conflicts and a success", n)
	}
}

func TestAutoCreateDisabled(t *testing.T) {
	cs := newFakeClientset()
	e := start(t, cs, t.TempDir(), "--auto-create-cilium-node-resource=false")
	e.setNode(nodeAddrs...)
	n, err := e.local.Wait(context.Background())
	if err != nil || n.InternalIP.String() != "192.168.1.10" {
		t.Fatalf("LocalNode.Wait = %+v, %v", n, err)
	}
	// No reconciler publishes the row: no job for it exists, so the
	// CiliumNode cannot appear later either.
	jobs := 0
	for _, s := range e.health.Statuses() {
		if strings.Contains(s.ID, "reconcile-ciliumnode") {
			t.Errorf("reconciler job %s runs with --auto-create-cilium-node-resource=false", s.ID)
		}
		if strings.Contains(s.ID, "local-node") {
			jobs++ // the job that wrote the row reports here
		}
	}
	if jobs == 0 {
		t.Errorf("no health of the local-node job: %+v", e.health.Statuses())
	}
	if _, err := cs.ciliumNode(t, "node1"); !k8serrors.IsNotFound(err) {
		t.Errorf("CiliumNode created with --auto-create-cilium-node-resource=false: %v", err)
	}
}

func partHealth(e *env, module, id string) hive.HealthStatus {
	for _, s := range e.health.Statuses() {
		if s.Module == module && s.ID == id {
			return s
		}
	}
	return hive.HealthStatus{}
}

func getJSON(c *http.Client, path string, out any) error {
	resp, err := c.Get("http://agent" + path)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", path, resp.Status)
	}
	return json.NewDecoder(resp.Body).Decode(out)
}
