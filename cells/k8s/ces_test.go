package k8s_test

import (
	"fmt"
	"slices"
	"sort"
	"testing"

	"github.com/cilium/statedb"
	"go.uber.org/goleak"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	"github.com/cellium/cellium/api/cilium.io/v2alpha1"
	"github.com/cellium/cellium/cells/k8s"
	k8stables "github.com/cellium/cellium/statedb/k8s"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func ces(name, rv, ns string, eps ...v2alpha1.CoreCiliumEndpoint) *v2alpha1.CiliumEndpointSlice {
	return &v2alpha1.CiliumEndpointSlice{ObjectMeta: metav1.ObjectMeta{Name: name, ResourceVersion: rv}, Namespace: ns, Endpoints: eps}
}

func entry(name string, id int64, ip string) v2alpha1.CoreCiliumEndpoint {
	return v2alpha1.CoreCiliumEndpoint{Name: name, IdentityID: id, PodUID: types.UID("uid-" + name),
		Networking: &ciliumv2.EndpointNetworking{NodeIP: "192.0.2.1", Addressing: ciliumv2.AddressPairList{{IPV4: ip}}}}
}

// rows lists the table as "ns/name id ip" lines.
func rows(db *statedb.DB, t statedb.Table[*ciliumv2.CiliumEndpoint]) []string {
	var out []string
	for c := range t.All(db.ReadTxn()) {
		id := int64(0)
		if c.Status.Identity != nil {
			id = c.Status.Identity.ID
		}
		out = append(out, fmt.Sprintf("%s %d %s", k8stables.Key(c), id, c.Status.Networking.Addressing[0].IPV4))
	}
	sort.Strings(out)
	return out
}

// The store keeps the CiliumEndpoint table equal to the slices' entries:
// adds, moves between slices (both holding the endpoint for a moment),
// deletions, and a relist.
func TestSliceStore(t *testing.T) {
	db := statedb.New()
	table, err := k8stables.NewCiliumEndpointsTable(db)
	if err != nil {
		t.Fatal(err)
	}
	txn := db.WriteTxn(table)
	done := table.RegisterInitializer(txn, "test")
	txn.Commit()
	s := k8s.NewSliceStore(db, table, done)
	expect := func(what string, want ...string) {
		t.Helper()
		if got := rows(db, table); !slices.Equal(got, want) {
			t.Errorf("%s: rows %q, want %q", what, got, want)
		}
	}

	if err := s.Replace([]any{ces("ces-a", "10", "ns1", entry("x", 1000, "10.0.0.1"), entry("y", 1000, "10.0.0.2"))}, "10"); err != nil {
		t.Fatal(err)
	}
	if ok, _ := table.Initialized(db.ReadTxn()); !ok {
		t.Error("not initialized after the first list")
	}
	expect("listed", "ns1/x 1000 10.0.0.1", "ns1/y 1000 10.0.0.2")
	cep, _, _ := table.Get(db.ReadTxn(), k8stables.NameIndex[*ciliumv2.CiliumEndpoint]().Query("ns1/x"))
	if len(cep.OwnerReferences) != 1 || cep.OwnerReferences[0].UID != "uid-x" || cep.OwnerReferences[0].Kind != "Pod" {
		t.Errorf("owner references %v, want the pod uid-x", cep.OwnerReferences)
	}

	// x moves to ces-b (new identity): the slice joined is written first.
	if err := s.Add(ces("ces-b", "11", "ns1", entry("x", 2000, "10.0.0.1"))); err != nil {
		t.Fatal(err)
	}
	expect("x in both slices: the newer wins", "ns1/x 2000 10.0.0.1", "ns1/y 1000 10.0.0.2")
	if err := s.Update(ces("ces-a", "12", "ns1", entry("y", 1000, "10.0.0.2"))); err != nil {
		t.Fatal(err)
	}
	expect("x left ces-a", "ns1/x 2000 10.0.0.1", "ns1/y 1000 10.0.0.2")

	// Another namespace's endpoint of the same name is another row.
	if err := s.Add(ces("ces-c", "13", "ns2", entry("x", 3000, "10.0.0.3"))); err != nil {
		t.Fatal(err)
	}
	expect("ns2/x", "ns1/x 2000 10.0.0.1", "ns1/y 1000 10.0.0.2", "ns2/x 3000 10.0.0.3")

	// ces-b deleted (a missed delete arrives as DeletedFinalStateUnknown).
	if err := s.Delete(cache.DeletedFinalStateUnknown{Key: "ces-b", Obj: ces("ces-b", "11", "ns1")}); err != nil {
		t.Fatal(err)
	}
	expect("ces-b gone", "ns1/y 1000 10.0.0.2", "ns2/x 3000 10.0.0.3")

	// A relist that lost ces-c and changed y.
	if err := s.Replace([]any{ces("ces-a", "20", "ns1", entry("y", 1000, "10.0.0.9"))}, "20"); err != nil {
		t.Fatal(err)
	}
	expect("relisted", "ns1/y 1000 10.0.0.9")
	if err := s.Add(&ciliumv2.CiliumEndpoint{}); err == nil {
		t.Error("a CiliumEndpoint given to the slice store: no error")
	}
}

// An entry and the CiliumEndpoint it was made from give the same status
// the ipcache reads.
func TestCoreRoundTrip(t *testing.T) {
	c := &ciliumv2.CiliumEndpoint{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns",
		OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: "p", UID: "u"}}},
		Status: ciliumv2.EndpointStatus{ID: 7, Identity: &ciliumv2.EndpointIdentity{ID: 1234}, ServiceAccount: "sa",
			Networking: &ciliumv2.EndpointNetworking{NodeIP: "192.0.2.1", Addressing: ciliumv2.AddressPairList{{IPV4: "10.0.0.1"}}},
			NamedPorts: ciliumv2.NamedPorts{{Name: "http", Port: 80, Protocol: "TCP"}}}}
	core := v2alpha1.CoreFromCiliumEndpoint(c)
	back := core.CiliumEndpoint("ns")
	if back.Name != "p" || back.Namespace != "ns" || back.Status.Identity.ID != 1234 || back.Status.ServiceAccount != "sa" ||
		back.Status.Networking.Addressing[0].IPV4 != "10.0.0.1" || back.Status.Networking.NodeIP != "192.0.2.1" ||
		len(back.Status.NamedPorts) != 1 || back.OwnerReferences[0].UID != "u" {
		t.Errorf("round trip: %+v", back)
	}
	c.Status.Networking.Addressing[0].IPV4 = "10.9.9.9"
	if back.Status.Networking.Addressing[0].IPV4 != "10.0.0.1" {
		t.Error("the entry shares memory with its CiliumEndpoint")
	}
	noID := (&v2alpha1.CoreCiliumEndpoint{Name: "q"}).CiliumEndpoint("ns")
	if noID.Status.Identity != nil || noID.Status.Networking != nil || noID.OwnerReferences != nil {
		t.Errorf("an entry without identity or networking: %+v", noID)
	}
}
