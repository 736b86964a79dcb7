package lbsync

import (
	"context"
	"fmt"
	"iter"
	"maps"
	"slices"
	"testing"

	"github.com/cilium/statedb"

	"github.com/cellium/cellium/datapath/maglev"
	dpmaps "github.com/cellium/cellium/datapath/maps"
	"github.com/cellium/cellium/statedb/lb"
	"github.com/cellium/cellium/statedb/reconciler"
)

// fakeMaglev is cellium_lb4_maglev in memory: each Swap puts a new table
// (a copy) in place of the old one, logged in the fakeLB's write log.
type fakeMaglev struct {
	f      *fakeLB
	tables map[lb.L4Addr][]uint32
	swaps  int
	fail   error
}

func (m *fakeMaglev) Swap(fe lb.L4Addr, table []uint32) error {
	m.f.mu.Lock()
	defer m.f.mu.Unlock()
	if m.fail != nil {
		return m.fail
	}
	for i, id := range table {
		if _, ok := m.f.backends[id]; !ok {
			m.f.dangling = append(m.f.dangling, fmt.Sprintf("%v maglev slot %d -> %d", fe, i, id))
		}
	}
	m.tables[fe] = slices.Clone(table)
	m.swaps++
	m.f.log = append(m.f.log, fmt.Sprintf("maglev %d", len(table)))
	return nil
}

func (m *fakeMaglev) Delete(fes []lb.L4Addr) error {
	m.f.mu.Lock()
	defer m.f.mu.Unlock()
	for _, fe := range fes {
		if _, ok := m.tables[fe]; ok {
			m.f.log = append(m.f.log, "maglev delete")
		}
		delete(m.tables, fe)
	}
	return nil
}

func (m *fakeMaglev) Frontends() ([]lb.L4Addr, error) {
	m.f.mu.Lock()
	defer m.f.mu.Unlock()
	return slices.Collect(maps.Keys(m.tables)), nil
}

func rows(fs ...*lb.Frontend) iter.Seq2[*lb.Frontend, statedb.Revision] {
	return func(yield func(*lb.Frontend, statedb.Revision) bool) {
		for _, f := range fs {
			if !yield(f, 0) {
				return
			}
		}
	}
}

