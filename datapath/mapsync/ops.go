package mapsync

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"maps"
	"net"
	"net/netip"
	"slices"
	"sync"

	"github.com/cilium/statedb"

	"github.com/cellium/cellium/statedb/endpoints"
	"github.com/cellium/cellium/statedb/ipcache"
	"github.com/cellium/cellium/statedb/mapstate"
	"github.com/cellium/cellium/statedb/policy"
	"github.com/cellium/cellium/statedb/reconciler"
)

// EntryOps reconciles a table whose rows are one map entry each
// (reconciler.Operations and reconciler.BatchOperations).
type EntryOps[Obj any, K, V comparable] struct {
	name  string
	m     Map[K, V]
	key   func(Obj) K
	value func(Obj) (V, error)
}

var (
	_ reconciler.Operations[*ipcache.Entry]      = (*EntryOps[*ipcache.Entry, netip.Prefix, IPCacheValue])(nil)
	_ reconciler.BatchOperations[*ipcache.Entry] = (*EntryOps[*ipcache.Entry, netip.Prefix, IPCacheValue])(nil)
)

// NewIPCacheOps reconciles the ipcache table into m (cellium_ipcache).
func NewIPCacheOps(m Map[netip.Prefix, IPCacheValue]) *EntryOps[*ipcache.Entry, netip.Prefix, IPCacheValue] {
	return &EntryOps[*ipcache.Entry, netip.Prefix, IPCacheValue]{
		name: "ipcache", m: m,
		key: func(e *ipcache.Entry) netip.Prefix { return e.Prefix },
		value: func(e *ipcache.Entry) (IPCacheValue, error) {
			v := IPCacheValue{Identity: e.Identity.Uint32(), CIDRIdentity: e.CIDRIdentity.Uint32()}
			v.ServiceFrontend = e.ServiceFrontend
			if e.HostIP.Is4() {
				// The map's tunnel endpoint is an IPv4 address.
				v.TunnelEndpoint = e.HostIP
			}
			return v, nil
		},
	}
}

// NewEndpointOps reconciles the lxc-map table into m (cellium_lxc).
func NewEndpointOps(m Map[netip.Addr, EndpointInfo]) *EntryOps[*mapstate.Endpoint, netip.Addr, EndpointInfo] {
	return &EntryOps[*mapstate.Endpoint, netip.Addr, EndpointInfo]{
		name: "endpoint", m: m,
		key: func(e *mapstate.Endpoint) netip.Addr { return e.IP },
		value: func(e *mapstate.Endpoint) (EndpointInfo, error) {
			v := EndpointInfo{IfIndex: e.IfIndex, EndpointID: e.EndpointID, Identity: e.Identity.Uint32()}
			var err error
			if v.MAC, err = parseMAC(e.MAC); err != nil {
				return v, fmt.Errorf("endpoint %d MAC: %w", e.EndpointID, err)
			}
			if v.NodeMAC, err = parseMAC(e.NodeMAC); err != nil {
				return v, fmt.Errorf("endpoint %d host MAC: %w", e.EndpointID, err)
			}
			return v, nil
		},
	}
}

// parseMAC parses a 6-byte MAC; "" is all zeroes.
func parseMAC(s string) ([6]byte, error) {
	var out [6]byte
	if s == "" {
		return out, nil
	}
	hw, err := net.ParseMAC(s)
	if err != nil {
		return out, err
	}
	if len(hw) != 6 {
		return out, fmt.Errorf("%q is not a 6-byte MAC", s)
	}
	copy(out[:], hw)
	return out, nil
}

// Update implements reconciler.Operations.
func (o *EntryOps[Obj, K, V]) Update(_ context.Context, _ statedb.ReadTxn, obj Obj) error {
	k := o.key(obj)
	v, err := o.value(obj)
	if err == nil {
		err = o.m.Update([]K{k}, []V{v})
	}
	if err != nil {
		return fmt.Errorf("update %s %v: %w", o.name, k, err)
	}
	return nil
}

