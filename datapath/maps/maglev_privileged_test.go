package maps_test

import (
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/cellium/cellium/datapath/bpf"
	"github.com/cellium/cellium/datapath/maps"
	"github.com/cellium/cellium/statedb/lb"
	"github.com/cellium/cellium/test/privileged"
)

// cellium_lb4_maglev pins, takes tables of any size (the table size is a
// flag), swaps a frontend's table for a new array (the one a program may
// hold is never written), lists and deletes
// tables idempotently, survives a reopen, and UnpinMaglev removes it.
func TestPrivilegedMaglevMap(t *testing.T) {
	privileged.Require(t)
	dir := tempBPFFS(t)
	m, err := maps.OpenMaglev(dir, 0)
	if err != nil {
		t.Fatal(err)
	}
	fe := lb.L4Addr{Addr: netip.MustParseAddr("192.168.1.10"), Port: 30080, Proto: lb.TCP}
	fe2 := lb.L4Addr{Addr: netip.MustParseAddr("192.168.1.10"), Port: 30081, Proto: lb.UDP}
	t1 := []uint32{1, 2, 3, 1, 2, 3, 1}
	if err := m.Swap(fe, t1); err != nil {
		t.Fatal(err)
	}
	if got, ok, err := m.Table(fe); err != nil || !ok || !slices.Equal(got, t1) {
		t.Fatalf("table: %v %v %v, want %v", got, ok, err, t1)
	}
	// The table a program holds while the agent swaps: never written.
	key := bpf.NodeportLb4MaglevKey{Address: 0x0a01a8c0, Dport: 0x8075, Proto: lb.TCP} // 192.168.1.10:30080
	var old *ebpf.Map
	if err := m.Map().Lookup(&key, &old); err != nil {
		t.Fatalf("look up the table by its raw key: %v", err)
	}
	defer old.Close()
	oldInfo, err := old.Info()
	if err != nil {
		t.Fatal(err)
	}
	oldID, _ := oldInfo.ID()
	t2 := make([]uint32, 251)
	for i := range t2 {
		t2[i] = uint32(10 + i%2)
	}
	if err := m.Swap(fe, t2); err != nil {
		t.Fatalf("swap in a table of another size: %v", err)
	}
	for i, want := range t1 {
		var got uint32
		if err := old.Lookup(uint32(i), &got); err != nil || got != want {
			t.Fatalf("old table slot %d: %d %v, want %d untouched (a new table is swapped in)", i, got, err, want)
		}
	}
	var cur *ebpf.Map
	if err := m.Map().Lookup(&key, &cur); err != nil {
		t.Fatal(err)
	}
	curInfo, err := cur.Info()
	cur.Close()
	if err != nil {
		t.Fatal(err)
	}
	if curID, _ := curInfo.ID(); curID == oldID {
		t.Fatalf("the table kept its map ID %d: written in place", curID)
	}
	if err := m.Swap(fe2, t1); err != nil {
		t.Fatal(err)
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	if m, err = maps.OpenMaglev(dir, 0); err != nil {
		t.Fatalf("reopen: %v", err)
	}
	defer m.Close()
	if got, ok, err := m.Table(fe); err != nil || !ok || !slices.Equal(got, t2) {
		t.Fatalf("swapped table: %d slots %v %v, want %d", len(got), ok, err, len(t2))
	}
	fes, err := m.Frontends()
	if err != nil {
		t.Fatal(err)
	}
	slices.SortFunc(fes, lb.L4Addr.Compare)
	if !slices.Equal(fes, []lb.L4Addr{fe, fe2}) {
		t.Fatalf("frontends %v", fes)
	}
	if err := m.Delete([]lb.L4Addr{fe, fe}); err != nil {
		t.Fatalf("delete twice: %v", err)
	}
	if _, ok, err := m.Table(fe); err != nil || ok {
		t.Fatalf("deleted table still there: %v %v", ok, err)
	}
	// Another --bpf-lb-map-max: a new, empty map of that size.
	resized, err := maps.OpenMaglev(dir, 1024)
	if err != nil {
		t.Fatalf("reopen with another size: %v", err)
	}
	if fes, err := resized.Frontends(); err != nil || len(fes) != 0 || resized.Map().MaxEntries() != 1024 {
		t.Fatalf("resized map: %d entries of %d, %v", len(fes), resized.Map().MaxEntries(), err)
	}
	resized.Close()
	if err := maps.UnpinMaglev(dir); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, maps.MaglevMapName)); !os.IsNotExist(err) {
		t.Fatalf("pin after UnpinMaglev: %v", err)
	}
	if err := maps.UnpinMaglev(dir); err != nil {
		t.Fatalf("unpin again: %v", err)
	}
}
