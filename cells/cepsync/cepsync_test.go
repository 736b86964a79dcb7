package cepsync_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/cilium/statedb"
	"go.uber.org/goleak"
	corev1 "k8s.io/api/core/v1"
	apiextclientset "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	"github.com/cellium/cellium/api/client/clientset/versioned"
	"github.com/cellium/cellium/api/crds"
	"github.com/cellium/cellium/api/v1/models"
	"github.com/cellium/cellium/cells/agentapi"
	"github.com/cellium/cellium/cells/cepsync"
	"github.com/cellium/cellium/cells/crdregister"
	"github.com/cellium/cellium/cells/endpointmanager"
	"github.com/cellium/cellium/cells/endpointpolicy/endpointpolicytest"
	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/cells/hive/hivetest"
	identitycell "github.com/cellium/cellium/cells/identity"
	"github.com/cellium/cellium/cells/ipam"
	"github.com/cellium/cellium/cells/k8s"
	"github.com/cellium/cellium/cells/statedir"
	"github.com/cellium/cellium/statedb/endpoints"
	"github.com/cellium/cellium/statedb/identity"
	ipamtables "github.com/cellium/cellium/statedb/ipam"
	"github.com/cellium/cellium/statedb/labels"
	"github.com/cellium/cellium/statedb/nodes"
	statepolicy "github.com/cellium/cellium/statedb/policy"
	"github.com/cellium/cellium/statedb/reconciler"
	"github.com/cellium/cellium/test/harness"
)

var cluster = harness.NewShared(harness.Options{})

func TestMain(m *testing.M) {
	code := m.Run()
	if err := cluster.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, err)
	}
	if code == 0 {
		if err := goleak.Find(goleak.IgnoreTopFunction("k8s.io/klog/v2.(*loggingT).flushDaemon")); err != nil {
			fmt.Fprintln(os.Stderr, "goroutines leaked:", err)
			code = 1
		}
	}
	os.Exit(code)
}

type fakeIPAM struct{}

// fakeIPAM lets every endpoint claim any address.
func (fakeIPAM) AllocateNext(context.Context, ipam.Owner) (ipam.Allocation, error) {
	return ipam.Allocation{}, fmt.Errorf("not used")
}
func (fakeIPAM) AllocateIP(_ context.Context, ip netip.Addr, owner ipam.Owner) (ipam.Allocation, error) {
	return ipam.Allocation{IP: ip, Owner: owner.Name, ContainerID: owner.ContainerID}, nil
}
func (fakeIPAM) Claim(context.Context, netip.Addr, ipam.Owner) error { return nil }
func (fakeIPAM) Release(netip.Addr) error                            { return nil }
func (fakeIPAM) ReleaseOwned(netip.Addr, ipam.Owner) (bool, error)   { return true, nil }
func (fakeIPAM) ReleaseContainer(string) ([]ipam.Allocation, error)  { return nil, nil }
func (fakeIPAM) HoldForRestore(string) func([]ipam.Claim)            { return func([]ipam.Claim) {} }
func (fakeIPAM) RouterIP() (netip.Addr, bool)                        { return netip.MustParseAddr("10.1.0.1"), true }

// allocationsTable is IPAM's table holding the router's and the health
// endpoint's addresses, initialized.
func allocationsTable(db *statedb.DB) (statedb.Table[*ipamtables.Allocation], error) {
	table, err := ipamtables.NewTable(db)
	if err != nil {
		return nil, err
	}
	txn := db.WriteTxn(table)
	table.Insert(txn, &ipamtables.Allocation{IP: netip.MustParseAddr("10.1.0.1"), Owner: ipamtables.RouterOwner})
	table.Insert(txn, &ipamtables.Allocation{IP: netip.MustParseAddr("10.1.0.2"), Owner: ipamtables.HealthOwner})
	table.RegisterInitializer(txn, "test")(txn)
	txn.Commit()
	return table, nil
}

