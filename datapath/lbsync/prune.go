package lbsync

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"net/netip"
	"slices"
	"time"

	"github.com/cilium/statedb"

	"github.com/cellium/cellium/datapath/maps"
	"github.com/cellium/cellium/statedb/lb"
	"github.com/cellium/cellium/statedb/reconciler"
)

// The listings of the maps, a batch at a time: the pinned maps read them
// with BPF_MAP_LOOKUP_BATCH, so that a prune lists 100,000s of entries in
// rounds (PruneRound) with the reconcilers' changes between them.
type (
	// ServicesBatcher is a ServicesMap that lists itself in batches.
	ServicesBatcher interface {
		Batches() *maps.Batches[maps.ServiceSlot, maps.ServiceValue]
	}
	// BackendsBatcher is a BackendsMap that lists itself in batches.
	BackendsBatcher interface {
		Batches() *maps.Batches[uint32, lb.L4Addr]
	}
	// AffinityMatchBatcher is an AffinityMatchMap that lists itself in
	// batches.
	AffinityMatchBatcher interface {
		Batches() *maps.Batches[maps.AffinityMatch, struct{}]
	}
)

// ServiceBatches lists m in batches when it can, else with one Dump.
func ServiceBatches(m ServicesMap) *maps.Batches[maps.ServiceSlot, maps.ServiceValue] {
	if b, ok := m.(ServicesBatcher); ok {
		return b.Batches()
	}
	return maps.BatchesOf(func(yield func(maps.ServiceSlot, maps.ServiceValue)) error {
		have, err := m.Dump()
		for k, v := range have {
			yield(k, v)
		}
		return err
	})
}

// BackendBatches lists m in batches when it can, else with one Dump.
func BackendBatches(m BackendsMap) *maps.Batches[uint32, lb.L4Addr] {
	if b, ok := m.(BackendsBatcher); ok {
		return b.Batches()
	}
	return maps.BatchesOf(func(yield func(uint32, lb.L4Addr)) error {
		have, err := m.Dump()
		for k, v := range have {
			yield(k, v)
		}
		return err
	})
}

// AffinityMatchBatches lists m in batches when it can, else with one
// Dump.
func AffinityMatchBatches(m AffinityMatchMap) *maps.Batches[maps.AffinityMatch, struct{}] {
	if b, ok := m.(AffinityMatchBatcher); ok {
		return b.Batches()
	}
	return maps.BatchesOf(func(yield func(maps.AffinityMatch, struct{})) error {
		have, err := m.Dump()
		for _, k := range have {
			yield(k, struct{}{})
		}
		return err
	})
}

// Batches implements ServicesBatcher.
func (p PinnedServices) Batches() *maps.Batches[maps.ServiceSlot, maps.ServiceValue] {
	return p.M.Batches()
}

// Batches implements BackendsBatcher.
func (p PinnedBackends) Batches() *maps.Batches[uint32, lb.L4Addr] { return p.M.Batches() }

// Batches implements AffinityMatchBatcher.
func (p PinnedAffinityMatch) Batches() *maps.Batches[maps.AffinityMatch, struct{}] {
	return p.M.Batches()
}

// checkChunk is the entries a prune round checks between looks at the
// clock.
const checkChunk = 512

// scopeKey is a frontend's scope.
type scopeKey struct {
	fe    lb.L4Addr
	scope uint8
}

// frontendPrune is a prune of FrontendOps under way.
type frontendPrune struct {
	step int
	// rows are the desired frontends when the listing began, by address
	// and in order.
	rows    map[lb.L4Addr]*lb.Frontend
	rowList []*lb.Frontend
	// touched are the frontends Update wrote or Delete removed since the
	// listing began: their entries are what that call left, not what the
	// listing shows, so the prune leaves them alone.
	touched map[lb.L4Addr]bool
	svcs    *maps.Batches[maps.ServiceSlot, maps.ServiceValue]
	matches *maps.Batches[maps.AffinityMatch, struct{}]
	// have, keys, present and matchKeys are the listing.
	have      map[maps.ServiceSlot]maps.ServiceValue
	keys      []maps.ServiceSlot
	present   map[maps.AffinityMatch]bool
	matchKeys []maps.AffinityMatch
	next      int
	// zero, rest and strayMatch are what the checks found stray.
	zero, rest    []maps.ServiceSlot
	strayMatch    []maps.AffinityMatch
	missingRanges map[lb.L4Addr]bool
	drifted       map[lb.L4Addr]bool
}

// The steps of a prune.
const (
	stepListServices = iota
	stepListMatches
	stepCheckSlots
	stepCheckMatches
	stepDelete
	stepCheckDrift
	stepRewrite
)

// touch records that fe's entries were written or deleted.
func (o *FrontendOps) touch(fe lb.L4Addr) {
	if o.prune != nil {
		o.prune.touched[fe] = true
	}
}

