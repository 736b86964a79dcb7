package lbsync

import (
	"context"
	"fmt"
	"slices"
	"testing"

	"github.com/cilium/statedb"

	dpmaps "github.com/cellium/cellium/datapath/maps"
	"github.com/cellium/cellium/statedb/lb"
	"github.com/cellium/cellium/statedb/reconciler"
)

// A prune in rounds leaves alone what an Update between its rounds wrote:
// a frontend the listing saw as stray (left by an earlier run, no row)
// that a row wants and Update wrote since keeps its slot 0, slots and
// affinity matches; a frontend changed since keeps its new backends; a
// truly stray frontend still goes. A backend ID listed as stray that a
// row took since stays too.
func TestPruneRoundsKeepWhatChangesWrote(t *testing.T) {
	tt := newTables(t)
	f := newFakeLB()
	fops := NewFrontendOps(fakeServices{f}, fakeMatch{f}, tt.Backends)
	bops := NewBackendOps(fakeBackends{f}, tt.Backends)
	ctx := context.Background()
	fe := func(i int) lb.L4Addr {
		return lb.L4Addr{Addr: mustAddr(fmt.Sprintf("10.96.0.%d", i)), Port: 80, Proto: lb.TCP}
	}
	be := func(i uint32) lb.L4Addr {
		return lb.L4Addr{Addr: mustAddr(fmt.Sprintf("10.0.0.%d", i)), Port: 8080, Proto: lb.TCP}
	}
	row := func(i int, ids ...uint32) *lb.Frontend {
		r := &lb.Frontend{Address: fe(i), Service: fmt.Sprintf("ns/s%d", i), BackendIDs: ids}
		for _, id := range ids {
			r.Backends = append(r.Backends, be(id))
		}
		return r
	}
	wtxn := tt.DB.WriteTxn(tt.Backends)
	for i := uint32(1); i <= 4; i++ {
		_, _, _ = tt.Backends.Insert(wtxn, &lb.Backend{Address: be(i), ID: i, Status: reconciler.Done()})
		f.backends[i] = be(i)
	}
	// ID 7 is in the map from an earlier run; a row takes it later.
	f.backends[7] = be(7)
	txn := wtxn.Commit()
	a := row(1, 1, 2)
	if err := fops.Update(ctx, txn, a); err != nil {
		t.Fatal(err)
	}
	// Frontends 2 (wanted again soon) and 3 (not) from an earlier run.
	for _, i := range []int{2, 3} {
		if err := fops.update(txn, row(i, 3)); err != nil {
			t.Fatal(err)
		}
	}
	rows := func(rs ...*lb.Frontend) func(func(*lb.Frontend, statedb.Revision) bool) {
		return func(yield func(*lb.Frontend, statedb.Revision) bool) {
			for _, r := range rs {
				if !yield(r, 1) {
					return
				}
			}
		}
	}
	// The first rounds list the maps with only frontend 1 desired.
	for range 3 {
		if done, err := fops.PruneRound(ctx, txn, rows(a), 0); err != nil || done {
			t.Fatalf("round: %v, %v", done, err)
		}
	}
	if done, err := bops.PruneRound(ctx, txn, nil, 0); err != nil || done {
		t.Fatalf("backends round: %v, %v", done, err)
	}
	// Changes between rounds: frontend 1 gains backend 4, frontend 2 is
	// wanted again, backend 7 is a row's.
	a2, b := row(1, 1, 2, 4), row(2, 3, 4)
	wtxn = tt.DB.WriteTxn(tt.Backends)
	_, _, _ = tt.Backends.Insert(wtxn, &lb.Backend{Address: be(7), ID: 7, Status: reconciler.Done()})
	txn = wtxn.Commit()
	for _, r := range []*lb.Frontend{a2, b} {
		if err := fops.Update(ctx, txn, r); err != nil {
			t.Fatal(err)
		}
	}
	for done := false; !done; {
		var err error
		if done, err = fops.PruneRound(ctx, txn, rows(a2, b), 0); err != nil {
			t.Fatal(err)
		}
	}
	for done := false; !done; {
		var err error
		if done, err = bops.PruneRound(ctx, txn, nil, 0); err != nil {
			t.Fatal(err)
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, r := range []*lb.Frontend{a2, b} {
		ids, ok, err := f.scopeSnapshot(r.Address, dpmaps.ScopeExt)
		if err != nil || !ok || !slices.Equal(ids, r.BackendIDs) {
			t.Errorf("frontend %v: %v, %v, %v; want %v", r.Address, ids, ok, err, r.BackendIDs)
		}
		for _, id := range r.BackendIDs {
			if !f.match[dpmaps.AffinityMatch{Frontend: r.Address, BackendID: id}] {
				t.Errorf("frontend %v: affinity match of %d pruned", r.Address, id)
			}
		}
	}
	for k := range f.services {
		if k.Frontend == fe(3) {
			t.Errorf("stray frontend 3 kept: %v", k)
		}
	}
	if _, ok := f.backends[7]; !ok {
		t.Error("backend 7, a row's since the listing, pruned")
	}
}
