package lbsync

import (
	"errors"

	"github.com/cilium/ebpf"

	"github.com/cellium/cellium/datapath/maps"
	"github.com/cellium/cellium/statedb/lb"
)

// PinnedServices adapts the pinned cellium_lb4_services.
type PinnedServices struct{ M *maps.LB4Services }

var _ ServicesMap = PinnedServices{}

// Update implements ServicesMap.
func (p PinnedServices) Update(keys []maps.ServiceSlot, vals []maps.ServiceValue) error {
	return p.M.Update(keys, vals)
}

// Delete implements ServicesMap.
func (p PinnedServices) Delete(keys []maps.ServiceSlot) error { return p.M.Delete(keys) }

// Lookup implements ServicesMap.
func (p PinnedServices) Lookup(k maps.ServiceSlot) (maps.ServiceValue, bool, error) {
	v, err := p.M.Lookup(k)
	if errors.Is(err, ebpf.ErrKeyNotExist) {
		return v, false, nil
	}
	return v, err == nil, err
}

// Dump implements ServicesMap.
func (p PinnedServices) Dump() (map[maps.ServiceSlot]maps.ServiceValue, error) {
	out := map[maps.ServiceSlot]maps.ServiceValue{}
	err := p.M.Iterate(func(k maps.ServiceSlot, v maps.ServiceValue) bool { out[k] = v; return true })
	return out, err
}

// PinnedBackends adapts the pinned cellium_lb4_backends.
type PinnedBackends struct{ M *maps.LB4Backends }

var _ BackendsMap = PinnedBackends{}

// Update implements BackendsMap.
func (p PinnedBackends) Update(ids []uint32, addrs []lb.L4Addr) error { return p.M.Update(ids, addrs) }

// Delete implements BackendsMap.
func (p PinnedBackends) Delete(ids []uint32) error { return p.M.Delete(ids) }

// Dump implements BackendsMap.
func (p PinnedBackends) Dump() (map[uint32]lb.L4Addr, error) {
	out := map[uint32]lb.L4Addr{}
	err := p.M.Iterate(func(id uint32, a lb.L4Addr) bool { out[id] = a; return true })
	return out, err
}

// RestoreIDs returns the backend IDs m holds, by address (for
// NewDeriver's restore).
func RestoreIDs(m BackendsMap) (map[lb.L4Addr]uint32, error) {
	have, err := m.Dump()
	if err != nil {
		return nil, err
	}
	out := make(map[lb.L4Addr]uint32, len(have))
	for id, a := range have {
		out[a] = id
	}
	return out, nil
}

// PinnedAffinityMatch adapts the pinned cellium_lb4_affinity_match.
type PinnedAffinityMatch struct{ M *maps.LB4AffinityMatch }

var _ AffinityMatchMap = PinnedAffinityMatch{}

// Update implements AffinityMatchMap.
func (p PinnedAffinityMatch) Update(keys []maps.AffinityMatch) error { return p.M.Update(keys) }

// Delete implements AffinityMatchMap.
func (p PinnedAffinityMatch) Delete(keys []maps.AffinityMatch) error { return p.M.Delete(keys) }

// Dump implements AffinityMatchMap.
func (p PinnedAffinityMatch) Dump() ([]maps.AffinityMatch, error) {
	var out []maps.AffinityMatch
	err := p.M.Iterate(func(k maps.AffinityMatch) bool { out = append(out, k); return true })
	return out, err
}

// PinnedSourceRange adapts the pinned cellium_lb4_source_range.
type PinnedSourceRange struct{ M *maps.LB4SourceRange }

var _ SourceRangeMap = PinnedSourceRange{}

// Update implements SourceRangeMap.
func (p PinnedSourceRange) Update(keys []maps.SourceRange) error { return p.M.Update(keys) }

// Delete implements SourceRangeMap.
func (p PinnedSourceRange) Delete(keys []maps.SourceRange) error { return p.M.Delete(keys) }

// Dump implements SourceRangeMap.
func (p PinnedSourceRange) Dump() ([]maps.SourceRange, error) {
	var out []maps.SourceRange
	err := p.M.Iterate(func(r maps.SourceRange) bool { out = append(out, r); return true })
	return out, err
}
