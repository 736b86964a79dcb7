package k8s

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"runtime"
	"runtime/pprof"
	"strconv"
	"testing"
	"time"

	"github.com/cilium/statedb"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	"github.com/cellium/cellium/api/cilium.io/v2alpha1"
	"github.com/cellium/cellium/cells/ipcache"
	"github.com/cellium/cellium/statedb/endpoints"
	stateipcache "github.com/cellium/cellium/statedb/ipcache"
	k8stables "github.com/cellium/cellium/statedb/k8s"
	"github.com/cellium/cellium/statedb/nodes"
	"github.com/cellium/cellium/statedb/policy"
)

// memWorld is the agent's part that holds remote endpoints: the
// CiliumEndpoint table (filled by the CEP reflector's store or the slice
// store) and the ipcache deriver, with the nodes and identities they
// check against.
type memWorld struct {
	db  *statedb.DB
	t   ipcache.Tables
	rw  statedb.RWTable[*ciliumv2.CiliumEndpoint]
	der *ipcache.Deriver
}

const (
	memNodes      = 100
	memPerNode    = 100
	memPerID      = 10
	memPerSlice   = 100
	memNamespaces = 10
)

func memNS(id int) string { return "ns-" + strconv.Itoa(id/memPerID%memNamespaces) }

func memNodeIP(n int) netip.Addr { return netip.AddrFrom4([4]byte{100, 64, byte(n >> 8), byte(n)}) }

func memPodIP(n, i int) string { return fmt.Sprintf("10.%d.%d.%d", 1+n/256, n%256, 1+i) }

func newMemWorld(t testing.TB, pods int) *memWorld {
	db := statedb.New()
	must := func(err error) {
		if err != nil {
			t.Fatal(err)
		}
	}
	w := &memWorld{db: db}
	var err error
	eps, err := endpoints.NewTable(db)
	must(err)
	local, err := nodes.NewLocalNodeTable(db)
	must(err)
	nodesT, err := nodes.NewNodesTable(db)
	must(err)
	w.rw, err = k8stables.NewCiliumEndpointsTable(db)
	must(err)
	cidrs, err := policy.NewCIDRTable(db)
	must(err)
	ids, err := k8stables.NewCiliumIdentitiesTable(db)
	must(err)
	ipc, err := stateipcache.NewTable(db)
	must(err)
	w.t = ipcache.Tables{DB: db, Endpoints: eps, LocalNode: local, Nodes: nodesT, CEPs: w.rw, CIDRs: cidrs, Identities: ids, IPCache: ipc}
	txn := db.WriteTxn(eps, local, nodesT, cidrs, ids)
	for _, tb := range []interface {
		RegisterInitializer(statedb.WriteTxn, string) func(statedb.WriteTxn)
	}{eps, local, nodesT, cidrs, ids} {
		tb.RegisterInitializer(txn, "x")(txn)
	}
	_, _, _ = local.Insert(txn, &nodes.LocalNode{Name: "local", InternalIP: netip.MustParseAddr("192.168.0.1")})
	for n := range memNodes {
		_, _, _ = nodesT.Insert(txn, &nodes.Node{Name: "node-" + strconv.Itoa(n),
			Addresses: []nodes.Address{{Type: nodes.AddressInternalIP, IP: memNodeIP(n)}},
			PodCIDRs:  []netip.Prefix{netip.MustParsePrefix(memPodIP(n, -1) + "/24")}})
	}
	for id := range pods / memPerID {
		_, _, _ = ids.Insert(txn, &ciliumv2.CiliumIdentity{ObjectMeta: metav1.ObjectMeta{Name: strconv.Itoa(100000 + id)},
			SecurityLabels: map[string]string{"k8s:io.kubernetes.pod.namespace": memNS(id), "k8s:app": "app-" + strconv.Itoa(id)}})
	}
	txn.Commit()
	w.der = ipcache.NewDeriver(w.t, nil)
	must(w.der.Subscribe())
	return w
}

