package integration

import (
	"context"
	"fmt"
	"net/netip"
	"strconv"
	"testing"
	"time"

	"github.com/cilium/statedb"
	"go.uber.org/goleak"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	"github.com/cellium/cellium/api/cilium.io/v2alpha1"
	"github.com/cellium/cellium/api/client/clientset/versioned"
	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/cells/hive/hivetest"
	"github.com/cellium/cellium/cells/ipcache"
	"github.com/cellium/cellium/cells/k8s"
	"github.com/cellium/cellium/statedb/endpoints"
	ipcachetables "github.com/cellium/cellium/statedb/ipcache"
	k8stables "github.com/cellium/cellium/statedb/k8s"
	"github.com/cellium/cellium/statedb/nodes"
	"github.com/cellium/cellium/statedb/policy"
)

// TestCiliumEndpointSliceBadInput runs an agent in slice mode, with the
// agent's credentials from install/, against the real API server, and
// writes it slices (as the admin: an operator bug or a hand edit) that
// do not fit the cluster: a namespace without a Namespace object, an
// identity that appears only later, a CEP that disagrees with its slice,
// a slice without a namespace. Each is handled as
// Documentation/operations/endpoint-slices.md says, and the good
// endpoints keep their identities throughout. It runs once with the
// identities as CiliumIdentity objects and once as etcd keys
// (identity=crd, identity=kvstore).
func TestCiliumEndpointSliceBadInput(t *testing.T) {
	for _, mode := range identityModes {
		t.Run("identity="+mode, func(t *testing.T) { testSliceBadInput(t, mode) })
	}
}

