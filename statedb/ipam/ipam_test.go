package ipam_test

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/cilium/statedb"

	"github.com/cellium/cellium/statedb/ipam"
)

func TestIndexes(t *testing.T) {
	db := statedb.New()
	table, err := ipam.NewTable(db)
	if err != nil {
		t.Fatal(err)
	}
	ip := netip.MustParseAddr
	txn := db.WriteTxn(table)
	for _, a := range []*ipam.Allocation{
		{IP: ip("10.0.0.1"), Owner: ipam.RouterOwner},
		{IP: ip("10.0.0.12"), Owner: "ns/a", ContainerID: "c1"},
		{IP: ip("10.0.0.3"), Owner: "ns/a", ContainerID: "c1"},
		{IP: ip("10.0.0.2"), Owner: ipam.HealthOwner},
		{IP: ip("10.0.0.200"), Owner: "ns/b"},
	} {
		if _, _, err := table.Insert(txn, a); err != nil {
			t.Fatal(err)
		}
	}
	rtxn := txn.Commit()

	if a, _, found := table.Get(rtxn, ipam.IPIndex.Query(ip("10.0.0.3"))); !found || a.Owner != "ns/a" {
		t.Errorf("by IP: %v, %v", a, found)
	}
	// Owners list their addresses in address order, not insertion or byte order.
	if got, want := ipam.OwnedBy(rtxn, table, "ns/a"), []netip.Addr{ip("10.0.0.3"), ip("10.0.0.12")}; !slices.Equal(got, want) {
		t.Errorf("OwnedBy(ns/a) = %v, want %v", got, want)
	}
	if got := ipam.OwnedBy(rtxn, table, "ns/none"); got != nil {
		t.Errorf("OwnedBy(ns/none) = %v", got)
	}
	var byContainer []netip.Addr
	for a := range table.List(rtxn, ipam.ContainerIndex.Query("c1")) {
		byContainer = append(byContainer, a.IP)
	}
	if want := []netip.Addr{ip("10.0.0.3"), ip("10.0.0.12")}; !slices.Equal(byContainer, want) {
		t.Errorf("by container = %v, want %v", byContainer, want)
	}
	n := 0
	for range table.List(rtxn, ipam.ContainerIndex.Query("")) {
		n++
	}
	if n != 0 {
		t.Errorf("%d rows without a container ID are in the container index", n)
	}
	if r, ok := ipam.RouterIP(rtxn, table); !ok || r != ip("10.0.0.1") {
		t.Errorf("RouterIP = %v, %v", r, ok)
	}
	var all []netip.Addr
	for a := range table.All(rtxn) {
		all = append(all, a.IP)
	}
	if !slices.IsSortedFunc(all, netip.Addr.Compare) || len(all) != 5 {
		t.Errorf("All = %v, want 5 addresses in order", all)
	}

	// The string forms the CLI uses (`cellium statedb ipam-allocations ...`).
	if _, err := ipam.IPIndex.FromString("10.0.0.3"); err != nil {
		t.Errorf("IPIndex.FromString: %v", err)
	}
	if got := (&ipam.Allocation{IP: ip("10.0.0.3"), Owner: "ns/a", ContainerID: "0123456789abcdef"}).TableRow(); !slices.Equal(got, []string{"10.0.0.3", "ns/a", "0123456789ab"}) {
		t.Errorf("TableRow = %v", got)
	}

	// An empty table has no router.
	emptyDB := statedb.New()
	empty, err := ipam.NewTable(emptyDB)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := ipam.RouterIP(emptyDB.ReadTxn(), empty); ok {
		t.Error("RouterIP of an empty table")
	}
}