type fakeIdentities struct {
	mu  sync.Mutex
	ids map[string]identity.NumericIdentity
}

func (f *fakeIdentities) Allocate(_ context.Context, l labels.Labels) (identitycell.Identity, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if id, ok := identity.LookupReservedByLabels(l); ok {
		return identitycell.Identity{ID: id, Labels: l}, nil
	}
	id, ok := f.ids[l.String()]
	if !ok {
		id = identity.NumericIdentity(20000 + len(f.ids))
		f.ids[l.String()] = id
	}
	return identitycell.Identity{ID: id, Labels: l}, nil
}

// Restore ignores restored identities: the fake allocates without an API.
func (f *fakeIdentities) Restore(labels.Labels, identity.NumericIdentity) {}

func (f *fakeIdentities) Release(context.Context, identity.NumericIdentity) error { return nil }
func (f *fakeIdentities) Lookup(identity.NumericIdentity) (identitycell.Identity, bool) {
	return identitycell.Identity{}, false
}

type filter struct{}

func (filter) Split(l labels.Labels) (labels.Labels, labels.Labels) {
	return labels.DefaultFilter().Split(l)
}

// agent is an in-process agent with the real k8s cells, the endpoint
// manager and the CEP synchronizer, and fake allocators.
type agent struct {
	h    *hive.Hive
	db   *statedb.DB
	eps  statedb.Table[*endpoints.Endpoint]
	des  statedb.Table[*cepsync.DesiredCEP]
	pols statedb.RWTable[*statepolicy.EndpointPolicyRow]
	// policy writes each endpoint's policy row, as the policy cell does.
	policy *endpointpolicytest.StandIn
	socket string
}

// startAgent starts the agent; the local-node row (nodediscovery's, not
// composed here) says the node's InternalIP is nodeIP.
func startAgent(t *testing.T, c *harness.Cluster, node, nodeIP, stateDir string) *agent {
	t.Helper()
	a := &agent{socket: filepath.Join(t.TempDir(), "api.sock"), policy: endpointpolicytest.New()}
	var local statedb.RWTable[*nodes.LocalNode]
	h := hivetest.New(t, []string{"--k8s-kubeconfig-path=" + c.Kubeconfig(), "--state-dir=" + stateDir, "--socket-path=" + a.socket},
		k8s.ClientCell, k8s.AgentResourcesCell, statedir.Cell, agentapi.Cell,
		hive.Provide(
			func() k8s.NodeName { return k8s.NodeName(node) },
			func() ipam.Allocator { return fakeIPAM{} },
			allocationsTable,
			func() identitycell.Allocator { return &fakeIdentities{ids: map[string]identity.NumericIdentity{}} },
			func() identitycell.LabelFilter { return filter{} },
			func() identitycell.ClusterName { return "default" },
			nodes.NewLocalNodeTable,
			statedb.RWTable[*nodes.LocalNode].ToTable,
		),
		a.policy.Cell(), endpointmanager.Cell, identitycell.Responder, ipam.Responder, cepsync.Cell,
		hivetest.Capture(&a.db), hivetest.Capture(&a.eps), hivetest.Capture(&a.des), hivetest.Capture(&local),
		hivetest.Capture(&a.pols),
	)
	if err := h.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	txn := a.db.WriteTxn(local)
	if _, _, err := local.Insert(txn, &nodes.LocalNode{Name: node, InternalIP: netip.MustParseAddr(nodeIP)}); err != nil {
		t.Fatal(err)
	}
	txn.Commit()
	a.h = h
	return a
}