// Delete implements reconciler.Operations.
func (o *EntryOps[Obj, K, V]) Delete(_ context.Context, _ statedb.ReadTxn, obj Obj) error {
	k := o.key(obj)
	if err := o.m.Delete([]K{k}); err != nil {
		return fmt.Errorf("delete %s %v: %w", o.name, k, err)
	}
	return nil
}

// UpdateBatch implements reconciler.BatchOperations: one batch update;
// if it fails, each entry alone, so that each gets its own outcome.
func (o *EntryOps[Obj, K, V]) UpdateBatch(ctx context.Context, txn statedb.ReadTxn, batch []reconciler.BatchEntry[Obj]) {
	keys := make([]K, 0, len(batch))
	vals := make([]V, 0, len(batch))
	idx := make([]int, 0, len(batch))
	for i := range batch {
		v, err := o.value(batch[i].Object)
		if err != nil {
			batch[i].Result = fmt.Errorf("update %s %v: %w", o.name, o.key(batch[i].Object), err)
			continue
		}
		keys, vals, idx = append(keys, o.key(batch[i].Object)), append(vals, v), append(idx, i)
	}
	if len(keys) == 0 || o.m.Update(keys, vals) == nil {
		return
	}
	for _, i := range idx {
		batch[i].Result = o.Update(ctx, txn, batch[i].Object)
	}
}

// DeleteBatch implements reconciler.BatchOperations, like UpdateBatch.
func (o *EntryOps[Obj, K, V]) DeleteBatch(ctx context.Context, txn statedb.ReadTxn, batch []reconciler.BatchEntry[Obj]) {
	keys := make([]K, len(batch))
	for i := range batch {
		keys[i] = o.key(batch[i].Object)
	}
	if o.m.Delete(keys) == nil {
		return
	}
	for i := range batch {
		batch[i].Result = o.Delete(ctx, txn, batch[i].Object)
	}
}

// Prune implements reconciler.Operations: it lists the map, then deletes
// the keys no row wants.
func (o *EntryOps[Obj, K, V]) Prune(_ context.Context, _ statedb.ReadTxn, desired iter.Seq2[Obj, statedb.Revision]) error {
	have, err := o.m.Dump()
	if err != nil {
		return fmt.Errorf("list %s map: %w", o.name, err)
	}
	for obj := range desired {
		delete(have, o.key(obj))
	}
	if len(have) == 0 {
		return nil
	}
	stray := make([]K, 0, len(have))
	for k := range have {
		stray = append(stray, k)
	}
	if err := o.m.Delete(stray); err != nil {
		return fmt.Errorf("prune %d %s entries: %w", len(stray), o.name, err)
	}
	return nil
}

// PolicyOps reconciles the policy-maps table into the endpoints' policy
// maps. It remembers what it last wrote into each map, so that an
// incremental update costs the changed entries only; the full
// reconciliation (Prune) reads every desired map back and repairs it.
// Create it with NewPolicyOps.
type PolicyOps struct {
	maps      PolicyMaps
	endpoints statedb.Table[*endpoints.Endpoint]

	mu sync.Mutex
	// realized is what each map is known to hold; an endpoint missing
	// here is read from its map first.
	realized map[uint16]map[policy.Key]PolicyValue
	// overflowing are the endpoints whose policy does not fit their map
	// (which holds the policy's deny entries alone), by endpoint ID.
	overflowing map[uint16]bool
}

var _ reconciler.Operations[*mapstate.PolicyMap] = (*PolicyOps)(nil)

// NewPolicyOps reconciles into maps. eps is the endpoints table: Prune
// never removes the map of an endpoint that still exists (the loader may
// have created it before the endpoint's policy is computed).
func NewPolicyOps(maps PolicyMaps, eps statedb.Table[*endpoints.Endpoint]) *PolicyOps {
	return &PolicyOps{maps: maps, endpoints: eps, realized: map[uint16]map[policy.Key]PolicyValue{}, overflowing: map[uint16]bool{}}
}

// Overflowing returns, sorted, the endpoints whose last reconciled
// policy does not fit their map: their maps fail closed (FailClosed).
func (o *PolicyOps) Overflowing() []uint16 {
	o.mu.Lock()
	defer o.mu.Unlock()
	return slices.Sorted(maps.Keys(o.overflowing))
}

