package lbsync

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"time"

	"github.com/cilium/statedb"

	"github.com/cellium/cellium/datapath/maps"
	"github.com/cellium/cellium/statedb/lb"
	"github.com/cellium/cellium/statedb/reconciler"
)

// Reconciler names (jobs "reconcile-<name>", metrics labels).
const (
	FrontendsReconciler = "lb4-services-map"
	BackendsReconciler  = "lb4-backends-map"
)

// ErrBackendNotReady means a frontend waits for one of its backends to be
// written into the backends map; the reconciler retries it.
var ErrBackendNotReady = errors.New("backend not in the backends map yet")

// ServicesMap is cellium_lb4_services as the reconciler uses it.
// Delete must be idempotent.
type ServicesMap interface {
	Update(keys []maps.ServiceSlot, vals []maps.ServiceValue) error
	Delete(keys []maps.ServiceSlot) error
	// Lookup reports the value of k and whether it exists.
	Lookup(k maps.ServiceSlot) (maps.ServiceValue, bool, error)
	Dump() (map[maps.ServiceSlot]maps.ServiceValue, error)
}

// BackendsMap is cellium_lb4_backends as the reconciler uses it. Delete
// must be idempotent.
type BackendsMap interface {
	Update(ids []uint32, addrs []lb.L4Addr) error
	Delete(ids []uint32) error
	Dump() (map[uint32]lb.L4Addr, error)
}

// AffinityMatchMap is cellium_lb4_affinity_match as the reconciler uses
// it: the (frontend, backend ID) pairs of the services map, which the
// programs check before they follow an affinity entry. Delete must be
// idempotent.
type AffinityMatchMap interface {
	Update(keys []maps.AffinityMatch) error
	Delete(keys []maps.AffinityMatch) error
	Dump() ([]maps.AffinityMatch, error)
}

// SourceRangeMap is cellium_lb4_source_range as the reconciler uses it:
// the (frontend, client prefix) pairs of the frontends with
// loadBalancerSourceRanges. Delete must be idempotent.
type SourceRangeMap interface {
	Update(keys []maps.SourceRange) error
	Delete(keys []maps.SourceRange) error
	Dump() ([]maps.SourceRange, error)
}

// FrontendOps reconciles the lb-frontends table into the services map
// and the affinity match map, and with a SourceRangeMap
// (WithSourceRanges) the frontends' source ranges.
type FrontendOps struct {
	m        ServicesMap
	match    AffinityMatchMap
	backends statedb.Table[*lb.Backend]
	// ranges is nil without source range enforcement: no slot 0 gets
	// LB4_SVC_SOURCE_RANGE then. haveRanges is what the map holds per
	// frontend, read from it at the first use (rangesLoaded) and kept
	// after each successful write.
	ranges       SourceRangeMap
	haveRanges   map[lb.L4Addr][]netip.Prefix
	rangesLoaded bool
	// maglev keeps the frontends' Maglev tables (WithMaglev); nil: none.
	maglev *Maglev
	// written is the fingerprint of what the last successful Update of
	// each frontend wrote (writtenFingerprint), so that an Update that
	// would write the same (the reconciler's periodic full pass) writes
	// nothing; Prune compares the maps with the rows and rewrites the
	// frontends that differ. The reconciler calls the operations
	// serially.
	written map[lb.L4Addr]uint64
	// prune is the prune under way (PruneRound), nil when none is;
	// listed are the entries of the services and affinity match maps the
	// last one listed.
	prune  *frontendPrune
	listed [2]int
}

var (
	_ reconciler.Operations[*lb.Frontend]  = (*FrontendOps)(nil)
	_ reconciler.RoundPruner[*lb.Frontend] = (*FrontendOps)(nil)
)

// NewFrontendOps reconciles into m and match; backends is the lb-backends
// table, whose statuses say which backends are in the backends map.
func NewFrontendOps(m ServicesMap, match AffinityMatchMap, backends statedb.Table[*lb.Backend], opts ...FrontendOption) *FrontendOps {
	o := &FrontendOps{m: m, match: match, backends: backends, written: map[lb.L4Addr]uint64{}}
	for _, opt := range opts {
		opt(o)
	}
	return o
}

// WithSourceRanges makes o write the frontends' source ranges into r and
// flag their slot 0 LB4_SVC_SOURCE_RANGE; it returns o.
func (o *FrontendOps) WithSourceRanges(r SourceRangeMap) *FrontendOps {
	o.ranges = r
	return o
}