func testSliceBadInput(t *testing.T, identityMode string) {
	c := cluster.Get(t)
	ns := c.TestNamespace(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := registerCRDs(ctx, c); err != nil {
		t.Fatal(err)
	}
	agentKube, err := c.AgentKubeconfig(ctx)
	if err != nil {
		t.Fatal(err)
	}
	admin, err := versioned.NewForConfig(c.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	backend := newIdentityBackend(t, identityMode)
	ignore := goleak.IgnoreCurrent()

	var (
		db    *statedb.DB
		ipc   statedb.Table[*ipcachetables.Entry]
		ceps  statedb.Table[*ciliumv2.CiliumEndpoint]
		cs    k8s.Clientset
		local statedb.RWTable[*nodes.LocalNode]
		nds   statedb.RWTable[*nodes.Node]
	)
	h := hivetest.New(t, append([]string{"--k8s-kubeconfig-path=" + agentKube, "--enable-cilium-endpoint-slice=true"}, backend.args...),
		append(backend.cells(), k8s.ClientCell, k8s.AgentCiliumEndpointsCell, k8s.CiliumIdentitiesCell, ipcache.Cell,
			hive.Provide(func() k8s.UserAgent { return "cellium-agent-ces-badinput-test" },
				func() k8s.NodeName { return "node-local" },
				endpoints.NewTable, statedb.RWTable[*endpoints.Endpoint].ToTable,
				nodes.NewLocalNodeTable, statedb.RWTable[*nodes.LocalNode].ToTable,
				nodes.NewNodesTable, statedb.RWTable[*nodes.Node].ToTable,
				policy.NewCIDRTable, statedb.RWTable[*policy.CIDRIdentity].ToTable),
			hivetest.Capture(&db), hivetest.Capture(&ipc), hivetest.Capture(&ceps), hivetest.Capture(&local), hivetest.Capture(&nds), hivetest.Capture(&cs))...)
	if err := h.Start(ctx); err != nil {
		t.Fatal(err)
	}
	stopped := false
	defer func() {
		if !stopped {
			_ = h.Stop(context.Background())
		}
	}()
	txn := db.WriteTxn(local, nds)
	_, _, _ = local.Insert(txn, &nodes.LocalNode{Name: "node-local", InternalIP: netip.MustParseAddr("192.0.2.10"),
		RouterIP: netip.MustParseAddr("10.10.0.1"), PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.10.0.0/24")}})
	_, _, _ = nds.Insert(txn, &nodes.Node{Name: "remote-1", Source: "test",
		Addresses: []nodes.Address{{Type: nodes.AddressInternalIP, IP: netip.MustParseAddr("192.0.2.11")}},
		PodCIDRs:  []netip.Prefix{netip.MustParsePrefix("10.11.0.0/16")}})
	txn.Commit()

	// Identities and slices are cluster-scoped: names unique to this run.
	base := 62000 + int(time.Now().UnixNano()%1000)*4
	ghost := ns + "-ghost" // no such Namespace
	createID := func(id int, idNS string) {
		t.Helper()
		backend.create(t, admin, id, map[string]string{"k8s:io.kubernetes.pod.namespace": idNS, "k8s:app": "a" + strconv.Itoa(id)})
	}
	entry := func(name string, id int, ip string) v2alpha1.CoreCiliumEndpoint {
		return v2alpha1.CoreCiliumEndpoint{Name: name, IdentityID: int64(id), PodUID: types.UID("uid-" + name),
			Networking: &ciliumv2.EndpointNetworking{NodeIP: "192.0.2.11", Addressing: ciliumv2.AddressPairList{{IPV4: ip}}}}
	}
	createSlice := func(name, sliceNS string, eps ...v2alpha1.CoreCiliumEndpoint) {
		t.Helper()
		obj := &v2alpha1.CiliumEndpointSlice{ObjectMeta: metav1.ObjectMeta{Name: name}, Namespace: sliceNS, Endpoints: eps}
		if _, err := admin.CiliumV2alpha1().CiliumEndpointSlices().Create(ctx, obj, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = admin.CiliumV2alpha1().CiliumEndpointSlices().Delete(context.Background(), name, metav1.DeleteOptions{})
		})
	}
	// identityOf is what the agent's ipcache says of ip: the identity a
	// CiliumEndpoint gave it, or 0.
	identityOf := func(ip string) int {
		e, _, ok := ipc.Get(db.ReadTxn(), ipcachetables.PrefixIndex.Query(netip.MustParsePrefix(ip+"/32")))
		if !ok || e.Source != ipcachetables.SourceCiliumEndpoint {
			return 0
		}
		return int(e.Identity)
	}
	expect := func(what string, want map[string]int) {
		t.Helper()
		eventually(t, time.Minute, what, func() error {
			for ip, id := range want {
				if got := identityOf(ip); got != id {
					return fmt.Errorf("%s has identity %d from a CiliumEndpoint, want %d", ip, got, id)
				}
			}
			return nil
		})
	}
	row := func(key string) bool {
		_, _, ok := ceps.Get(db.ReadTxn(), k8stables.NameIndex[*ciliumv2.CiliumEndpoint]().Query(key))
		return ok
	}

	createID(base, ns)
	createID(base+1, ghost)
	createSlice(fmt.Sprintf("bad-%d-good", base), ns, entry("good", base, "10.11.0.1"))
	createSlice(fmt.Sprintf("bad-%d-ghost", base), ghost, entry("ghost", base+1, "10.11.0.2"))
	createSlice(fmt.Sprintf("bad-%d-pending", base), ns, entry("pending", base+2, "10.11.0.3"))
	eventually(t, time.Minute, "the entry of an unknown identity in the agent's CiliumEndpoint table", func() error {
		if !row(ns + "/pending") {
			return fmt.Errorf("no row %s/pending", ns)
		}
		return nil
	})
	expect("a namespace without a Namespace object is used; an unknown identity waits",
		map[string]int{"10.11.0.1": base, "10.11.0.2": base + 1, "10.11.0.3": 0})

	// The identity arrives: the waiting entry enters the ipcache, with no
	// slice written again.
	createID(base+2, ns)
	expect("the identity arrived", map[string]int{"10.11.0.1": base, "10.11.0.2": base + 1, "10.11.0.3": base + 2})

	// A CEP that disagrees with the slice (another identity, another
	// address for "good"): in slice mode the agent does not read CEPs,
	// the slice decides.
	createID(base+3, ns)
	cep := &ciliumv2.CiliumEndpoint{ObjectMeta: metav1.ObjectMeta{Name: "good", Namespace: ns},
		Status: ciliumv2.EndpointStatus{Identity: &ciliumv2.EndpointIdentity{ID: int64(base + 3)},
			Networking: &ciliumv2.EndpointNetworking{NodeIP: "192.0.2.11", Addressing: ciliumv2.AddressPairList{{IPV4: "10.11.0.9"}}}}}
	if _, err := admin.CiliumV2().CiliumEndpoints(ns).Create(ctx, cep, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// A slice without a namespace: its entry is refused and goes with it.
	noNS := fmt.Sprintf("bad-%d-nons", base)
	createSlice(noNS, "", entry("nons", base, "10.11.0.4"))
	eventually(t, time.Minute, "the entry of the slice without a namespace in the table", func() error {
		if !row("nons") {
			return fmt.Errorf("no row nons")
		}
		return nil
	})
	expect("the slice decides over the CEP; the slice without namespace is refused",
		map[string]int{"10.11.0.1": base, "10.11.0.9": 0, "10.11.0.4": 0, "10.11.0.2": base + 1, "10.11.0.3": base + 2})
	if err := admin.CiliumV2alpha1().CiliumEndpointSlices().Delete(ctx, noNS, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, time.Minute, "the entry of the deleted slice without a namespace gone", func() error {
		if row("nons") {
			return fmt.Errorf("row nons still there")
		}
		return nil
	})
	expect("the good endpoints kept their identities", map[string]int{"10.11.0.1": base, "10.11.0.2": base + 1, "10.11.0.3": base + 2})

	stopped = true
	if err := h.Stop(context.Background()); err != nil {
		t.Error(err)
	}
	for range 5 {
		k8s.CloseIdleConnections(cs)
		if err = goleak.Find(ignore, goleak.IgnoreAnyFunction("k8s.io/klog/v2.(*loggingT).flushDaemon")); err == nil {
			return
		}
	}
	t.Fatalf("goroutines left after stop: %v", err)
}