// Prune implements reconciler.Operations: PruneRound to the end, in one
// go.
func (o *FrontendOps) Prune(ctx context.Context, txn statedb.ReadTxn, desired iter.Seq2[*lb.Frontend, statedb.Revision]) error {
	o.prune = nil
	for {
		done, err := o.PruneRound(ctx, txn, desired, time.Duration(1<<62))
		if err != nil || done {
			return err
		}
	}
}

// PruneRound implements reconciler.RoundPruner: a prune lists the
// services map and the affinity match map (in batches), then deletes the
// frontends no row wants (slot 0 of the external scope first), the slots
// above each desired scope's count or of the bank its slot 0 does not
// name, the scopes no row has and the affinity matches no row has; then
// the Maglev tables and source ranges no row has, except the ranges of a
// frontend whose slot 0 still carries LB4_SVC_SOURCE_RANGE (its Update
// removes them after clearing it). Last, a frontend whose Update was
// skipped as unchanged but whose entries the maps do not hold as written
// (changed behind the agent's back) is written again. The rows are those
// desired when the listing began; a frontend Update or Delete wrote since
// is left as that call left it (the next prune looks at it again), so
// that no round deletes what a change between rounds wrote.
func (o *FrontendOps) PruneRound(ctx context.Context, txn statedb.ReadTxn, desired iter.Seq2[*lb.Frontend, statedb.Revision], budget time.Duration) (done bool, err error) {
	began := time.Now()
	if o.prune == nil {
		// Sized as the last listing: at 10,000 Services the maps hold
		// 210,000 entries, growing maps would allocate them several times.
		p := &frontendPrune{rows: make(map[lb.L4Addr]*lb.Frontend, len(o.written)), touched: map[lb.L4Addr]bool{},
			svcs: ServiceBatches(o.m), matches: AffinityMatchBatches(o.match),
			have: make(map[maps.ServiceSlot]maps.ServiceValue, o.listed[0]), keys: make([]maps.ServiceSlot, 0, o.listed[0]),
			present: make(map[maps.AffinityMatch]bool, o.listed[1]), matchKeys: make([]maps.AffinityMatch, 0, o.listed[1]),
			drifted: map[lb.L4Addr]bool{}}
		for f := range desired {
			p.rows[f.Address] = f
			p.rowList = append(p.rowList, f)
		}
		o.prune = p
	}
	p := o.prune
	defer func() {
		if err != nil || done {
			o.listed = [2]int{len(p.keys), len(p.matchKeys)}
			o.prune = nil
		}
	}()
	// At least one step per round, however small the budget.
	for first := true; first || time.Since(began) < budget; first = false {
		switch p.step {
		case stepListServices:
			end, err := p.svcs.Next(func(k maps.ServiceSlot, v maps.ServiceValue) {
				p.have[k] = v
				p.keys = append(p.keys, k)
			})
			if err != nil {
				return false, fmt.Errorf("list services map: %w", err)
			}
			if end {
				p.step++
			}
		case stepListMatches:
			end, err := p.matches.Next(func(k maps.AffinityMatch, _ struct{}) {
				p.present[k] = true
				p.matchKeys = append(p.matchKeys, k)
			})
			if err != nil {
				return false, fmt.Errorf("list affinity match map: %w", err)
			}
			if end {
				p.step++
			}
		case stepCheckSlots:
			p.checkSlots()
		case stepCheckMatches:
			p.checkMatches()
		case stepDelete:
			if err := o.pruneStray(desired); err != nil {
				return false, err
			}
			p.step++
		case stepCheckDrift:
			o.checkDrift()
		case stepRewrite:
			return true, o.rewriteDrifted(ctx, txn, desired)
		}
	}
	return false, nil
}

// checkSlots finds the next chunk of the listing's stray slots.
func (p *frontendPrune) checkSlots() {
	end := min(p.next+checkChunk, len(p.keys))
	for _, k := range p.keys[p.next:end] {
		if p.touched[k.Frontend] {
			continue
		}
		n, ok := 0, false
		if f := p.rows[k.Frontend]; f != nil {
			switch {
			case k.Scope == maps.ScopeExt:
				n, ok = len(f.BackendIDs), true
			case k.Scope == maps.ScopeInt && f.TwoScopes:
				n, ok = len(f.IntBackendIDs), true
			}
		}
		// A slot of the bank its slot 0 does not name (an update that
		// stopped half way), or without a slot 0, is stray.
		v0, has0 := p.have[maps.ServiceSlot{Frontend: k.Frontend, Scope: k.Scope}]
		switch {
		case !ok && k.Slot == 0 && k.Bank == 0 && k.Scope == maps.ScopeExt:
			p.zero = append(p.zero, k)
		case !ok || int(k.Slot) > n || (k.Slot == 0 && k.Bank != 0) ||
			(k.Slot > 0 && (!has0 || k.Bank != bankOf(v0))):
			p.rest = append(p.rest, k)
		}
	}
	p.next = end
	if p.next == len(p.keys) {
		p.step, p.next = p.step+1, 0
	}
}