// loadRanges reads the source range map into haveRanges once.
func (o *FrontendOps) loadRanges() error {
	if o.rangesLoaded || o.ranges == nil {
		return nil
	}
	have, err := o.ranges.Dump()
	if err != nil {
		return fmt.Errorf("list source range map: %w", err)
	}
	o.haveRanges = map[lb.L4Addr][]netip.Prefix{}
	for _, r := range have {
		o.haveRanges[r.Frontend] = append(o.haveRanges[r.Frontend], r.Prefix)
	}
	o.rangesLoaded = true
	return nil
}

// rangeKeys returns the keys of fe's prefixes ps.
func rangeKeys(fe lb.L4Addr, ps []netip.Prefix) []maps.SourceRange {
	out := make([]maps.SourceRange, len(ps))
	for i, p := range ps {
		out[i] = maps.SourceRange{Frontend: fe, Prefix: p}
	}
	return out
}

// minus returns the prefixes of a not in b.
func minus(a, b []netip.Prefix) []netip.Prefix {
	var out []netip.Prefix
	for _, p := range a {
		if !slices.Contains(b, p) {
			out = append(out, p)
		}
	}
	return out
}

// addRanges writes the prefixes of want fe does not have in the map yet.
func (o *FrontendOps) addRanges(fe lb.L4Addr, want []netip.Prefix) error {
	add := minus(want, o.haveRanges[fe])
	if len(add) == 0 {
		return nil
	}
	if err := o.ranges.Update(rangeKeys(fe, add)); err != nil {
		return fmt.Errorf("write source ranges: %w", err)
	}
	o.haveRanges[fe] = append(o.haveRanges[fe], add...)
	return nil
}

// removeRanges deletes the prefixes of fe in the map that keep does not
// have.
func (o *FrontendOps) removeRanges(fe lb.L4Addr, keep []netip.Prefix) error {
	stale := minus(o.haveRanges[fe], keep)
	if len(stale) == 0 {
		return nil
	}
	if err := o.ranges.Delete(rangeKeys(fe, stale)); err != nil {
		return fmt.Errorf("delete source ranges: %w", err)
	}
	if rest := minus(o.haveRanges[fe], stale); len(rest) > 0 {
		o.haveRanges[fe] = rest
	} else {
		delete(o.haveRanges, fe)
	}
	return nil
}

// bankOf is the bank number of the slots slot 0 value v announces.
func bankOf(v maps.ServiceValue) uint8 {
	if v.Bank1 {
		return 1
	}
	return 0
}

// slotIDs returns the backend IDs of slots 1..n of frontend fe's scope in
// bank bank of the map.
func (o *FrontendOps) slotIDs(fe lb.L4Addr, scope, bank uint8, n int) ([]uint32, error) {
	var ids []uint32
	for s := 1; s <= n; s++ {
		v, ok, err := o.m.Lookup(maps.ServiceSlot{Frontend: fe, Scope: scope, Slot: uint16(s), Bank: bank})
		if err != nil {
			return nil, err
		}
		if ok {
			ids = append(ids, v.BackendID)
		}
	}
	return ids, nil
}

// scopeIDs returns slot 0 of frontend fe's scope, whether it exists, and
// the backend IDs of its slots (in the bank it names).
func (o *FrontendOps) scopeIDs(fe lb.L4Addr, scope uint8) (maps.ServiceValue, bool, []uint32, error) {
	v, ok, err := o.m.Lookup(maps.ServiceSlot{Frontend: fe, Scope: scope})
	if err != nil || !ok {
		return v, ok, nil, err
	}
	ids, err := o.slotIDs(fe, scope, bankOf(v), int(v.Count))
	return v, ok, ids, err
}

// matches returns the affinity match keys of fe for ids not in except.
func matches(fe lb.L4Addr, ids []uint32, except []uint32) []maps.AffinityMatch {
	var out []maps.AffinityMatch
	for _, id := range ids {
		if !slices.Contains(except, id) {
			out = append(out, maps.AffinityMatch{Frontend: fe, BackendID: id})
		}
	}
	return out
}

