package k8s

import (
	"net/netip"
	"strconv"
	"testing"

	"github.com/cilium/statedb"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	"github.com/cellium/cellium/api/cilium.io/v2alpha1"
	"github.com/cellium/cellium/cells/ipcache"
	"github.com/cellium/cellium/statedb/endpoints"
	"github.com/cellium/cellium/statedb/identity"
	stateipcache "github.com/cellium/cellium/statedb/ipcache"
	k8stables "github.com/cellium/cellium/statedb/k8s"
	"github.com/cellium/cellium/statedb/nodes"
	"github.com/cellium/cellium/statedb/policy"
)

// badInput is an agent's CES-mode pipeline: the slice store fills the
// CiliumEndpoint table, the ipcache deriver reads it.
type badInput struct {
	t     *testing.T
	db    *statedb.DB
	ceps  statedb.RWTable[*ciliumv2.CiliumEndpoint]
	ids   statedb.RWTable[*ciliumv2.CiliumIdentity]
	ipc   statedb.RWTable[*stateipcache.Entry]
	ref   statedb.RWTable[*stateipcache.RefusedCEP]
	store *SliceStore
	der   *ipcache.Deriver
}

func newBadInput(t *testing.T) *badInput {
	db := statedb.New()
	b := &badInput{t: t, db: db}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	eps, err := endpoints.NewTable(db)
	must(err)
	local, err := nodes.NewLocalNodeTable(db)
	must(err)
	nodesT, err := nodes.NewNodesTable(db)
	must(err)
	b.ceps, err = k8stables.NewCiliumEndpointsTable(db)
	must(err)
	cidrs, err := policy.NewCIDRTable(db)
	must(err)
	b.ids, err = k8stables.NewCiliumIdentitiesTable(db)
	must(err)
	b.ipc, err = stateipcache.NewTable(db)
	must(err)
	b.ref, err = stateipcache.NewRefusedTable(db)
	must(err)
	txn := db.WriteTxn(local, nodesT)
	_, _, _ = local.Insert(txn, &nodes.LocalNode{Name: "local", InternalIP: netip.MustParseAddr("192.0.2.10")})
	_, _, _ = nodesT.Insert(txn, &nodes.Node{Name: "remote", Addresses: []nodes.Address{{Type: nodes.AddressInternalIP, IP: netip.MustParseAddr("192.0.2.11")}},
		PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.11.0.0/16")}})
	txn.Commit()
	b.store = NewSliceStore(db, b.ceps, nil)
	b.der = ipcache.NewDeriver(ipcache.Tables{DB: db, Endpoints: eps, LocalNode: local, Nodes: nodesT, CEPs: b.ceps, CIDRs: cidrs,
		Identities: b.ids, IPCache: b.ipc, Refused: b.ref}, nil)
	must(b.der.Subscribe())
	return b
}

func (b *badInput) identity(id int, ns string) {
	txn := b.db.WriteTxn(b.ids)
	_, _, _ = b.ids.Insert(txn, &ciliumv2.CiliumIdentity{ObjectMeta: metav1.ObjectMeta{Name: strconv.Itoa(id)},
		SecurityLabels: map[string]string{"k8s:io.kubernetes.pod.namespace": ns, "k8s:app": "a" + strconv.Itoa(id)}})
	txn.Commit()
}

func (b *badInput) apply(err error) {
	b.t.Helper()
	if err != nil {
		b.t.Fatal(err)
	}
	if err := b.der.CatchUp(); err != nil {
		b.t.Fatal(err)
	}
}

// expect checks what the ipcache says of ip: its identity and source,
// or, with id 0, that no CiliumEndpoint decides it.
func (b *badInput) expect(what, ip string, id identity.NumericIdentity) {
	b.t.Helper()
	e, _, ok := b.ipc.Get(b.db.ReadTxn(), stateipcache.PrefixIndex.Query(netip.MustParsePrefix(ip+"/32")))
	switch {
	case id == 0 && ok && e.Source == stateipcache.SourceCiliumEndpoint:
		b.t.Errorf("%s: %s is %d from %s, want no CiliumEndpoint's identity", what, ip, e.Identity, e.Owner)
	case id != 0 && (!ok || e.Identity != id || e.Source != stateipcache.SourceCiliumEndpoint):
		b.t.Errorf("%s: %s is %+v (found %v), want identity %d from a CiliumEndpoint", what, ip, e, ok, id)
	}
}

// row reports whether the CiliumEndpoint table holds key.
func (b *badInput) row(key string) bool {
	_, _, ok := b.ceps.Get(b.db.ReadTxn(), k8stables.NameIndex[*ciliumv2.CiliumEndpoint]().Query(key))
	return ok
}

func (b *badInput) refused(key string) stateipcache.Refusal {
	r, _, ok := b.ref.Get(b.db.ReadTxn(), stateipcache.RefusedCEPIndex.Query(key))
	if !ok {
		return ""
	}
	return r.Reason
}

func slice(name, rv, ns string, eps ...v2alpha1.CoreCiliumEndpoint) *v2alpha1.CiliumEndpointSlice {
	return &v2alpha1.CiliumEndpointSlice{ObjectMeta: metav1.ObjectMeta{Name: name, ResourceVersion: rv}, Namespace: ns, Endpoints: eps}
}

func sliceEntry(name string, id int64, ip string) v2alpha1.CoreCiliumEndpoint {
	return v2alpha1.CoreCiliumEndpoint{Name: name, IdentityID: id, PodUID: types.UID("uid-" + name),
		Networking: &ciliumv2.EndpointNetworking{NodeIP: "192.0.2.11", Addressing: ciliumv2.AddressPairList{{IPV4: ip}}}}
}

// Slices that name a namespace no Namespace object has, an identity that
// does not exist (yet), another namespace's identity, or no namespace at
// all, and slices that disagree with each other: every endpoint stays in
// the CiliumEndpoint table; its address gets its identity as soon as the
// identity vouches for it, and until then what the node's pod CIDR says
// (world, on that node: still routed there).
func TestSliceBadInput(t *testing.T) {
	b := newBadInput(t)
	b.identity(70001, "ghost")
	b.identity(70002, "default")
	b.apply(b.store.Replace(nil, "1"))

	// A namespace that does not exist (no agent table knows namespaces):
	// the slice's namespace is the endpoint's, as in Cilium; the identity
	// of that namespace vouches for it.
	b.apply(b.store.Add(slice("ces-ghost", "2", "ghost", sliceEntry("p1", 70001, "10.11.0.1"))))
	b.expect("namespace without a Namespace object", "10.11.0.1", 70001)

	// An identity that does not exist yet: the endpoint is kept (row,
	// refusal "unknown identity") and enters the ipcache when its
	// CiliumIdentity arrives, with no new slice write.
	b.apply(b.store.Add(slice("ces-pending", "3", "default", sliceEntry("p2", 70003, "10.11.0.2"))))
	if !b.row("default/p2") {
		t.Error("the endpoint of an unknown identity is not in the CiliumEndpoint table")
	}
	b.expect("identity not there yet", "10.11.0.2", 0)
	if r := b.refused("default/p2"); r != ipcache.RefusedUnknownIdentity {
		t.Errorf("refusal %q, want %q", r, ipcache.RefusedUnknownIdentity)
	}
	if e, _, ok := b.ipc.Get(b.db.ReadTxn(), stateipcache.PrefixIndex.Query(netip.MustParsePrefix("10.11.0.0/16"))); !ok || e.HostIP != netip.MustParseAddr("192.0.2.11") {
		t.Errorf("the node's pod CIDR %+v (found %v): the pending endpoint's address is not routed to its node", e, ok)
	}
	b.identity(70003, "default")
	b.apply(nil)
	b.expect("identity arrived", "10.11.0.2", 70003)
	if r := b.refused("default/p2"); r != "" {
		t.Errorf("still refused (%q) after its identity arrived", r)
	}

	// Another namespace's identity: refused, kept, visible as refused.
	b.apply(b.store.Add(slice("ces-foreign", "4", "default", sliceEntry("p3", 70001, "10.11.0.3"))))
	b.expect("identity of another namespace", "10.11.0.3", 0)
	if r := b.refused("default/p3"); r != ipcache.RefusedNamespaceMismatch || !b.row("default/p3") {
		t.Errorf("refusal %q, row %v: want %q and the row kept", r, b.row("default/p3"), ipcache.RefusedNamespaceMismatch)
	}

	// No namespace at all: the endpoint's key is its name (as for any
	// object without a namespace); no identity belongs to "", so it is
	// refused, and it goes with its slice.
	b.apply(b.store.Add(slice("ces-nons", "5", "", sliceEntry("p4", 70002, "10.11.0.4"))))
	if !b.row("p4") {
		t.Error("the endpoint of a slice without a namespace is not in the table")
	}
	b.expect("slice without a namespace", "10.11.0.4", 0)
	b.apply(b.store.Delete(cache.DeletedFinalStateUnknown{Key: "ces-nons", Obj: slice("ces-nons", "5", "")}))
	if b.row("p4") {
		t.Error("the endpoint of a deleted slice without a namespace stayed in the table")
	}

	// Two slices disagree about one endpoint (an operator's move seen
	// half-way, or a stale slice): the one written last decides; when it
	// goes, the other.
	b.apply(b.store.Add(slice("ces-old", "6", "default", sliceEntry("p5", 70002, "10.11.0.5"))))
	b.identity(70004, "default")
	b.apply(b.store.Add(slice("ces-new", "7", "default", sliceEntry("p5", 70004, "10.11.0.5"))))
	b.expect("two slices, the newer decides", "10.11.0.5", 70004)
	b.apply(b.store.Delete(slice("ces-new", "7", "default")))
	b.expect("the newer slice gone, the older decides", "10.11.0.5", 70002)

	// Two endpoints claim one address with different identities: neither
	// decides (a CEP writer cannot take an address by naming it).
	b.apply(b.store.Add(slice("ces-dup", "8", "default", sliceEntry("p6", 70004, "10.11.0.5"))))
	b.expect("two endpoints, one address", "10.11.0.5", 0)
	b.apply(b.store.Delete(slice("ces-dup", "8", "default")))
	b.expect("the duplicate gone", "10.11.0.5", 70002)

	// Everything that was accepted is still there.
	b.expect("at the end", "10.11.0.1", 70001)
	b.expect("at the end", "10.11.0.2", 70003)
}
