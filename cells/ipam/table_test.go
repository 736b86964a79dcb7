package ipam

import (
	"context"
	"net/netip"
	"slices"
	"testing"

	"github.com/cilium/statedb"

	"github.com/cellium/cellium/cells/hive/hivetest"
	ipamtables "github.com/cellium/cellium/statedb/ipam"
)

// rows returns the table's rows in address order.
func rows(db *statedb.DB, table statedb.Table[*ipamtables.Allocation]) []ipamtables.Allocation {
	var out []ipamtables.Allocation
	for a := range table.All(db.ReadTxn()) {
		out = append(out, *a)
	}
	return out
}

// The allocator mirrors every change into the allocations table, which is
// initialized only once the allocator can allocate: the pool exists and
// every restorer has handed over its addresses.
func TestAllocationsTableMirrorsTheAllocator(t *testing.T) {
	db := statedb.New()
	table, err := ipamtables.NewTable(db)
	if err != nil {
		t.Fatal(err)
	}
	a := newAllocatorCore(testNode, nil, hivetest.Logger(t))
	a.attachTable(db, table)
	if err := a.restore(); err != nil {
		t.Fatal(err)
	}
	handOver := a.HoldForRestore("test")

	if err := a.setPodCIDRs(prefixes("10.0.0.0/24")); err != nil {
		t.Fatal(err)
	}
	if init, _ := table.Initialized(db.ReadTxn()); init {
		t.Fatal("table initialized while a restorer holds the pool")
	}
	restored := netip.MustParseAddr("10.0.0.7")
	handOver([]Claim{{IP: restored, Owner: Owner{Name: "ns/old", ContainerID: "c-old"}}})
	if init, _ := table.Initialized(db.ReadTxn()); !init {
		t.Fatal("table not initialized once the pool exists and the restorer handed over")
	}

	ctx := context.Background()
	al, err := a.AllocateNext(ctx, Owner{Name: "ns/web", ContainerID: "c-web"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.AllocateIP(ctx, netip.MustParseAddr("10.0.0.9"), Owner{Name: HealthOwner}); err != nil {
		t.Fatal(err)
	}
	want := []ipamtables.Allocation{
		{IP: netip.MustParseAddr("10.0.0.1"), Owner: ipamtables.RouterOwner},
		{IP: al.IP, Owner: "ns/web", ContainerID: "c-web"},
		{IP: restored, Owner: "ns/old", ContainerID: "c-old"},
		{IP: netip.MustParseAddr("10.0.0.9"), Owner: HealthOwner},
	}
	slices.SortFunc(want, func(x, y ipamtables.Allocation) int { return x.IP.Compare(y.IP) })
	if got := rows(db, table); !slices.Equal(got, want) {
		t.Fatalf("rows = %+v, want %+v", got, want)
	}
	if ip, ok := ipamtables.RouterIP(db.ReadTxn(), table); !ok || ip != netip.MustParseAddr("10.0.0.1") {
		t.Errorf("RouterIP = %v, %v", ip, ok)
	}

	// Releases delete rows; a claim that adopts a container ID updates one.
	if _, err := a.ReleaseContainer("c-web"); err != nil {
		t.Fatal(err)
	}
	if err := a.Release(netip.MustParseAddr("10.0.0.9")); err != nil {
		t.Fatal(err)
	}
	if _, err := a.AllocateIP(ctx, netip.MustParseAddr("10.0.0.20"), Owner{Name: "ns/late"}); err != nil {
		t.Fatal(err)
	}
	if err := a.Claim(ctx, netip.MustParseAddr("10.0.0.20"), Owner{Name: "ns/late", ContainerID: "c-late"}); err != nil {
		t.Fatal(err)
	}
	want = []ipamtables.Allocation{
		{IP: netip.MustParseAddr("10.0.0.1"), Owner: ipamtables.RouterOwner},
		{IP: restored, Owner: "ns/old", ContainerID: "c-old"},
		{IP: netip.MustParseAddr("10.0.0.20"), Owner: "ns/late", ContainerID: "c-late"},
	}
	if got := rows(db, table); !slices.Equal(got, want) {
		t.Fatalf("rows after releases = %+v, want %+v", got, want)
	}
	if got := ipamtables.OwnedBy(db.ReadTxn(), table, HealthOwner); len(got) != 0 {
		t.Errorf("health still owns %v after its release", got)
	}
}