// writeScope writes fe's scope with backend IDs ids: when slot 0 exists
// (old, had), slots 1..n into the bank old does not name, then slot 0
// with zero (its Count n, naming that bank), then deletes the old bank's
// slots 1..old.Count; else slots 1..n of bank 0, then slot 0. A program
// reads slot 0 first and then a slot of the bank it names: it sees the
// old backends or the new ones, never a mix.
func (o *FrontendOps) writeScope(fe lb.L4Addr, scope uint8, ids []uint32, zero maps.ServiceValue, old maps.ServiceValue, had bool) error {
	n := len(ids)
	bank := uint8(0)
	if had {
		bank = 1 - bankOf(old)
	}
	keys := make([]maps.ServiceSlot, 0, n)
	vals := make([]maps.ServiceValue, 0, n)
	for i, id := range ids {
		keys = append(keys, maps.ServiceSlot{Frontend: fe, Scope: scope, Slot: uint16(i + 1), Bank: bank})
		vals = append(vals, maps.ServiceValue{BackendID: id})
	}
	if n > 0 {
		if err := o.m.Update(keys, vals); err != nil {
			return fmt.Errorf("write slots: %w", err)
		}
	}
	zero.Count = uint16(n)
	zero.Bank1 = bank == 1
	if err := o.m.Update([]maps.ServiceSlot{{Frontend: fe, Scope: scope}}, []maps.ServiceValue{zero}); err != nil {
		return fmt.Errorf("write count: %w", err)
	}
	if had && old.Count > 0 {
		stale := make([]maps.ServiceSlot, 0, old.Count)
		for s := 1; s <= int(old.Count); s++ {
			stale = append(stale, maps.ServiceSlot{Frontend: fe, Scope: scope, Slot: uint16(s), Bank: bankOf(old)})
		}
		if err := o.m.Delete(stale); err != nil {
			return fmt.Errorf("delete the old bank's slots: %w", err)
		}
	}
	return nil
}

// deleteScope deletes slot 0 of fe's scope, then its slots 1..n of both
// banks.
func (o *FrontendOps) deleteScope(fe lb.L4Addr, scope uint8, n int) error {
	slots := []maps.ServiceSlot{{Frontend: fe, Scope: scope}}
	for _, bank := range []uint8{0, 1} {
		for s := 1; s <= n; s++ {
			slots = append(slots, maps.ServiceSlot{Frontend: fe, Scope: scope, Slot: uint16(s), Bank: bank})
		}
	}
	if err := o.m.Delete(slots[:1]); err != nil {
		return err
	}
	return o.m.Delete(slots[1:])
}

// Update implements reconciler.Operations: once every backend of f is in
// the backends map (its row Done), it deletes the affinity matches of
// the backends f lost (so that no affinity entry leads to them from now
// on) and adds those of its backends; with TwoScopes it writes the
// internal scope first (slots, then slot 0); then the external scope,
// slots 1..n, then slot 0 with the count n, flags and affinity timeout,
// then deletes the slots above n that an older version had; an internal
// scope f no longer has goes last. With a source range map, f's source
// ranges are written before the external slot 0 is flagged
// LB4_SVC_SOURCE_RANGE, and the ones it no longer has deleted after slot
// 0 is rewritten: a program never sees the flag without the frontend's
// ranges.
//
// A frontend whose last successful Update wrote what f would write is
// left as it is.
func (o *FrontendOps) Update(_ context.Context, txn statedb.ReadTxn, f *lb.Frontend) error {
	fp := writtenFingerprint(f)
	if have, ok := o.written[f.Address]; ok && have == fp {
		return nil
	}
	delete(o.written, f.Address)
	o.touch(f.Address)
	if err := o.update(txn, f); err != nil {
		return err
	}
	o.written[f.Address] = fp
	return nil
}

// slotZeros returns the slot 0 values of f's external and internal
// scopes as Update writes them, without Count and Bank1.
func (o *FrontendOps) slotZeros(f *lb.Frontend) (ext, internal maps.ServiceValue) {
	internal = maps.ServiceValue{Affinity: f.SessionAffinity, AffinityTimeout: f.AffinityTimeout, NodePort: f.NodePort()}
	ext = internal
	ext.Local, ext.TwoScopes = f.Local, f.TwoScopes
	ext.SourceRange = o.ranges != nil && len(f.SourceRanges) > 0
	return ext, internal
}