func (a *agent) stop(t *testing.T) {
	t.Helper()
	if err := a.h.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func setup(t *testing.T, node, nodeIP string) (*harness.Cluster, versioned.Interface) {
	c := cluster.Get(t)
	apiext := apiextclientset.NewForConfigOrDie(c.RESTConfig())
	all, err := crds.All()
	if err != nil {
		t.Fatal(err)
	}
	if err := crdregister.Register(t.Context(), apiext.ApiextensionsV1().CustomResourceDefinitions(), all, slog.New(slog.DiscardHandler)); err != nil {
		t.Fatal(err)
	}
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}
	n, err = c.Clientset().CoreV1().Nodes().Create(t.Context(), n, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: nodeIP}}
	if _, err := c.Clientset().CoreV1().Nodes().UpdateStatus(t.Context(), n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := c.EnsureServiceAccount(t.Context(), "kube-system"); err != nil {
		t.Fatal(err)
	}
	return c, versioned.NewForConfigOrDie(c.RESTConfig())
}

func createPod(t *testing.T, c *harness.Cluster, ns, name, node string) *corev1.Pod {
	t.Helper()
	p, err := c.Clientset().CoreV1().Pods(ns).Create(t.Context(), &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"app": name}},
		Spec:       corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "c", Image: "example.invalid/none"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func eventually(t *testing.T, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s: %v", what, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestCEPLifecycle: create -> CEP with owner, labels and status equal to the
// endpoint's; delete -> CEP gone; a CEP owned by another pod UID is never
// overwritten; a stale CEP of this node is pruned after a restart; the
// health endpoint has its CEP in kube-system.
func TestCEPLifecycle(t *testing.T) {
	c, cs := setup(t, "cep-node", "192.0.2.10")
	ns := c.TestNamespace(t)
	stateDir := t.TempDir()
	pod := createPod(t, c, ns, "web", "cep-node")

	// A stale CEP of this node, created before the agent starts.
	stale := &ciliumv2.CiliumEndpoint{ObjectMeta: metav1.ObjectMeta{Name: "stale", Namespace: ns},
		Status: ciliumv2.EndpointStatus{ID: 9, Networking: &ciliumv2.EndpointNetworking{NodeIP: "192.0.2.10", Addressing: ciliumv2.AddressPairList{{IPV4: "10.1.0.99"}}}}}
	if _, err := cs.CiliumV2().CiliumEndpoints(ns).Create(t.Context(), stale, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// A CEP named like a pod but owned by another pod UID (a leftover).
	conflictPod := createPod(t, c, ns, "conflict", "cep-node")
	foreign := &ciliumv2.CiliumEndpoint{ObjectMeta: metav1.ObjectMeta{Name: "conflict", Namespace: ns,
		OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: "conflict", UID: types.UID("not-the-pod")}}},
		Status: ciliumv2.EndpointStatus{ID: 7, State: "ready"}}
	foreign, err := cs.CiliumV2().CiliumEndpoints(ns).Create(t.Context(), foreign, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}

	a := startAgent(t, c, "cep-node", "192.0.2.10", stateDir)
	defer func() {
		if a != nil {
			a.stop(t)
		}
	}()
	ep := a.create(t, ns, "web", "c-web", "10.1.0.10", string(pod.UID))
	a.create(t, ns, "conflict", "c-conflict", "10.1.0.11", string(conflictPod.UID))

	eventually(t, "the CEP of web", func() error {
		cep, err := cs.CiliumV2().CiliumEndpoints(ns).Get(t.Context(), "web", metav1.GetOptions{})
		if err != nil {
			return err
		}
		// The CEP's status is what the API shows for the endpoint.
		var cur models.Endpoint
		if err := a.call("GET", fmt.Sprintf("/endpoint/%d", ep.ID), nil, &cur); err != nil {
			return err
		}
		want, _ := json.Marshal(cur.Status)
		have, _ := json.Marshal(cep.Status)
		if string(want) != string(have) {
			return fmt.Errorf("status %s, want %s", have, want)
		}
		if len(cep.OwnerReferences) != 1 || cep.OwnerReferences[0].UID != pod.UID || cep.OwnerReferences[0].Kind != "Pod" {
			return fmt.Errorf("owner references %+v", cep.OwnerReferences)
		}
		if cep.Labels["app"] != "web" {
			return fmt.Errorf("labels %v", cep.Labels)
		}
		return nil
	})
	eventually(t, "the stale CEP to be pruned", func() error {
		_, err := cs.CiliumV2().CiliumEndpoints(ns).Get(t.Context(), "stale", metav1.GetOptions{})
		if err == nil {
			return fmt.Errorf("still there")
		}
		return nil
	})
	eventually(t, "the health CEP", func() error {
		cep, err := cs.CiliumV2().CiliumEndpoints("kube-system").Get(t.Context(), "cilium-health-cep-node", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if cep.Status.Identity == nil || cep.Status.Identity.ID != 4 {
			return fmt.Errorf("health identity %+v", cep.Status.Identity)
		}
		return nil
	})
	// The foreign CEP is left alone: same UID, same status, and the
	// desired row keeps failing. Two failed attempts in the row's status
	// prove the reconciler tried (and retried) without taking it over.
	var firstFailure time.Time
	eventually(t, "two refused attempts on the conflicting CEP", func() error {
		d, _, ok := a.des.Get(a.db.ReadTxn(), cepsync.DesiredKeyIndex.Query(ns+"/conflict"))
		switch {
		case !ok:
			return fmt.Errorf("no desired row")
		case d.Reconcile.Kind != reconciler.StatusError:
			return fmt.Errorf("status %s, want an error", d.Reconcile)
		case firstFailure.IsZero():
			firstFailure = d.Reconcile.UpdatedAt
			return fmt.Errorf("one failure seen")
		case !d.Reconcile.UpdatedAt.After(firstFailure):
			return fmt.Errorf("no retry yet")
		}
		return nil
	})
	got, err := cs.CiliumV2().CiliumEndpoints(ns).Get(t.Context(), "conflict", metav1.GetOptions{})
	if err != nil || got.UID != foreign.UID || got.Status.ID != 7 {
		t.Fatalf("foreign CEP was taken over: %+v %v", got, err)
	}

	// Deleting the endpoint deletes its CEP.
	if err := a.call("DELETE", "/endpoint?container-id=c-web", nil, nil); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the CEP of web to go", func() error {
		_, err := cs.CiliumV2().CiliumEndpoints(ns).Get(t.Context(), "web", metav1.GetOptions{})
		if err == nil {
			return fmt.Errorf("still there")
		}
		return nil
	})
	a.stop(t)
	a = nil
}