// checkMatches finds the next chunk of the listing's stray affinity
// matches.
func (p *frontendPrune) checkMatches() {
	end := min(p.next+checkChunk, len(p.matchKeys))
	for _, k := range p.matchKeys[p.next:end] {
		if p.touched[k.Frontend] {
			continue
		}
		f := p.rows[k.Frontend]
		if f == nil || !slices.Contains(f.BackendIDs, k.BackendID) && !slices.Contains(f.IntBackendIDs, k.BackendID) {
			p.strayMatch = append(p.strayMatch, k)
		}
	}
	p.next = end
	if p.next == len(p.matchKeys) {
		p.step, p.next = p.step+1, 0
	}
}

// untouched returns the entries of ks whose frontend (fe) nobody wrote
// since the listing.
func untouched[K any](touched map[lb.L4Addr]bool, ks []K, fe func(K) lb.L4Addr) []K {
	return slices.DeleteFunc(ks, func(k K) bool { return touched[fe(k)] })
}

// pruneStray deletes the stray entries the checks found (but those of the
// frontends written since), then the Maglev tables and source ranges no
// row wants.
func (o *FrontendOps) pruneStray(desired iter.Seq2[*lb.Frontend, statedb.Revision]) error {
	p := o.prune
	slotFE := func(k maps.ServiceSlot) lb.L4Addr { return k.Frontend }
	p.zero = untouched(p.touched, p.zero, slotFE)
	p.rest = untouched(p.touched, p.rest, slotFE)
	p.strayMatch = untouched(p.touched, p.strayMatch, func(k maps.AffinityMatch) lb.L4Addr { return k.Frontend })
	if err := o.m.Delete(p.zero); err != nil {
		return fmt.Errorf("prune %d frontends: %w", len(p.zero), err)
	}
	if err := o.m.Delete(p.rest); err != nil {
		return fmt.Errorf("prune %d slots: %w", len(p.rest), err)
	}
	if err := o.match.Delete(p.strayMatch); err != nil {
		return fmt.Errorf("prune %d affinity matches: %w", len(p.strayMatch), err)
	}
	if o.maglev != nil {
		// The tables are listed now: the current rows.
		if err := o.maglev.prune(desired); err != nil {
			return err
		}
	}
	if o.ranges != nil {
		var err error
		if p.missingRanges, err = o.pruneRanges(); err != nil {
			return err
		}
	}
	return nil
}

// pruneRanges deletes the source ranges no row wants, except those of a
// frontend whose slot 0 in the listing still carries
// LB4_SVC_SOURCE_RANGE and was not deleted, and of the frontends written
// since the listing; it returns the frontends a wanted range is missing
// from.
func (o *FrontendOps) pruneRanges() (map[lb.L4Addr]bool, error) {
	p := o.prune
	haveRange, err := o.ranges.Dump()
	if err != nil {
		return nil, fmt.Errorf("list source range map: %w", err)
	}
	wantRange := map[maps.SourceRange]bool{}
	for _, f := range p.rowList {
		for _, r := range rangeKeys(f.Address, f.SourceRanges) {
			wantRange[r] = true
		}
	}
	var strayRange []maps.SourceRange
	kept := map[lb.L4Addr][]netip.Prefix{}
	found := make(map[maps.SourceRange]bool, len(haveRange))
	for _, r := range haveRange {
		found[r] = true
		// A slot 0 still flagged (not pruned above) keeps its ranges.
		zeroKey := maps.ServiceSlot{Frontend: r.Frontend, Scope: maps.ScopeExt}
		v, ok := p.have[zeroKey]
		flagged := ok && v.SourceRange && !slices.Contains(p.zero, zeroKey)
		if wantRange[r] || flagged || p.touched[r.Frontend] {
			kept[r.Frontend] = append(kept[r.Frontend], r.Prefix)
			continue
		}
		strayRange = append(strayRange, r)
	}
	if err := o.ranges.Delete(strayRange); err != nil {
		return nil, fmt.Errorf("prune %d source ranges: %w", len(strayRange), err)
	}
	o.haveRanges, o.rangesLoaded = kept, true
	missing := map[lb.L4Addr]bool{}
	for r := range wantRange {
		if !found[r] && !p.touched[r.Frontend] {
			missing[r.Frontend] = true
		}
	}
	return missing, nil
}