// writtenFingerprint sums up everything Update writes for f: the slot 0
// values' inputs, both scopes' backends and IDs in order, and the source
// ranges.
func writtenFingerprint(f *lb.Frontend) uint64 {
	h := fnv64a(fnvOffset64)
	flag := func(v bool) {
		if v {
			h.u32(1)
		} else {
			h.u32(0)
		}
	}
	flag(f.SessionAffinity)
	h.u32(f.AffinityTimeout)
	flag(f.NodePort())
	flag(f.Local)
	flag(f.TwoScopes)
	for _, scope := range [][]lb.L4Addr{f.Backends, f.IntBackends} {
		h.u32(uint32(len(scope)))
		for _, a := range scope {
			h.addr(a.Addr)
			h.u32(uint32(a.Port)<<8 | uint32(a.Proto))
		}
	}
	for _, ids := range [][]uint32{f.BackendIDs, f.IntBackendIDs} {
		h.u32(uint32(len(ids)))
		for _, id := range ids {
			h.u32(id)
		}
	}
	h.u32(uint32(len(f.SourceRanges)))
	for _, p := range f.SourceRanges {
		h.addr(p.Addr())
		h.u32(uint32(p.Bits()))
	}
	return uint64(h)
}

// fnv64a is FNV-1a over the fingerprint's fields, inline so that the full
// pass hashes its 100,000s of backends without an allocation each.
type fnv64a uint64

const (
	fnvOffset64 = 14695981039346656037
	fnvPrime64  = 1099511628211
)

func (h *fnv64a) byte(c byte) { *h = (*h ^ fnv64a(c)) * fnvPrime64 }

func (h *fnv64a) u32(v uint32) {
	for i := range 4 {
		h.byte(byte(v >> (8 * i)))
	}
}

// addr hashes the address's bit length (0 for the zero Addr, so an IPv4
// and its IPv4-mapped IPv6 form differ) and its 16-byte form.
func (h *fnv64a) addr(a netip.Addr) {
	h.byte(byte(a.BitLen()))
	for _, c := range a.As16() {
		h.byte(c)
	}
}

// update writes f into the maps (Update without the fingerprint).
func (o *FrontendOps) update(txn statedb.ReadTxn, f *lb.Frontend) error {
	if len(f.BackendIDs) != len(f.Backends) || len(f.IntBackendIDs) != len(f.IntBackends) {
		return fmt.Errorf("frontend %v: %d+%d backends but %d+%d IDs", f.Address, len(f.Backends), len(f.IntBackends),
			len(f.BackendIDs), len(f.IntBackendIDs))
	}
	all, allIDs := f.AllBackends()
	for i, id := range allIDs {
		b, _, ok := o.backends.Get(txn, lb.BackendIDIndex.Query(id))
		if !ok || b.Address != all[i] || b.Status.Kind != reconciler.StatusDone {
			return fmt.Errorf("frontend %v: backend %v (ID %d): %w", f.Address, all[i], id, ErrBackendNotReady)
		}
	}
	old, hadExt, oldIDs, err := o.scopeIDs(f.Address, maps.ScopeExt)
	if err != nil {
		return fmt.Errorf("frontend %v: %w", f.Address, err)
	}
	oldInt, hadInt, oldIntIDs, err := o.scopeIDs(f.Address, maps.ScopeInt)
	if err != nil {
		return fmt.Errorf("frontend %v: %w", f.Address, err)
	}
	// A backend of both scopes has one match.
	uniq := slices.Compact(slices.Sorted(slices.Values(allIDs)))
	if err := o.match.Delete(matches(f.Address, slices.Concat(oldIDs, oldIntIDs), uniq)); err != nil {
		return fmt.Errorf("frontend %v: delete affinity matches: %w", f.Address, err)
	}
	if err := o.match.Update(matches(f.Address, uniq, nil)); err != nil {
		return fmt.Errorf("frontend %v: write affinity matches: %w", f.Address, err)
	}
	ext, zero := o.slotZeros(f)
	if f.TwoScopes {
		if err := o.writeScope(f.Address, maps.ScopeInt, f.IntBackendIDs, zero, oldInt, hadInt); err != nil {
			return fmt.Errorf("frontend %v internal scope: %w", f.Address, err)
		}
	}
	// The Maglev table before the slot 0 that announces the frontend.
	if o.maglev != nil {
		if err := o.maglev.update(f); err != nil {
			return fmt.Errorf("frontend %v: %w", f.Address, err)
		}
	}
	if o.ranges != nil {
		if err := o.loadRanges(); err != nil {
			return fmt.Errorf("frontend %v: %w", f.Address, err)
		}
		if err := o.addRanges(f.Address, f.SourceRanges); err != nil {
			return fmt.Errorf("frontend %v: %w", f.Address, err)
		}
	}
	if err := o.writeScope(f.Address, maps.ScopeExt, f.BackendIDs, ext, old, hadExt); err != nil {
		return fmt.Errorf("frontend %v: %w", f.Address, err)
	}
	if o.ranges != nil {
		if err := o.removeRanges(f.Address, f.SourceRanges); err != nil {
			return fmt.Errorf("frontend %v: %w", f.Address, err)
		}
	}
	if hadInt && !f.TwoScopes {
		if err := o.deleteScope(f.Address, maps.ScopeInt, int(oldInt.Count)); err != nil {
			return fmt.Errorf("frontend %v: delete internal scope: %w", f.Address, err)
		}
	}
	return nil
}