// memCEP is the JSON of the i-th remote CEP as the API server sends it.
func memCEP(i int) []byte {
	n, id := i/memPerNode, i/memPerID
	cep := &ciliumv2.CiliumEndpoint{
		TypeMeta: metav1.TypeMeta{APIVersion: "cilium.io/v2", Kind: "CiliumEndpoint"},
		ObjectMeta: metav1.ObjectMeta{Name: "pod-" + strconv.Itoa(i), Namespace: memNS(id), UID: types.UID(fmt.Sprintf("%08d-1111-2222-3333-444455556666", i)),
			ResourceVersion: strconv.Itoa(1000 + i), Generation: 1, CreationTimestamp: metav1.NewTime(time.Unix(1700000000, 0)),
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: "pod-" + strconv.Itoa(i), UID: types.UID(fmt.Sprintf("%08d-aaaa-bbbb-cccc-ddddeeeeffff", i))}},
			ManagedFields:   []metav1.ManagedFieldsEntry{{Manager: "cellium-agent", Operation: "Update", APIVersion: "cilium.io/v2"}}},
		Status: ciliumv2.EndpointStatus{
			ID: int64(1 + i%memPerNode),
			Identity: &ciliumv2.EndpointIdentity{ID: int64(100000 + id), Labels: []string{
				"k8s:app=app-" + strconv.Itoa(id), "k8s:io.kubernetes.pod.namespace=" + memNS(id),
				"k8s:io.cilium.k8s.policy.serviceaccount=default", "k8s:io.cilium.k8s.policy.cluster=default",
				"k8s:io.cilium.k8s.namespace.labels.kubernetes.io/metadata.name=" + memNS(id)}},
			Networking: &ciliumv2.EndpointNetworking{Addressing: ciliumv2.AddressPairList{{IPV4: memPodIP(n, i%memPerNode)}}, NodeIP: memNodeIP(n).String()},
			State:      ciliumv2.EndpointStateReady,
			ExternalIdentifiers: &ciliumv2.EndpointIdentifiers{ContainerID: fmt.Sprintf("%064d", i), PodName: memNS(id) + "/pod-" + strconv.Itoa(i),
				CNIAttachmentID: fmt.Sprintf("%064d", i) + ":eth0"},
			Encryption:     ciliumv2.EncryptionSpec{},
			ServiceAccount: "default",
		},
	}
	b, _ := json.Marshal(cep)
	return b
}

// memSlice is the JSON of the s-th slice: memPerSlice endpoints of one
// identity group.
func memSlice(s, pods int) []byte {
	ces := &v2alpha1.CiliumEndpointSlice{
		TypeMeta:   metav1.TypeMeta{APIVersion: "cilium.io/v2alpha1", Kind: "CiliumEndpointSlice"},
		ObjectMeta: metav1.ObjectMeta{Name: "ces-" + strconv.Itoa(s), ResourceVersion: strconv.Itoa(1000 + s), UID: types.UID(fmt.Sprintf("%08d-1111-2222-3333-444455556666", s)), Generation: 1},
	}
	for i := s * memPerSlice; i < (s+1)*memPerSlice && i < pods; i++ {
		n, id := i/memPerNode, i/memPerID
		ces.Namespace = memNS(id)
		ces.Endpoints = append(ces.Endpoints, v2alpha1.CoreCiliumEndpoint{Name: "pod-" + strconv.Itoa(i), IdentityID: int64(100000 + id),
			PodUID:         types.UID(fmt.Sprintf("%08d-aaaa-bbbb-cccc-ddddeeeeffff", i)),
			Networking:     &ciliumv2.EndpointNetworking{Addressing: ciliumv2.AddressPairList{{IPV4: memPodIP(n, i%memPerNode)}}, NodeIP: memNodeIP(n).String()},
			ServiceAccount: "default"})
	}
	b, _ := json.Marshal(ces)
	return b
}

