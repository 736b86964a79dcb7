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
	if err := m.Services.Delete([]maps.ServiceSlot{{Frontend: fe}, {Frontend: fe, Slot: 1}, {Frontend: fe, Slot: 9}}); err != nil {
		t.Errorf("delete (a missing slot included): %v", err)
	}
	if _, err := m.Services.Lookup(maps.ServiceSlot{Frontend: fe}); !errors.Is(err, ebpf.ErrKeyNotExist) {
		t.Errorf("slot 0 after delete: %v", err)
	}
	if err := maps.UnpinLB(dir); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{maps.LB4ServicesMapName, maps.LB4BackendsMapName, maps.LB4ReverseSKMapName} {
		if _, err := os.Stat(filepath.Join(dir, name)); !os.IsNotExist(err) {
			t.Errorf("%s still pinned (%v)", name, err)
		}
	}
}