// Delete implements reconciler.Operations: slot 0 of the external scope
// first (the frontend is gone for the programs), then its slots, the
// internal scope, the affinity matches and the source ranges.
func (o *FrontendOps) Delete(_ context.Context, _ statedb.ReadTxn, f *lb.Frontend) error {
	delete(o.written, f.Address)
	o.touch(f.Address)
	_, allIDs := f.AllBackends()
	var ids []uint32
	for _, scope := range []uint8{maps.ScopeExt, maps.ScopeInt} {
		n := len(f.BackendIDs)
		if scope == maps.ScopeInt {
			n = len(f.IntBackendIDs)
		}
		v, ok, err := o.m.Lookup(maps.ServiceSlot{Frontend: f.Address, Scope: scope})
		if err != nil {
			return fmt.Errorf("frontend %v: %w", f.Address, err)
		}
		if ok {
			n = max(n, int(v.Count))
		}
		sids, err := o.slotIDs(f.Address, scope, bankOf(v), n)
		if err != nil {
			return fmt.Errorf("frontend %v: %w", f.Address, err)
		}
		ids = append(ids, sids...)
		if err := o.deleteScope(f.Address, scope, n); err != nil {
			return fmt.Errorf("delete frontend %v: %w", f.Address, err)
		}
	}
	ids = append(ids, allIDs...)
	if err := o.match.Delete(matches(f.Address, ids, nil)); err != nil {
		return fmt.Errorf("delete frontend %v: affinity matches: %w", f.Address, err)
	}
	if o.ranges != nil {
		if err := o.loadRanges(); err != nil {
			return fmt.Errorf("delete frontend %v: %w", f.Address, err)
		}
		// Ranges the map got from an earlier run and f's own.
		o.haveRanges[f.Address] = slices.Concat(o.haveRanges[f.Address], minus(f.SourceRanges, o.haveRanges[f.Address]))
		if err := o.removeRanges(f.Address, nil); err != nil {
			return fmt.Errorf("delete frontend %v: %w", f.Address, err)
		}
	}
	if o.maglev != nil {
		if err := o.maglev.delete(f); err != nil {
			return fmt.Errorf("delete frontend %v: %w", f.Address, err)
		}
	}
	return nil
}

// holds reports whether the services map have and the affinity matches
// present hold f as Update writes it: both scopes' slot 0 and slots in
// the bank slot 0 names, and a match per backend.
func (o *FrontendOps) holds(have map[maps.ServiceSlot]maps.ServiceValue, present map[maps.AffinityMatch]bool, f *lb.Frontend) bool {
	type scopeWant struct {
		scope uint8
		zero  maps.ServiceValue
		ids   []uint32
	}
	ext, internal := o.slotZeros(f)
	scopes := []scopeWant{{maps.ScopeExt, ext, f.BackendIDs}}
	if f.TwoScopes {
		scopes = append(scopes, scopeWant{maps.ScopeInt, internal, f.IntBackendIDs})
	}
	for _, sc := range scopes {
		v0, ok := have[maps.ServiceSlot{Frontend: f.Address, Scope: sc.scope}]
		bank := bankOf(v0)
		v0.Bank1 = false
		sc.zero.Count = uint16(len(sc.ids))
		if !ok || v0 != sc.zero {
			return false
		}
		for i, id := range sc.ids {
			v, ok := have[maps.ServiceSlot{Frontend: f.Address, Scope: sc.scope, Slot: uint16(i + 1), Bank: bank}]
			if !ok || v.BackendID != id {
				return false
			}
		}
	}
	_, ids := f.AllBackends()
	for _, id := range ids {
		if !present[maps.AffinityMatch{Frontend: f.Address, BackendID: id}] {
			return false
		}
	}
	return true
}