func liveHeap() uint64 {
	var ms runtime.MemStats
	// Finalizers (and what they free) need more than one cycle.
	for range 3 {
		runtime.GC()
		time.Sleep(10 * time.Millisecond)
	}
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// measureRemoteEndpoints returns the heap bytes per remote endpoint the
// CEP table holds, and the ipcache deriver's state and table add, in CEP
// mode (slices false) or CES mode.
func measureRemoteEndpoints(t testing.TB, pods int, slices bool) (table, deriver float64) {
	w := newMemWorld(t, pods)
	// The JSON is made before the first sample and dropped after the
	// decode: what stays is what the stores keep.
	var raw [][]byte
	if slices {
		for s := 0; s*memPerSlice < pods; s++ {
			raw = append(raw, memSlice(s, pods))
		}
	} else {
		for i := range pods {
			raw = append(raw, memCEP(i))
		}
	}
	before := liveHeap()
	txn := w.db.WriteTxn(w.rw)
	done := w.rw.RegisterInitializer(txn, "test")
	txn.Commit()
	var list []any
	for _, b := range raw {
		if slices {
			o := &v2alpha1.CiliumEndpointSlice{}
			if err := json.Unmarshal(b, o); err != nil {
				t.Fatal(err)
			}
			list = append(list, o)
		} else {
			o := &ciliumv2.CiliumEndpoint{}
			if err := json.Unmarshal(b, o); err != nil {
				t.Fatal(err)
			}
			list = append(list, o)
		}
	}
	var store interface{ Replace([]any, string) error }
	if slices {
		store = NewSliceStore(w.db, w.rw, done)
	} else {
		store = newCEPStore(w.db, w.rw, done)
	}
	if err := store.Replace(list, "1"); err != nil {
		t.Fatal(err)
	}
	list = nil
	mid := liveHeap()
	if n := w.rw.NumObjects(w.db.ReadTxn()); n != pods {
		t.Fatalf("%d CEPs in the table, want %d", n, pods)
	}
	if err := w.der.CatchUp(); err != nil {
		t.Fatal(err)
	}
	after := liveHeap()
	if p := os.Getenv("CELLIUM_MEM_PROFILE"); p != "" {
		f, err := os.Create(p)
		if err != nil {
			t.Fatal(err)
		}
		if err := pprof.Lookup("heap").WriteTo(f, 0); err != nil {
			t.Fatal(err)
		}
		f.Close()
	}
	if n := w.t.IPCache.NumObjects(w.db.ReadTxn()); n < pods {
		t.Fatalf("%d ipcache rows, want at least %d", n, pods)
	}
	runtime.KeepAlive(raw)
	runtime.KeepAlive(store)
	runtime.KeepAlive(w)
	return (float64(mid) - float64(before)) / float64(pods), (float64(after) - float64(mid)) / float64(pods)
}

// The budgets of TestRemoteEndpointMemory and TestIdentityMemory, in
// bytes.
const (
	remoteEndpointBudget = 3000
	identityBudget       = 1600
)

// TestRemoteEndpointMemory reports the heap the agent keeps per remote
// endpoint in the CEP table (and, in CES mode, the slice store) and in
// the ipcache deriver, and checks it against a budget.
func TestRemoteEndpointMemory(t *testing.T) {
	pods := 10000
	if testing.Short() {
		pods = 2000
	}
	if s := os.Getenv("CELLIUM_MEM_PODS"); s != "" {
		pods, _ = strconv.Atoi(s)
	}
	for _, mode := range []struct {
		name   string
		slices bool
	}{{"cep", false}, {"ces", true}} {
		t.Run(mode.name, func(t *testing.T) {
			table, der := measureRemoteEndpoints(t, pods, mode.slices)
			t.Logf("%s mode, %d remote endpoints: %.0f B per endpoint in the CEP table, %.0f B in the ipcache deriver, %.0f B in all",
				mode.name, pods, table, der, table+der)
			// 4.4 KiB (CEP mode) and 4.3 KiB (CES) before the tables and
			// the deriver were slimmed; about 2.2 KiB after.
			if table+der > remoteEndpointBudget {
				t.Errorf("%.0f B per remote endpoint, budget %d B", table+der, remoteEndpointBudget)
			}
		})
	}
}

// memIdentity is the JSON of the i-th CiliumIdentity as the API server
// sends it (as the agents' allocator writes them).
func memIdentity(i int) []byte {
	ns := memNS(i)
	b, _ := json.Marshal(&ciliumv2.CiliumIdentity{
		TypeMeta: metav1.TypeMeta{APIVersion: "cilium.io/v2", Kind: "CiliumIdentity"},
		ObjectMeta: metav1.ObjectMeta{Name: strconv.Itoa(100000 + i), UID: types.UID(fmt.Sprintf("%08d-1111-2222-3333-444455556666", i)),
			ResourceVersion: strconv.Itoa(1000 + i), Generation: 1, CreationTimestamp: metav1.NewTime(time.Unix(1700000000, 0)),
			Labels: map[string]string{"io.kubernetes.pod.namespace": ns}},
		SecurityLabels: map[string]string{"k8s:io.kubernetes.pod.namespace": ns, "k8s:io.cilium.k8s.namespace.labels.kubernetes.io/metadata.name": ns,
			"k8s:io.cilium.k8s.policy.cluster": "default", "k8s:io.cilium.k8s.policy.serviceaccount": "default",
			"k8s:app": "app-" + strconv.Itoa(i), "k8s:scale-group": "group-" + strconv.Itoa(i%10)},
	})
	return b
}

// TestIdentityMemory reports the heap the CiliumIdentity table keeps per
// identity.
func TestIdentityMemory(t *testing.T) {
	const n = 5000
	db := statedb.New()
	table, err := k8stables.NewCiliumIdentitiesTable(db)
	if err != nil {
		t.Fatal(err)
	}
	var raw [][]byte
	for i := range n {
		raw = append(raw, memIdentity(i))
	}
	before := liveHeap()
	txn := db.WriteTxn(table)
	done := table.RegisterInitializer(txn, "test")
	txn.Commit()
	var list []any
	for _, b := range raw {
		o := &ciliumv2.CiliumIdentity{}
		if err := json.Unmarshal(b, o); err != nil {
			t.Fatal(err)
		}
		list = append(list, o)
	}
	store := newIdentityStore(db, table, done)
	if err := store.Replace(list, "1"); err != nil {
		t.Fatal(err)
	}
	list = nil
	after := liveHeap()
	if got := table.NumObjects(db.ReadTxn()); got != n {
		t.Fatalf("%d rows", got)
	}
	runtime.KeepAlive(raw)
	runtime.KeepAlive(store)
	per := (float64(after) - float64(before)) / n
	t.Logf("%.0f B per CiliumIdentity in the table", per)
	// 1966 B before the rows were slimmed, about 1265 B after.
	if per > identityBudget {
		t.Errorf("%.0f B per identity, budget %d B", per, identityBudget)
	}
}