// checkDrift finds in the next chunk of rows the frontends skipped as
// written whose entries differ from the row: services map, affinity
// matches, a Maglev table prune found gone, source ranges.
func (o *FrontendOps) checkDrift() {
	p := o.prune
	end := min(p.next+checkChunk, len(p.rowList))
	for _, f := range p.rowList[p.next:end] {
		// Only rows as last written: a row changed since waits for its
		// own Update (its backends may not be ready yet).
		if fp, ok := o.written[f.Address]; !ok || fp != writtenFingerprint(f) || p.touched[f.Address] {
			continue
		}
		lostTable := false
		if o.maglev != nil {
			_, ok := o.maglev.written[f.Address]
			lostTable = !ok && o.maglev.wants(f)
		}
		if lostTable || p.missingRanges[f.Address] || !o.holds(p.have, p.present, f) {
			p.drifted[f.Address] = true
		}
	}
	p.next = end
	if p.next == len(p.rowList) {
		p.step, p.next = p.step+1, 0
	}
}

// rewriteDrifted writes the drifted frontends again, as their rows are
// now (those still as last written).
func (o *FrontendOps) rewriteDrifted(ctx context.Context, txn statedb.ReadTxn, desired iter.Seq2[*lb.Frontend, statedb.Revision]) error {
	p := o.prune
	if len(p.drifted) == 0 {
		return nil
	}
	var errs []error
	for f := range desired {
		if !p.drifted[f.Address] || p.touched[f.Address] {
			continue
		}
		if fp, ok := o.written[f.Address]; !ok || fp != writtenFingerprint(f) {
			continue
		}
		delete(o.written, f.Address)
		if err := o.Update(ctx, txn, f); err != nil {
			errs = append(errs, fmt.Errorf("rewrite frontend %v the maps lost: %w", f.Address, err))
		}
	}
	return errors.Join(errs...)
}

// backendPrune is a prune of BackendOps under way.
type backendPrune struct {
	list *maps.Batches[uint32, lb.L4Addr]
	// touched are the IDs Update wrote or Delete removed since the
	// listing began.
	touched map[uint32]bool
	ids     []uint32
	addrs   []lb.L4Addr
	listed  bool
	next    int
}

// touch records that id's entry was written or deleted.
func (o *BackendOps) touch(id uint32) {
	if o.prune != nil {
		o.prune.touched[id] = true
	}
}

// Prune implements reconciler.Operations: PruneRound to the end, in one
// go.
func (o *BackendOps) Prune(ctx context.Context, txn statedb.ReadTxn, desired iter.Seq2[*lb.Backend, statedb.Revision]) error {
	o.prune = nil
	for {
		done, err := o.PruneRound(ctx, txn, desired, time.Duration(1<<62))
		if err != nil || done {
			return err
		}
	}
}

// PruneRound implements reconciler.RoundPruner: a prune lists the map
// (in batches), then deletes the IDs no row of the backends table (in
// txn, each round's own) has and writes again those a row has with
// another address (changed behind the agent's back). An ID Update or
// Delete wrote since the listing is left alone.
func (o *BackendOps) PruneRound(ctx context.Context, txn statedb.ReadTxn, _ iter.Seq2[*lb.Backend, statedb.Revision], budget time.Duration) (done bool, err error) {
	began := time.Now()
	if o.prune == nil {
		o.prune = &backendPrune{list: BackendBatches(o.m), touched: map[uint32]bool{},
			ids: make([]uint32, 0, o.listed), addrs: make([]lb.L4Addr, 0, o.listed)}
	}
	p := o.prune
	defer func() {
		if err != nil || done {
			o.listed = len(p.ids)
			o.prune = nil
		}
	}()
	// At least one step per round, however small the budget.
	for first := true; first || time.Since(began) < budget; first = false {
		if !p.listed {
			end, err := p.list.Next(func(id uint32, a lb.L4Addr) {
				p.ids = append(p.ids, id)
				p.addrs = append(p.addrs, a)
			})
			if err != nil {
				return false, fmt.Errorf("list backends map: %w", err)
			}
			p.listed = end
			continue
		}
		end := min(p.next+checkChunk, len(p.ids))
		var stray []uint32
		var errs []error
		for i := p.next; i < end; i++ {
			id := p.ids[i]
			if p.touched[id] {
				continue
			}
			b, _, ok := o.backends.Get(txn, lb.BackendIDIndex.Query(id))
			switch {
			case !ok || b.Status.Kind == reconciler.StatusPendingDelete:
				stray = append(stray, id)
			case b.Address != p.addrs[i]:
				if err := o.Update(ctx, txn, b); err != nil {
					errs = append(errs, fmt.Errorf("rewrite backend the map lost: %w", err))
				}
			}
		}
		p.next = end
		if err := o.m.Delete(stray); err != nil {
			return false, fmt.Errorf("prune %d backends: %w", len(stray), err)
		}
		if err := errors.Join(errs...); err != nil {
			return false, err
		}
		if p.next == len(p.ids) {
			return true, nil
		}
	}
	return false, nil
}