// FailClosed returns what the map of a policy that does not fit holds
// instead: the policy's deny entries alone, or nothing when even those
// do not fit. Without an allow entry the datapath drops every packet
// (what matches no entry is dropped), so the map is never more permissive
// than the policy: the endpoint drops all traffic in both directions
// (replies of connections it admitted included, since the packets of
// those are checked again), and the deny entries keep their drop reason
// ("Policy denied by denylist") for the packets they match.
func FailClosed(want map[policy.Key]PolicyValue, max int) map[policy.Key]PolicyValue {
	out := map[policy.Key]PolicyValue{}
	for k, v := range want {
		if v.Deny {
			out[k] = v
		}
	}
	if len(out) > max {
		return map[policy.Key]PolicyValue{}
	}
	return out
}

// Entries returns the map entries a policy asks for.
func Entries(p *policy.EndpointPolicy) map[policy.Key]PolicyValue {
	out := make(map[policy.Key]PolicyValue, len(p.Ingress.Entries)+len(p.Egress.Entries))
	for _, d := range []*policy.DirectionPolicy{&p.Ingress, &p.Egress} {
		for _, e := range d.Entries {
			out[e.Key] = PolicyValue{Deny: e.Deny, LPMPrefixLen: e.LPMPrefixLen()}
		}
	}
	return out
}

// Update implements reconciler.Operations: it writes the entries that are
// new or changed in one batch, then deletes the entries no longer desired
// in one batch, so the map never lacks an entry that both the old and the
// new policy have. A policy larger than the map fails closed (FailClosed)
// and returns an error wrapping ErrPolicyTooLarge.
func (o *PolicyOps) Update(_ context.Context, _ statedb.ReadTxn, row *mapstate.PolicyMap) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.update(row)
}

func (o *PolicyOps) update(row *mapstate.PolicyMap) (err error) {
	id := row.EndpointID
	defer func() {
		if err != nil {
			err = fmt.Errorf("policy map of endpoint %d (revision %d): %w", id, row.Revision, err)
		}
	}()
	m, err := o.maps.Open(id)
	if err != nil {
		delete(o.realized, id)
		return fmt.Errorf("open: %w", err)
	}
	defer func() { err = errors.Join(err, m.Close()) }()
	have, ok := o.realized[id]
	if !ok {
		if have, err = m.Dump(); err != nil {
			return fmt.Errorf("list: %w", err)
		}
	}
	want := Entries(row.Policy)
	if max := m.MaxEntries(); len(want) > max {
		// Fail closed: the previous policy must not stay, it may allow
		// what this one denies.
		closed := FailClosed(want, max)
		o.overflowing[id] = true
		if err := replace(m, have, closed); err != nil {
			delete(o.realized, id)
			return fmt.Errorf("%d entries do not fit the map (at most %d), and emptying it of its allow entries failed: %w (%w)",
				len(want), max, err, ErrPolicyTooLarge)
		}
		o.realized[id] = closed
		return fmt.Errorf("%d entries do not fit the map (at most %d): it holds the policy's %d deny entries alone and the endpoint drops all traffic until its policy fits: %w",
			len(want), max, len(closed), ErrPolicyTooLarge)
	}
	delete(o.overflowing, id)
	if err := applyDiff(m, have, want); err != nil {
		delete(o.realized, id) // unknown now: read it next time
		return err
	}
	o.realized[id] = want
	return nil
}

// diff compares the map's content have with want: the keys whose value
// changes, the keys to add (with their values) and the stale keys.
func diff(have, want map[policy.Key]PolicyValue) (changedK []policy.Key, changedV []PolicyValue, addK []policy.Key, addV []PolicyValue, stale []policy.Key) {
	for k, v := range want {
		cur, ok := have[k]
		switch {
		case !ok:
			addK, addV = append(addK, k), append(addV, v)
		case cur != v:
			changedK, changedV = append(changedK, k), append(changedV, v)
		}
	}
	for k := range have {
		if _, ok := want[k]; !ok {
			stale = append(stale, k)
		}
	}
	return changedK, changedV, addK, addV, stale
}