func (a *agent) call(method, path string, body, out any) error {
	client := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", a.socket)
	}}}
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, _ := http.NewRequest(method, "http://agent/v1"+path, rd)
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	if resp.StatusCode >= 300 {
		return fmt.Errorf("%s %s: %s: %s", method, path, resp.Status, data)
	}
	if out != nil {
		return json.Unmarshal(data, out)
	}
	return nil
}

// create makes an endpoint as the CNI plugin does, waiting until it is
// ready, unless the policy stand-in is paused (then no policy would come).
func (a *agent) create(t *testing.T, ns, pod, cid, ip, uid string) models.Endpoint {
	t.Helper()
	var ep models.Endpoint
	err := a.call("PUT", "/endpoint", models.EndpointChangeRequest{
		ContainerID: cid, ContainerInterfaceName: "eth0", K8sNamespace: ns, K8sPodName: pod, K8sUID: uid,
		InterfaceName: "lxc" + cid, Addressing: models.AddressPair{IPV4: ip}, SyncBuildEndpoint: !a.policy.Paused.Load(),
	}, &ep)
	if err != nil {
		t.Fatal(err)
	}
	return ep
}

// A pod deleted and re-created under the same name (a new UID, a new
// sandbox) gets a new CEP owned by the new pod: the agent's CEP of the old
// pod is deleted, not patched with the new pod's status while still naming
// the old pod as owner (the chaos soak found a pod left without a CEP so).
func TestCEPOfRecreatedPod(t *testing.T) {
	c, cs := setup(t, "cep-node-re", "192.0.2.11")
	ns := c.TestNamespace(t)
	old := createPod(t, c, ns, "web", "cep-node-re")

	a := startAgent(t, c, "cep-node-re", "192.0.2.11", t.TempDir())
	defer a.stop(t)
	a.create(t, ns, "web", "c-old", "10.1.0.20", string(old.UID))
	ownedBy := func(uid types.UID) func() error {
		return func() error {
			cep, err := cs.CiliumV2().CiliumEndpoints(ns).Get(t.Context(), "web", metav1.GetOptions{})
			if err != nil {
				return err
			}
			if len(cep.OwnerReferences) != 1 || cep.OwnerReferences[0].UID != uid {
				return fmt.Errorf("owner references %+v, want pod UID %s", cep.OwnerReferences, uid)
			}
			return nil
		}
	}
	eventually(t, "the CEP of the first pod", ownedBy(old.UID))
	// Kubernetes' garbage collector (the controller-manager) would delete
	// the CEP of the deleted pod after a while, or never without one: the
	// agent must not wait for it. Hide the owner reference from it.
	unowned := []byte(`[{"op":"remove","path":"/metadata/ownerReferences"}]`)
	if _, err := cs.CiliumV2().CiliumEndpoints(ns).Patch(t.Context(), "web", types.JSONPatchType, unowned, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}

	if err := c.Clientset().CoreV1().Pods(ns).Delete(t.Context(), "web", metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
		t.Fatal(err)
	}
	fresh := createPod(t, c, ns, "web", "cep-node-re")
	if fresh.UID == old.UID {
		t.Fatal("the re-created pod has the old UID")
	}
	// The new sandbox's endpoint replaces the old pod's.
	a.create(t, ns, "web", "c-new", "10.1.0.21", string(fresh.UID))
	eventually(t, "the CEP of the re-created pod", ownedBy(fresh.UID))
}

