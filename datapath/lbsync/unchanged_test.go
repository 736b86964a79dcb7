package lbsync

import (
	"context"
	"fmt"
	"net/netip"
	"testing"

	dpmaps "github.com/cellium/cellium/datapath/maps"
	"github.com/cellium/cellium/statedb/lb"
	"github.com/cellium/cellium/statedb/reconciler"
)

// An Update of a frontend whose last Update wrote the same (the full
// pass of an unchanged table) writes nothing to any map; any change of
// the row writes again. When the maps lose or change a skipped
// frontend's entries behind the agent's back (a slot, slot 0's flags, an
// affinity match, a source range, a Maglev table), Prune writes the
// frontend again and the maps resolve as before; a frontend the maps
// hold as written is not rewritten by Prune.
func TestFrontendOpsSkipsUnchanged(t *testing.T) {
	tt := newTables(t)
	f := newFakeLB()
	ranges := newFakeRanges(f)
	mg := &fakeMaglev{f: f, tables: map[lb.L4Addr][]uint32{}}
	ops := NewFrontendOps(fakeServices{f}, fakeMatch{f}, tt.Backends, WithMaglev(Maglev{Map: mg, TableSize: 7})).WithSourceRanges(ranges)
	be := func(i int) lb.L4Addr {
		return lb.L4Addr{Addr: mustAddr(fmt.Sprintf("10.0.0.%d", i)), Port: 8080, Proto: lb.TCP}
	}
	wtxn := tt.DB.WriteTxn(tt.Backends)
	for i := 1; i <= 4; i++ {
		_, _, _ = tt.Backends.Insert(wtxn, &lb.Backend{Address: be(i), ID: uint32(i), Status: reconciler.Done()})
		f.backends[uint32(i)] = be(i)
	}
	txn := wtxn.Commit()
	ctx := context.Background()
	np := lb.L4Addr{Addr: mustAddr("192.168.56.11"), Port: 30080, Proto: lb.TCP}
	cip := lb.L4Addr{Addr: mustAddr("10.96.0.9"), Port: 80, Proto: lb.TCP}
	nodePort := func() *lb.Frontend {
		return &lb.Frontend{Address: np, Service: "ns/np", Type: lb.TypeNodePort,
			Backends: []lb.L4Addr{be(1), be(2)}, BackendIDs: []uint32{1, 2},
			IntBackends: []lb.L4Addr{be(1)}, IntBackendIDs: []uint32{1}, TwoScopes: true, Local: true,
			SessionAffinity: true, AffinityTimeout: 30,
			SourceRanges: []netip.Prefix{netip.MustParsePrefix("172.16.0.0/16")}}
	}
	clusterIP := func() *lb.Frontend {
		return &lb.Frontend{Address: cip, Service: "ns/c", Backends: []lb.L4Addr{be(3), be(4)}, BackendIDs: []uint32{3, 4}}
	}
	update := func(fs ...*lb.Frontend) {
		t.Helper()
		for _, fe := range fs {
			if err := ops.Update(ctx, txn, fe); err != nil {
				t.Fatal(err)
			}
		}
	}
	prune := func(fs ...*lb.Frontend) {
		t.Helper()
		if err := ops.Prune(ctx, txn, rows(fs...)); err != nil {
			t.Fatal(err)
		}
	}
	want := map[lb.L4Addr][]lb.L4Addr{np: {be(1), be(2)}, cip: {be(3), be(4)}}
	check := func(step string) {
		t.Helper()
		got, err := f.resolved()
		if err != nil {
			t.Fatalf("%s: %v", step, err)
		}
		if !equal(got, want) {
			t.Fatalf("%s: maps resolve to %v, want %v", step, got, want)
		}
		if len(ranges.ranges) != 1 || len(mg.tables) != 1 {
			t.Fatalf("%s: source ranges %v, maglev tables %d, want 1 and 1", step, ranges.ranges, len(mg.tables))
		}
	}
	update(nodePort(), clusterIP())
	check("first write")

	// The full pass: Update of the same rows (new objects), then Prune.
	f.log = nil
	update(nodePort(), clusterIP())
	prune(nodePort(), clusterIP())
	if len(f.log) != 0 {
		t.Fatalf("a full pass of unchanged frontends wrote %q, want nothing", f.log)
	}
	check("full pass")

	// A change of the row is written.
	changed := clusterIP()
	changed.Backends, changed.BackendIDs = []lb.L4Addr{be(3)}, []uint32{3}
	update(changed)
	if len(f.log) == 0 {
		t.Fatal("a changed frontend was not written")
	}
	update(clusterIP())
	check("changed back")

	// Drift: each damage, done behind the agent's back, is skipped by
	// Update (nothing says the row changed) and repaired by Prune.
	damages := []struct {
		name   string
		damage func()
	}{
		{"a slot deleted", func() {
			v0 := f.services[dpmaps.ServiceSlot{Frontend: cip}]
			delete(f.services, dpmaps.ServiceSlot{Frontend: cip, Slot: 2, Bank: bankOf(v0)})
		}},
		{"a slot pointing elsewhere", func() {
			v0 := f.services[dpmaps.ServiceSlot{Frontend: cip}]
			f.services[dpmaps.ServiceSlot{Frontend: cip, Slot: 1, Bank: bankOf(v0)}] = dpmaps.ServiceValue{BackendID: 4}
		}},
		{"slot 0 lost its flags", func() {
			k := dpmaps.ServiceSlot{Frontend: np}
			v0 := f.services[k]
			v0.Local, v0.Affinity = false, false
			f.services[k] = v0
		}},
		{"the internal scope deleted", func() {
			for k := range f.services {
				if k.Frontend == np && k.Scope == dpmaps.ScopeInt {
					delete(f.services, k)
				}
			}
		}},
		{"every entry of the frontend deleted", func() {
			for k := range f.services {
				if k.Frontend == cip {
					delete(f.services, k)
				}
			}
		}},
		{"an affinity match deleted", func() {
			delete(f.match, dpmaps.AffinityMatch{Frontend: np, BackendID: 2})
		}},
		{"a source range deleted", func() { clear(ranges.ranges) }},
		{"the maglev table deleted", func() { clear(mg.tables) }},
	}
	for _, d := range damages {
		f.mu.Lock()
		d.damage()
		f.mu.Unlock()
		f.log = nil
		update(nodePort(), clusterIP())
		if len(f.log) != 0 {
			t.Fatalf("%s: Update wrote %q before Prune", d.name, f.log)
		}
		prune(nodePort(), clusterIP())
		check(d.name)
		v0 := f.services[dpmaps.ServiceSlot{Frontend: np}]
		v0.Bank1 = false
		if want := (dpmaps.ServiceValue{Count: 2, Affinity: true, AffinityTimeout: 30, NodePort: true, Local: true, TwoScopes: true, SourceRange: true}); v0 != want {
			t.Fatalf("%s: NodePort slot 0 %+v, want %+v", d.name, v0, want)
		}
		// Repaired: the next full pass writes nothing.
		f.log = nil
		update(nodePort(), clusterIP())
		prune(nodePort(), clusterIP())
		if len(f.log) != 0 {
			t.Fatalf("%s: the pass after the repair wrote %q", d.name, f.log)
		}
	}

	// Deleted and added again: written again (Delete forgets it).
	if err := ops.Delete(ctx, txn, clusterIP()); err != nil {
		t.Fatal(err)
	}
	update(clusterIP())
	check("deleted and added again")
}