// replace turns the map's content have into want, which holds no allow
// entry: entries that change become denies in place, then every stale
// entry is deleted before the missing ones are written, so that the map
// stops allowing first and has room for want (at most its capacity).
func replace(m PolicyMap, have, want map[policy.Key]PolicyValue) error {
	changedK, changedV, addK, addV, stale := diff(have, want)
	if len(changedK) > 0 {
		if err := m.Update(changedK, changedV); err != nil {
			return fmt.Errorf("update %d entries: %w", len(changedK), err)
		}
	}
	if len(stale) > 0 {
		if err := m.Delete(stale); err != nil {
			return fmt.Errorf("delete %d entries: %w", len(stale), err)
		}
	}
	if len(addK) > 0 {
		if err := m.Update(addK, addV); err != nil {
			return fmt.Errorf("add %d entries: %w", len(addK), err)
		}
	}
	return nil
}

// applyDiff turns the map's content have into want: values that change
// are overwritten in place, new entries are written before the stale ones
// are deleted, as many at a time as the map's capacity allows (when the
// old and the new policy do not fit together, stale entries are deleted in
// just large enough steps to make room). The map is never empty on the
// way.
func applyDiff(m PolicyMap, have, want map[policy.Key]PolicyValue) error {
	changedK, changedV, addK, addV, stale := diff(have, want)
	if len(changedK) > 0 {
		if err := m.Update(changedK, changedV); err != nil {
			return fmt.Errorf("update %d entries: %w", len(changedK), err)
		}
	}
	size, max := len(have), m.MaxEntries()
	for len(addK) > 0 {
		if free := max - size; free > 0 {
			n := min(free, len(addK))
			if err := m.Update(addK[:n], addV[:n]); err != nil {
				return fmt.Errorf("add %d entries: %w", n, err)
			}
			addK, addV, size = addK[n:], addV[n:], size+n
			continue
		}
		n := min(len(stale), len(addK), size-1)
		if n <= 0 {
			return fmt.Errorf("no room for %d entries: %w", len(addK), ErrPolicyTooLarge)
		}
		if err := m.Delete(stale[:n]); err != nil {
			return fmt.Errorf("delete %d entries: %w", n, err)
		}
		stale, size = stale[n:], size-n
	}
	if len(stale) > 0 {
		if err := m.Delete(stale); err != nil {
			return fmt.Errorf("delete %d entries: %w", len(stale), err)
		}
	}
	return nil
}

// Delete implements reconciler.Operations: the row is gone because the
// endpoint is, so its map is unpinned (programs still attached keep their
// reference until the loader detaches them).
func (o *PolicyOps) Delete(_ context.Context, _ statedb.ReadTxn, row *mapstate.PolicyMap) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	delete(o.realized, row.EndpointID)
	delete(o.overflowing, row.EndpointID)
	if err := o.maps.Remove(row.EndpointID); err != nil {
		return fmt.Errorf("remove policy map of endpoint %d: %w", row.EndpointID, err)
	}
	return nil
}

// Prune implements reconciler.Operations: it reads every desired map back
// and repairs what differs from its row (entries added or removed behind
// the agent's back), then removes the pinned policy maps of endpoints that
// have neither a row nor an endpoint.
func (o *PolicyOps) Prune(_ context.Context, txn statedb.ReadTxn, desired iter.Seq2[*mapstate.PolicyMap, statedb.Revision]) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	ids, err := o.maps.List()
	if err != nil {
		return fmt.Errorf("list policy maps: %w", err)
	}
	var errs []error
	want := map[uint16]bool{}
	for row := range desired {
		want[row.EndpointID] = true
		delete(o.realized, row.EndpointID)
		if err := o.update(row); err != nil {
			errs = append(errs, err)
		}
	}
	for _, id := range ids {
		if want[id] {
			continue
		}
		if o.endpoints != nil {
			if _, _, ok := o.endpoints.Get(txn, endpoints.IDIndex.Query(id)); ok {
				continue
			}
		}
		delete(o.realized, id)
		delete(o.overflowing, id)
		if err := o.maps.Remove(id); err != nil {
			errs = append(errs, fmt.Errorf("remove policy map of endpoint %d: %w", id, err))
		}
	}
	return errors.Join(errs...)
}
