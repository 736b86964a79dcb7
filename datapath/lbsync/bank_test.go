package lbsync

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/cilium/statedb"

	dpmaps "github.com/cellium/cellium/datapath/maps"
	"github.com/cellium/cellium/statedb/lb"
	"github.com/cellium/cellium/statedb/reconciler"
)

// scopeSnapshot reads slot 0 of fe's scope and the slots of the bank it
// names, as one program run would if the map held still: the backend
// IDs, and whether slot 0 exists. Call with f.mu held.
func (f *fakeLB) scopeSnapshot(fe lb.L4Addr, scope uint8) ([]uint32, bool, error) {
	v, ok := f.services[dpmaps.ServiceSlot{Frontend: fe, Scope: scope}]
	if !ok {
		return nil, false, nil
	}
	ids := []uint32{}
	for s := uint16(1); s <= v.Count; s++ {
		sv, ok := f.services[dpmaps.ServiceSlot{Frontend: fe, Scope: scope, Slot: s, Bank: bankOf(v)}]
		if !ok {
			return nil, true, fmt.Errorf("slot %d of %d (bank %d) missing", s, v.Count, bankOf(v))
		}
		ids = append(ids, sv.BackendID)
	}
	return ids, true, nil
}

// A frontend updated again and again (growing, shrinking, replaced
// backends, none, a second scope): after every single write to the
// services map, each scope holds the old version's backends or the new
// one's, never a mix (checked between every two writes); readers running
// beside the writer never see anything else either, and a program's pick
// (slot 0, then one slot of its bank, two separate reads) is always a
// backend of some version.
func TestFrontendOpsNeverMixesBackends(t *testing.T) {
	tt := newTables(t)
	f := newFakeLB()
	ops := NewFrontendOps(fakeServices{f}, fakeMatch{f}, tt.Backends)
	fe := lb.L4Addr{Addr: mustAddr("10.96.0.7"), Port: 80, Proto: lb.TCP}
	be := func(i uint32) lb.L4Addr {
		return lb.L4Addr{Addr: mustAddr(fmt.Sprintf("10.0.0.%d", i)), Port: 8080, Proto: lb.TCP}
	}
	wtxn := tt.DB.WriteTxn(tt.Backends)
	for i := uint32(1); i <= 12; i++ {
		_, _, _ = tt.Backends.Insert(wtxn, &lb.Backend{Address: be(i), ID: i, Status: reconciler.Done()})
		f.backends[i] = be(i)
	}
	txn := wtxn.Commit()
	type version struct{ ext, int []uint32 }
	versions := []version{
		{ext: []uint32{1, 2, 3, 4, 5}},
		{ext: []uint32{6, 7}},
		{ext: []uint32{1, 6, 8, 9, 10, 11}},
		{ext: []uint32{2}, int: []uint32{2, 3, 4}},
		{ext: []uint32{}, int: []uint32{5, 6}},
		{ext: []uint32{3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, int: []uint32{1}},
		{ext: []uint32{12, 11, 10}},
	}
	row := func(v version) *lb.Frontend {
		r := &lb.Frontend{Address: fe, Service: "ns/s", BackendIDs: v.ext, TwoScopes: v.int != nil, IntBackendIDs: v.int}
		for _, id := range v.ext {
			r.Backends = append(r.Backends, be(id))
		}
		for _, id := range v.int {
			r.IntBackends = append(r.IntBackends, be(id))
		}
		return r
	}
	// known says whether ids are a version's backends of the scope.
	known := func(ids []uint32, scope uint8, among ...version) bool {
		for _, v := range among {
			want := v.ext
			if scope == dpmaps.ScopeInt {
				want = v.int
			}
			if slices.Equal(ids, want) {
				return true
			}
		}
		return false
	}
	// Between every two writes: the previous version or the one being
	// written (the internal scope may also be absent while it comes or
	// goes: the programs then use the external scope).
	var prev, cur version
	var mixes []string
	f.afterWrite = func() {
		for _, scope := range []uint8{dpmaps.ScopeExt, dpmaps.ScopeInt} {
			ids, ok, err := f.scopeSnapshot(fe, scope)
			switch {
			case err != nil:
				mixes = append(mixes, fmt.Sprintf("scope %d: %v", scope, err))
			case ok && !known(ids, scope, prev, cur):
				mixes = append(mixes, fmt.Sprintf("scope %d holds %v between %v and %v", scope, ids, prev, cur))
			}
		}
	}
	ctx := context.Background()
	cur = versions[0]
	if err := ops.Update(ctx, txn, row(versions[0])); err != nil {
		t.Fatal(err)
	}
	// Readers beside the writer.
	var stop atomic.Bool
	var wg sync.WaitGroup
	var bad sync.Map
	var reads atomic.Int64
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
				f.mu.Lock()
				ids, ok, err := f.scopeSnapshot(fe, dpmaps.ScopeExt)
				v, ok0 := f.services[dpmaps.ServiceSlot{Frontend: fe}]
				f.mu.Unlock()
				if err != nil || (ok && !known(ids, dpmaps.ScopeExt, versions...)) {
					bad.Store(fmt.Sprintf("snapshot %v %v", ids, err), true)
				}
				if ok0 && v.Count > 0 {
					// A program's two reads.
					f.mu.Lock()
					sv, ok := f.services[dpmaps.ServiceSlot{Frontend: fe, Slot: 1 + uint16(reads.Load())%v.Count, Bank: bankOf(v)}]
					f.mu.Unlock()
					if ok && (sv.BackendID < 1 || sv.BackendID > 12) {
						bad.Store(fmt.Sprintf("pick %d", sv.BackendID), true)
					}
				}
				reads.Add(1)
			}
		}()
	}
	updates := 0
	for i := range 300 {
		next := versions[(i+1)%len(versions)]
		f.mu.Lock()
		prev, cur = cur, next
		f.mu.Unlock()
		if err := ops.Update(ctx, txn, row(next)); err != nil {
			t.Fatal(err)
		}
		updates++
		if _, err := f.resolved(); err != nil {
			t.Fatalf("after update %d: %v", i, err)
		}
	}
	stop.Store(true)
	wg.Wait()
	if len(mixes) > 0 {
		t.Fatalf("%d states mixed two versions, the first: %v", len(mixes), mixes[:min(len(mixes), 3)])
	}
	bad.Range(func(k, _ any) bool { t.Errorf("reader saw %v", k); return true })
	t.Logf("%d updates, %d concurrent reads", updates, reads.Load())

	// An update that stopped half way (an agent killed between the slots
	// and slot 0) leaves slots in the bank slot 0 does not name: Prune
	// deletes them, and the next update overwrites that bank anyway.
	f.afterWrite = nil
	v0 := f.services[dpmaps.ServiceSlot{Frontend: fe}]
	other := 1 - bankOf(v0)
	f.services[dpmaps.ServiceSlot{Frontend: fe, Slot: 1, Bank: other}] = dpmaps.ServiceValue{BackendID: 1}
	f.services[dpmaps.ServiceSlot{Frontend: fe, Slot: 40, Bank: other}] = dpmaps.ServiceValue{BackendID: 2}
	last := row(cur)
	if err := ops.Prune(ctx, txn, func(yield func(*lb.Frontend, statedb.Revision) bool) { yield(last, 1) }); err != nil {
		t.Fatal(err)
	}
	for k := range f.services {
		if k.Bank == other {
			t.Errorf("slot %+v of the unused bank left by Prune", k)
		}
	}
	if _, err := f.resolved(); err != nil {
		t.Fatal(err)
	}
}
