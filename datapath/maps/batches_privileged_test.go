package maps_test

import (
	"maps"
	"net/netip"
	"testing"

	dpmaps "github.com/cellium/cellium/datapath/maps"
	"github.com/cellium/cellium/statedb/lb"
	"github.com/cellium/cellium/test/privileged"
)

// Batches lists the load balancer's maps batch by batch (more entries than
// one batch holds) and finds what the iterator finds.
func TestPrivilegedLBBatches(t *testing.T) {
	privileged.Require(t)
	dir := tempBPFFS(t)
	m, err := dpmaps.OpenLBWith(dir, dpmaps.LBOptions{MapMax: 1 << 15})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	const n = 3*dpmaps.BatchSize + 17
	var keys []dpmaps.ServiceSlot
	var vals []dpmaps.ServiceValue
	var ids []uint32
	var addrs []lb.L4Addr
	var matches []dpmaps.AffinityMatch
	for i := range n {
		fe := lb.L4Addr{Addr: netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)}), Port: 80, Proto: lb.TCP}
		keys = append(keys, dpmaps.ServiceSlot{Frontend: fe, Slot: uint16(i % 3), Bank: uint8(i % 2)})
		vals = append(vals, dpmaps.ServiceValue{BackendID: uint32(i + 1)})
		ids = append(ids, uint32(i+1))
		addrs = append(addrs, lb.L4Addr{Addr: netip.AddrFrom4([4]byte{10, 1, byte(i >> 8), byte(i)}), Port: 8080, Proto: lb.UDP})
		matches = append(matches, dpmaps.AffinityMatch{Frontend: fe, BackendID: uint32(i + 1)})
	}
	if err := m.Services.Update(keys, vals); err != nil {
		t.Fatal(err)
	}
	if err := m.Backends.Update(ids, addrs); err != nil {
		t.Fatal(err)
	}
	if err := m.AffinityMatch.Update(matches); err != nil {
		t.Fatal(err)
	}

	listAll := func(t *testing.T, next func() (bool, error)) int {
		t.Helper()
		calls := 0
		for {
			calls++
			end, err := next()
			if err != nil {
				t.Fatal(err)
			}
			if end {
				return calls
			}
		}
	}
	svcs := map[dpmaps.ServiceSlot]dpmaps.ServiceValue{}
	b := m.Services.Batches()
	calls := listAll(t, func() (bool, error) {
		return b.Next(func(k dpmaps.ServiceSlot, v dpmaps.ServiceValue) { svcs[k] = v })
	})
	want := map[dpmaps.ServiceSlot]dpmaps.ServiceValue{}
	if err := m.Services.Iterate(func(k dpmaps.ServiceSlot, v dpmaps.ServiceValue) bool { want[k] = v; return true }); err != nil {
		t.Fatal(err)
	}
	if len(want) != n || !maps.Equal(svcs, want) {
		t.Errorf("services: batches found %d entries, the iterator %d (of %d)", len(svcs), len(want), n)
	}
	if calls < 4 {
		t.Errorf("services listed in %d calls, want at least 4 of %d entries", calls, dpmaps.BatchSize)
	}
	if end, err := b.Next(func(dpmaps.ServiceSlot, dpmaps.ServiceValue) { t.Error("an entry after the end") }); !end || err != nil {
		t.Errorf("after the end: %v, %v", end, err)
	}

	backends := map[uint32]lb.L4Addr{}
	bb := m.Backends.Batches()
	listAll(t, func() (bool, error) { return bb.Next(func(id uint32, a lb.L4Addr) { backends[id] = a }) })
	if len(backends) != n || backends[5] != addrs[4] {
		t.Errorf("backends: %d entries, ID 5 -> %v; want %d, %v", len(backends), backends[5], n, addrs[4])
	}
	found := map[dpmaps.AffinityMatch]bool{}
	mb := m.AffinityMatch.Batches()
	listAll(t, func() (bool, error) {
		return mb.Next(func(k dpmaps.AffinityMatch, _ struct{}) { found[k] = true })
	})
	if len(found) != n || !found[matches[n-1]] {
		t.Errorf("affinity matches: %d entries, want %d with %v", len(found), n, matches[n-1])
	}
}
