package maps_test

import (
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/cellium/cellium/datapath/maps"
	"github.com/cellium/cellium/statedb/lb"
	"github.com/cellium/cellium/test/privileged"
)

// The socket LB maps pin, round-trip their keys and values (address and
// port byte order included), survive a reopen, and UnpinLB removes them.
func TestPrivilegedLBMaps(t *testing.T) {
	privileged.Require(t)
	dir := tempBPFFS(t)
	m, err := maps.OpenLB(dir)
	if err != nil {
		t.Fatal(err)
	}
	fe := lb.L4Addr{Addr: netip.MustParseAddr("10.96.1.2"), Port: 8443, Proto: lb.UDP}
	be := lb.L4Addr{Addr: netip.MustParseAddr("10.0.3.4"), Port: 5353, Proto: lb.UDP}
	if err := m.Backends.Update([]uint32{7}, []lb.L4Addr{be}); err != nil {
		t.Fatal(err)
	}
	if err := m.Services.Update([]maps.ServiceSlot{{Frontend: fe}, {Frontend: fe, Slot: 1}},
		[]maps.ServiceValue{{Count: 1}, {BackendID: 7}}); err != nil {
		t.Fatal(err)
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	m, err = maps.OpenLB(dir)
	if err != nil {
		t.Fatalf("reopen: %v", err)
	}
	defer m.Close()
	if v, err := m.Services.Lookup(maps.ServiceSlot{Frontend: fe}); err != nil || v.Count != 1 {
		t.Errorf("slot 0: %+v, %v", v, err)
	}
	got := map[maps.ServiceSlot]maps.ServiceValue{}
	if err := m.Services.Iterate(func(k maps.ServiceSlot, v maps.ServiceValue) bool { got[k] = v; return true }); err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[maps.ServiceSlot{Frontend: fe, Slot: 1}].BackendID != 7 {
		t.Errorf("services map: %v", got)
	}
	var backends []lb.L4Addr
	if err := m.Backends.Iterate(func(id uint32, a lb.L4Addr) bool {
		if id == 7 {
			backends = append(backends, a)
		}
		return true
	}); err != nil {
		t.Fatal(err)
	}
	if len(backends) != 1 || backends[0] != be {
		t.Errorf("backend 7: %v, want %v", backends, be)
	}
	// Slot 0 with session affinity: flag and timeout round-trip; a
	// slot's backend ID is not taken for a timeout.
	if err := m.Services.Update([]maps.ServiceSlot{{Frontend: fe}}, []maps.ServiceValue{{Count: 1, Affinity: true, AffinityTimeout: 10800}}); err != nil {
		t.Fatal(err)
	}
	if v, err := m.Services.Lookup(maps.ServiceSlot{Frontend: fe}); err != nil || v != (maps.ServiceValue{Count: 1, Affinity: true, AffinityTimeout: 10800}) {
		t.Errorf("slot 0 with affinity: %+v, %v", v, err)
	}
	if v, err := m.Services.Lookup(maps.ServiceSlot{Frontend: fe, Slot: 1}); err != nil || v != (maps.ServiceValue{BackendID: 7}) {
		t.Errorf("slot 1: %+v, %v", v, err)
	}
	// Kube-proxy replacement's flags and the internal scope, an entry of
	// its own beside the external one.
	kpr := maps.ServiceValue{Count: 1, NodePort: true, Local: true, TwoScopes: true}
	internal := maps.ServiceSlot{Frontend: fe, Scope: maps.ScopeInt}
	if err := m.Services.Update([]maps.ServiceSlot{internal, {Frontend: fe}}, []maps.ServiceValue{{Count: 2, NodePort: true}, kpr}); err != nil {
		t.Fatal(err)
	}
	if v, err := m.Services.Lookup(maps.ServiceSlot{Frontend: fe}); err != nil || v != kpr {
		t.Errorf("external slot 0: %+v, %v, want %+v", v, err, kpr)
	}
	if v, err := m.Services.Lookup(internal); err != nil || v != (maps.ServiceValue{Count: 2, NodePort: true}) {
		t.Errorf("internal slot 0: %+v, %v", v, err)
	}
	seen := false
	if err := m.Services.Iterate(func(k maps.ServiceSlot, _ maps.ServiceValue) bool {
		seen = seen || k == internal
		return true
	}); err != nil || !seen {
		t.Errorf("iterate: internal scope seen %v, %v", seen, err)
	}
	if err := m.Services.Delete([]maps.ServiceSlot{internal}); err != nil {
		t.Fatal(err)
	}
	if err := m.Services.Update([]maps.ServiceSlot{{Frontend: fe}}, []maps.ServiceValue{{Count: 1, Affinity: true, AffinityTimeout: 10800}}); err != nil {
		t.Fatal(err)
	}
	match := maps.AffinityMatch{Frontend: fe, BackendID: 7}
	if err := m.AffinityMatch.Update([]maps.AffinityMatch{match}); err != nil {
		t.Fatal(err)
	}
	var matches []maps.AffinityMatch
	if err := m.AffinityMatch.Iterate(func(k maps.AffinityMatch) bool { matches = append(matches, k); return true }); err != nil {
		t.Fatal(err)
	}
	if len(matches) != 1 || matches[0] != match {
		t.Errorf("affinity matches %v, want %v", matches, match)
	}
	if err := m.AffinityMatch.Delete([]maps.AffinityMatch{match, {Frontend: fe, BackendID: 8}}); err != nil {
		t.Errorf("delete affinity matches (a missing one included): %v", err)
	}
	akey := maps.AffinityKey{NetnsCookie: 4096, Frontend: fe}
	if err := m.Affinity.Update(akey, maps.AffinityValue{BackendID: 7, LastUsed: 123456789}); err != nil {
		t.Fatal(err)
	}
	n := 0
	if err := m.Affinity.Iterate(func(k maps.AffinityKey, v maps.AffinityValue) bool {
		n++
		if k != akey || v != (maps.AffinityValue{BackendID: 7, LastUsed: 123456789}) {
			t.Errorf("affinity entry %+v -> %+v", k, v)
		}
		return true
	}); err != nil || n != 1 {
		t.Errorf("affinity map: %d entries (%v), want 1", n, err)
	}
	if err := m.Services.Delete([]maps.ServiceSlot{{Frontend: fe}, {Frontend: fe, Slot: 1}, {Frontend: fe, Slot: 9}}); err != nil {
		t.Errorf("delete (a missing slot included): %v", err)
	}
	if _, err := m.Services.Lookup(maps.ServiceSlot{Frontend: fe}); !errors.Is(err, ebpf.ErrKeyNotExist) {
		t.Errorf("slot 0 after delete: %v", err)
	}
	// The veth programs' reference to the reverse map: slot 0 of
	// cellium_lb4_reverse_sk_ref holds it while the maps are open.
	ref, err := ebpf.LoadPinnedMap(filepath.Join(dir, maps.SockXlateRefMapName), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ref.Close()
	var innerID ebpf.MapID
	if err := ref.Lookup(uint32(0), &innerID); err != nil {
		t.Errorf("%s slot 0 after OpenLB: %v", maps.SockXlateRefMapName, err)
	} else if info, err := m.ReverseSK.Info(); err != nil {
		t.Error(err)
	} else if id, _ := info.ID(); id != innerID {
		t.Errorf("%s slot 0 holds map %d, want the reverse map %d", maps.SockXlateRefMapName, innerID, id)
	}
	if err := maps.UnpinLB(dir); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{maps.LB4ServicesMapName, maps.LB4BackendsMapName, maps.LB4ReverseSKMapName,
		maps.LB4AffinityMapName, maps.LB4AffinityMatchMapName, maps.LB4SourceRangeMapName} {
		if _, err := os.Stat(filepath.Join(dir, name)); !os.IsNotExist(err) {
			t.Errorf("%s still pinned (%v)", name, err)
		}
	}
	if err := ref.Lookup(uint32(0), &innerID); !errors.Is(err, ebpf.ErrKeyNotExist) {
		t.Errorf("%s slot 0 after UnpinLB: %v, want empty", maps.SockXlateRefMapName, err)
	}
}

// --bpf-lb-map-max sizes the service, backend and affinity maps; the same
// size reopens them with their entries, another replaces them (empty, of
// the new size), and two openers at once end up on the same maps.
func TestPrivilegedLBMapMax(t *testing.T) {
	privileged.Require(t)
	dir := tempBPFFS(t)
	id := func(m *ebpf.Map) ebpf.MapID {
		t.Helper()
		info, err := m.Info()
		if err != nil {
			t.Fatal(err)
		}
		mid, _ := info.ID()
		return mid
	}
	m, err := maps.OpenLBWith(dir, maps.LBOptions{MapMax: 1000})
	if err != nil {
		t.Fatal(err)
	}
	sized := func(m *maps.LBMaps) map[string]uint32 {
		return map[string]uint32{"services": m.Services.Map().MaxEntries(), "backends": m.Backends.Map().MaxEntries(),
			"affinity": m.Affinity.Map().MaxEntries(), "affinity_match": m.AffinityMatch.Map().MaxEntries()}
	}
	for name, got := range sized(m) {
		if got != 1000 {
			t.Errorf("%s: %d entries, want 1000", name, got)
		}
	}
	if got := m.ReverseSK.MaxEntries(); got != 262144 {
		t.Errorf("reverse_sk resized to %d: only the lb maps follow the flag", got)
	}
	be := lb.L4Addr{Addr: netip.MustParseAddr("10.0.3.4"), Port: 80, Proto: lb.TCP}
	if err := m.Backends.Update([]uint32{900}, []lb.L4Addr{be}); err != nil {
		t.Fatal(err)
	}
	m.Close()

	same, err := maps.OpenLBWith(dir, maps.LBOptions{MapMax: 1000})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	_ = same.Backends.Iterate(func(uint32, lb.L4Addr) bool { n++; return true })
	if n != 1 {
		t.Errorf("reopened with the same size: %d backends, want the 1 written", n)
	}
	same.Close()

	// Two openers with a new size at once: one replaces the pins, the
	// other opens the replacement.
	var ms [2]*maps.LBMaps
	errs := make(chan error, 2)
	for i := range ms {
		go func() {
			var err error
			ms[i], err = maps.OpenLBWith(dir, maps.LBOptions{MapMax: 4096})
			errs <- err
		}()
	}
	for range ms {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	defer ms[0].Close()
	defer ms[1].Close()
	for name, got := range sized(ms[0]) {
		if got != 4096 {
			t.Errorf("after the size changed, %s has %d entries, want 4096", name, got)
		}
	}
	if a, b := id(ms[0].Services.Map()), id(ms[1].Services.Map()); a != b {
		t.Errorf("two openers got different services maps (%d, %d)", a, b)
	}
	n = 0
	_ = ms[0].Backends.Iterate(func(uint32, lb.L4Addr) bool { n++; return true })
	if n != 0 {
		t.Errorf("the replaced backends map holds %d entries, want a new empty map", n)
	}
	if _, err := maps.OpenLBWith(dir, maps.LBOptions{MapMax: maps.MaxLBMapMax + 1}); err == nil {
		t.Error("a size past MaxLBMapMax was accepted")
	}
}
