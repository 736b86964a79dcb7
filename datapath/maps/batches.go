package maps

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"

	"github.com/cellium/cellium/datapath/bpf"
	"github.com/cellium/cellium/statedb/lb"
)

// BatchSize is the most entries one Batches.Next call reads.
const BatchSize = 4096

// Batches reads a map a batch at a time (BPF_MAP_LOOKUP_BATCH where the
// kernel has it, an iterator otherwise), so that a caller can list a map
// of 100,000s of entries in parts with other work between them. Entries
// written or deleted while the listing goes on may be seen or not; none
// present throughout is missed. Create it with a map's Batches method.
type Batches[K, V any] struct {
	next func(yield func(K, V)) (bool, error)
	end  bool
}

// Next calls yield for the entries of the next batch (at most BatchSize)
// and reports whether the listing has reached the map's end; after that
// it reads nothing more.
func (b *Batches[K, V]) Next(yield func(K, V)) (end bool, err error) {
	if b.end {
		return true, nil
	}
	end, err = b.next(yield)
	b.end = end || err != nil
	return end, err
}

// BatchesOf returns the listing of all: one batch, every entry of it.
func BatchesOf[K, V any](all func(yield func(K, V)) error) *Batches[K, V] {
	return &Batches[K, V]{next: func(yield func(K, V)) (bool, error) { return true, all(yield) }}
}

// batches lists m, decoding its raw keys RK and values RV.
func batches[RK, RV, K, V any](m *ebpf.Map, decode func(*RK, *RV) (K, V)) *Batches[K, V] {
	keys := make([]RK, BatchSize)
	vals := make([]RV, BatchSize)
	var cursor ebpf.MapBatchCursor
	var it *ebpf.MapIterator
	return &Batches[K, V]{next: func(yield func(K, V)) (bool, error) {
		if it == nil {
			n, err := m.BatchLookup(&cursor, keys, vals, nil)
			if errors.Is(err, ebpf.ErrNotSupported) {
				it = m.Iterate()
			} else {
				for i := range n {
					yield(decode(&keys[i], &vals[i]))
				}
				if errors.Is(err, ebpf.ErrKeyNotExist) {
					return true, nil
				}
				if err != nil {
					return false, fmt.Errorf("batch lookup %s: %w", mapName(m), err)
				}
				return false, nil
			}
		}
		for range BatchSize {
			if !it.Next(&keys[0], &vals[0]) {
				if err := it.Err(); err != nil {
					return false, fmt.Errorf("iterate %s: %w", mapName(m), err)
				}
				return true, nil
			}
			yield(decode(&keys[0], &vals[0]))
		}
		return false, nil
	}}
}

// Batches starts a listing of the map, read a batch at a time.
func (s *LB4Services) Batches() *Batches[ServiceSlot, ServiceValue] {
	return batches(s.m, func(k *bpf.SockLb4Key, v *bpf.SockLb4Service) (ServiceSlot, ServiceValue) {
		return lb4Slot(k), serviceValue(k.Slot, v)
	})
}

// Batches starts a listing of the map, read a batch at a time.
func (b *LB4Backends) Batches() *Batches[uint32, lb.L4Addr] {
	return batches(b.m, func(k *uint32, v *bpf.SockLb4Backend) (uint32, lb.L4Addr) {
		return *k, lb.L4Addr{Addr: be32Addr(v.Address), Port: ntohs(v.Port), Proto: v.Proto}
	})
}

// Batches starts a listing of the map, read a batch at a time (the
// values are empty).
func (a *LB4AffinityMatch) Batches() *Batches[AffinityMatch, struct{}] {
	return batches(a.m, func(k *bpf.SockLb4AffinityMatchKey, _ *uint8) (AffinityMatch, struct{}) {
		return AffinityMatch{Frontend: lb.L4Addr{Addr: be32Addr(k.Address), Port: ntohs(k.Dport), Proto: k.Proto}, BackendID: k.BackendId}, struct{}{}
	})
}