// BackendOps reconciles the lb-backends table into the backends map.
type BackendOps struct {
	m        BackendsMap
	backends statedb.Table[*lb.Backend]
	// prune is the prune under way (PruneRound), nil when none is;
	// listed are the entries the last one listed.
	prune  *backendPrune
	listed int
}

var (
	_ reconciler.Operations[*lb.Backend]  = (*BackendOps)(nil)
	_ reconciler.RoundPruner[*lb.Backend] = (*BackendOps)(nil)
)

// NewBackendOps reconciles the table backends into m.
func NewBackendOps(m BackendsMap, backends statedb.Table[*lb.Backend]) *BackendOps {
	return &BackendOps{m: m, backends: backends}
}

// Update implements reconciler.Operations.
func (o *BackendOps) Update(_ context.Context, _ statedb.ReadTxn, b *lb.Backend) error {
	o.touch(b.ID)
	if err := o.m.Update([]uint32{b.ID}, []lb.L4Addr{b.Address}); err != nil {
		return fmt.Errorf("backend %d (%v): %w", b.ID, b.Address, err)
	}
	return nil
}

// Delete implements reconciler.Operations. An ID another backend holds
// now (reused) is left alone: that backend's Update writes it, possibly
// in the same round before this delete.
func (o *BackendOps) Delete(_ context.Context, txn statedb.ReadTxn, b *lb.Backend) error {
	if cur, _, ok := o.backends.Get(txn, lb.BackendIDIndex.Query(b.ID)); ok && cur.Address != b.Address {
		return nil
	}
	o.touch(b.ID)
	if err := o.m.Delete([]uint32{b.ID}); err != nil {
		return fmt.Errorf("delete backend %d (%v): %w", b.ID, b.Address, err)
	}
	return nil
}

// FrontendsConfig returns the configuration of the reconciler of the
// lb-frontends table into m and match (and, WithMaglev, the Maglev
// tables).
func FrontendsConfig(t Tables, m ServicesMap, match AffinityMatchMap, opts ...FrontendOption) reconciler.Config[*lb.Frontend] {
	return FrontendsConfigWithRanges(t, m, match, nil, opts...)
}

// FrontendsConfigWithRanges is FrontendsConfig also reconciling the
// frontends' source ranges into ranges (none when nil).
func FrontendsConfigWithRanges(t Tables, m ServicesMap, match AffinityMatchMap, ranges SourceRangeMap, opts ...FrontendOption) reconciler.Config[*lb.Frontend] {
	ops := NewFrontendOps(m, match, t.Backends, opts...)
	if ranges != nil {
		ops.WithSourceRanges(ranges)
	}
	return reconciler.Config[*lb.Frontend]{
		Name: FrontendsReconciler, Table: t.Frontends, Operations: ops,
		GetStatus: func(f *lb.Frontend) reconciler.Status { return f.Status },
		SetStatus: (*lb.Frontend).WithStatus,
		// A frontend waits for its backends: retry soon, and at once when
		// the backends' rows change (a status written after the backends
		// map was), instead of after a backoff that doubled meanwhile.
		RetryMin: 5 * time.Millisecond, RetryMax: 5 * time.Second,
		Wake: func(txn statedb.ReadTxn) <-chan struct{} {
			_, w := t.Backends.AllWatch(txn)
			return w
		},
		Waits: func(err error) bool { return errors.Is(err, ErrBackendNotReady) },
	}
}

// BackendsConfig returns the configuration of the reconciler of the
// lb-backends table into m.
func BackendsConfig(t Tables, m BackendsMap) reconciler.Config[*lb.Backend] {
	return reconciler.Config[*lb.Backend]{
		Name: BackendsReconciler, Table: t.Backends, Operations: NewBackendOps(m, t.Backends),
		GetStatus: func(b *lb.Backend) reconciler.Status { return b.Status },
		SetStatus: (*lb.Backend).WithStatus,
	}
}