// Without a garbage collector (this API server runs no
// kube-controller-manager), the CEP of a deleted pod whose endpoint went
// (the kubelet's order: pod terminating, CNI DEL, pod removed) is deleted
// by the agent once cepsync.GCGrace has passed, and not before.
func TestCEPOfDeletedPodWithoutGarbageCollector(t *testing.T) {
	c, cs := setup(t, "cep-node-gc", "192.0.2.12")
	ns := c.TestNamespace(t)
	pod := createPod(t, c, ns, "web", "cep-node-gc")
	a := startAgent(t, c, "cep-node-gc", "192.0.2.12", t.TempDir())
	defer a.stop(t)
	a.create(t, ns, "web", "c-web", "10.1.0.40", string(pod.UID))
	eventually(t, "the CEP of web", func() error {
		_, err := cs.CiliumV2().CiliumEndpoints(ns).Get(t.Context(), "web", metav1.GetOptions{})
		return err
	})
	if err := c.Clientset().CoreV1().Pods(ns).Delete(t.Context(), "web", metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
		t.Fatal(err)
	}
	went := time.Now()
	if err := a.call("DELETE", "/endpoint?container-id=c-web", nil, nil); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the CEP of the deleted pod to go", func() error {
		_, err := cs.CiliumV2().CiliumEndpoints(ns).Get(t.Context(), "web", metav1.GetOptions{})
		if err == nil {
			return fmt.Errorf("still there")
		}
		return nil
	})
	if took := time.Since(went); took < cepsync.GCGrace-time.Second {
		t.Errorf("the agent deleted the CEP after %s, within the garbage collector's grace %s", took, cepsync.GCGrace)
	} else {
		t.Logf("the agent deleted the CEP %s after the endpoint", took.Round(10*time.Millisecond))
	}
}