// FrontendOps with WithMaglev: an external frontend's table is swapped in
// before its slot 0 announces it and holds exactly its backends as
// maglev.Table computes them; a change of backends swaps in a rebuilt
// table; no backends, a ClusterIP or the 0.0.0.0 NodePort have none;
// Delete and Prune remove tables; with random selection (TableSize 0)
// the tables of an earlier run go.
func TestFrontendOpsMaglev(t *testing.T) {
	tt := newTables(t)
	f := newFakeLB()
	mm := &fakeMaglev{f: f, tables: map[lb.L4Addr][]uint32{}}
	seed, err := maglev.ParseSeed(maglev.DefaultHashSeed)
	if err != nil {
		t.Fatal(err)
	}
	const m = 251
	ops := NewFrontendOps(fakeServices{f}, fakeMatch{f}, tt.Backends, WithMaglev(Maglev{Map: mm, TableSize: m, Seed: seed}))
	be := func(i int) lb.L4Addr {
		return lb.L4Addr{Addr: mustAddr(fmt.Sprintf("10.0.0.%d", i)), Port: 8080, Proto: lb.TCP}
	}
	wtxn := tt.DB.WriteTxn(tt.Backends)
	for i := 1; i <= 3; i++ {
		_, _, _ = tt.Backends.Insert(wtxn, &lb.Backend{Address: be(i), ID: uint32(i), Status: reconciler.Done()})
		f.backends[uint32(i)] = be(i)
	}
	txn := wtxn.Commit()
	ctx := context.Background()
	np := lb.L4Addr{Addr: mustAddr("192.168.56.11"), Port: 30080, Proto: lb.TCP}
	nodePort := func(ids ...int) *lb.Frontend {
		r := &lb.Frontend{Address: np, Type: lb.TypeNodePort, Service: "ns/s"}
		for _, i := range ids {
			r.Backends, r.BackendIDs = append(r.Backends, be(i)), append(r.BackendIDs, uint32(i))
		}
		return r
	}
	want := func(ids ...int) []uint32 {
		var bs []maglev.Backend
		for _, i := range ids {
			bs = append(bs, maglev.Backend{Name: be(i).String(), ID: uint32(i)})
		}
		return maglev.Table(m, seed, bs)
	}

	if err := ops.Update(ctx, txn, nodePort(1, 2, 3)); err != nil {
		t.Fatal(err)
	}
	if want := []string{"match+ 1", "match+ 2", "match+ 3", "maglev 251", "slot 1=1", "slot 2=2", "slot 3=3", "count 3"}; !slices.Equal(f.log, want) {
		t.Errorf("writes %q, want %q (the table before slot 0)", f.log, want)
	}
	if !slices.Equal(mm.tables[np], want(1, 2, 3)) {
		t.Fatalf("table of %v is not maglev.Table of its backends", np)
	}

	t.Run("backend change rebuilds", func(t *testing.T) {
		before := mm.tables[np]
		if err := ops.Update(ctx, txn, nodePort(1, 3)); err != nil {
			t.Fatal(err)
		}
		got := mm.tables[np]
		if !slices.Equal(got, want(1, 3)) || slices.Contains(got, 2) || mm.swaps != 2 {
			t.Fatalf("after backend 2 left: %d swaps, table has 2: %v", mm.swaps, slices.Contains(got, 2))
		}
		moved := 0
		for i := range got {
			if before[i] != 2 && before[i] != got[i] {
				moved++
			}
		}
		if moved > m/20 {
			t.Errorf("%d slots of the remaining backends moved", moved)
		}
	})

	// The reconciler's full pass updates every row again: an unchanged
	// frontend keeps its table (no rebuild, no new inner map); a table
	// that left the map is built again after a prune notices.
	t.Run("unchanged keeps its table", func(t *testing.T) {
		swaps := mm.swaps
		for range 3 {
			if err := ops.Update(ctx, txn, nodePort(1, 3)); err != nil {
				t.Fatal(err)
			}
		}
		if mm.swaps != swaps {
			t.Fatalf("%d swaps for updates that changed nothing", mm.swaps-swaps)
		}
		delete(mm.tables, np)
		if err := ops.Prune(ctx, txn, rows(nodePort(1, 3))); err != nil {
			t.Fatal(err)
		}
		if err := ops.Update(ctx, txn, nodePort(1, 3)); err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(mm.tables[np], want(1, 3)) {
			t.Fatal("a table removed from the map was not built again")
		}
	})

	t.Run("no table", func(t *testing.T) {
		for _, r := range []*lb.Frontend{
			{Address: lb.L4Addr{Addr: mustAddr("10.96.0.1"), Port: 80, Proto: lb.TCP}, Backends: []lb.L4Addr{be(1)}, BackendIDs: []uint32{1}},
			{Address: lb.L4Addr{Addr: mustAddr("0.0.0.0"), Port: 30080, Proto: lb.TCP}, Type: lb.TypeNodePort, Backends: []lb.L4Addr{be(1)}, BackendIDs: []uint32{1}},
		} {
			if err := ops.Update(ctx, txn, r); err != nil {
				t.Fatal(err)
			}
			if _, ok := mm.tables[r.Address]; ok {
				t.Errorf("%s %v has a Maglev table", r.TypeName(), r.Address)
			}
		}
		// The last backend goes: the table goes.
		if err := ops.Update(ctx, txn, nodePort()); err != nil {
			t.Fatal(err)
		}
		if _, ok := mm.tables[np]; ok {
			t.Errorf("frontend without backends keeps its table")
		}
	})

	t.Run("delete and prune", func(t *testing.T) {
		if err := ops.Update(ctx, txn, nodePort(1, 2)); err != nil {
			t.Fatal(err)
		}
		stray := lb.L4Addr{Addr: mustAddr("192.168.56.11"), Port: 31000, Proto: lb.UDP}
		mm.tables[stray] = []uint32{9}
		if err := ops.Prune(ctx, txn, rows(nodePort(1, 2))); err != nil {
			t.Fatal(err)
		}
		if _, ok := mm.tables[stray]; ok {
			t.Error("prune kept a table no row wants")
		}
		if _, ok := mm.tables[np]; !ok {
			t.Error("prune removed a wanted table")
		}
		if err := ops.Delete(ctx, txn, nodePort(1, 2)); err != nil {
			t.Fatal(err)
		}
		if len(mm.tables) != 0 || len(f.services) != 0 {
			t.Errorf("after delete: tables %v, services %v", mm.tables, f.services)
		}
	})

	t.Run("swap fails", func(t *testing.T) {
		mm.fail = errInjected
		defer func() { mm.fail = nil }()
		if err := ops.Update(ctx, txn, nodePort(1)); err == nil {
			t.Fatal("update succeeded without its table")
		}
		if _, ok := f.services[dpmaps.ServiceSlot{Frontend: np}]; ok {
			t.Error("slot 0 written though the table could not be")
		}
	})

	t.Run("random removes tables", func(t *testing.T) {
		if err := ops.Update(ctx, txn, nodePort(1, 2)); err != nil {
			t.Fatal(err)
		}
		random := NewFrontendOps(fakeServices{f}, fakeMatch{f}, tt.Backends, WithMaglev(Maglev{Map: mm}))
		if err := random.Update(ctx, txn, nodePort(1, 2)); err != nil {
			t.Fatal(err)
		}
		if len(mm.tables) != 0 {
			t.Errorf("random selection keeps tables %v", mm.tables)
		}
		mm.tables[np] = []uint32{1}
		if err := random.Prune(ctx, txn, rows(nodePort(1, 2))); err != nil {
			t.Fatal(err)
		}
		if len(mm.tables) != 0 {
			t.Errorf("random selection's prune keeps tables %v", mm.tables)
		}
	})
	if len(f.dangling) > 0 {
		t.Errorf("entries naming backends not in the map: %v", f.dangling)
	}
}
