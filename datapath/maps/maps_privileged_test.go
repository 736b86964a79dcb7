package maps_test

import (
	"errors"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"golang.org/x/sys/unix"

	"github.com/cellium/cellium/datapath/bpf"
	"github.com/cellium/cellium/datapath/maps"
	"github.com/cellium/cellium/statedb/policy"
	"github.com/cellium/cellium/test/privileged"
)

// tempBPFFS mounts a bpffs on a fresh temporary directory, unmounted when
// tb ends (before the directory is removed).
func tempBPFFS(tb testing.TB) string {
	tb.Helper()
	dir := filepath.Join(tb.TempDir(), "bpffs")
	if err := maps.EnsureBPFFS(dir); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := unix.Unmount(dir, 0); err != nil {
			tb.Errorf("unmount %s: %v", dir, err)
		}
	})
	return dir
}

func TestPrivilegedMapsOpenReopen(t *testing.T) {
	privileged.Require(t)
	dir := tempBPFFS(t)
	if ok, err := maps.IsBPFFS(dir); err != nil || !ok {
		t.Fatalf("IsBPFFS(%s) = %v, %v after EnsureBPFFS", dir, ok, err)
	}
	// A second EnsureBPFFS sees the mount and does not stack another.
	if err := maps.EnsureBPFFS(dir); err != nil {
		t.Fatal(err)
	}

	m, err := maps.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{maps.IPCacheMapName, maps.EndpointsMapName, maps.CT4MapName, maps.MetricsMapName, maps.EventsMapName, maps.PolicyProgsMapName} {
		if _, err := os.Stat(filepath.Join(dir, name)); err != nil {
			t.Errorf("pin %s: %v", name, err)
		}
	}
	p := netip.MustParsePrefix("10.9.0.0/16")
	if err := m.IPCache.Update(p, maps.IPCacheEntry{Identity: 4242}); err != nil {
		t.Fatal(err)
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}

	// Reopening finds the same maps with their content.
	m, err = maps.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if e, err := m.IPCache.Lookup(p); err != nil || e.Identity != 4242 {
		t.Errorf("after reopen: %+v, %v; want identity 4242", e, err)
	}

	// A pin of another shape is refused with ErrMapIncompatible, except
	// the soft state of the programs (conntrack, fragments), which an
	// upgrade that changed its layout replaces.
	bogusDir := tempBPFFS(t)
	for _, name := range []string{maps.CT4MapName, maps.IPCacheMapName} {
		bogus, err := ebpf.NewMapWithOptions(&ebpf.MapSpec{
			Name: name, Type: ebpf.Hash, KeySize: 4, ValueSize: 4, MaxEntries: 1, Pinning: ebpf.PinByName,
		}, ebpf.MapOptions{PinPath: bogusDir})
		if err != nil {
			t.Fatal(err)
		}
		bogus.Close()
	}
	if _, err := maps.Open(bogusDir); !errors.Is(err, ebpf.ErrMapIncompatible) || !strings.Contains(err.Error(), maps.IPCacheMapName) {
		t.Errorf("Open over an incompatible ipcache pin: %v, want ErrMapIncompatible naming it", err)
	}
	if err := os.Remove(filepath.Join(bogusDir, maps.IPCacheMapName)); err != nil {
		t.Fatal(err)
	}
	replaced, err := maps.Open(bogusDir)
	if err != nil {
		t.Fatalf("Open over an incompatible conntrack pin: %v, want it replaced", err)
	}
	if info, err := replaced.CT4.Map().Info(); err != nil || info.ValueSize != uint32(unsafe.Sizeof(bpf.LxcCtEntry{})) {
		t.Errorf("conntrack map after the replacement: %+v, %v", info, err)
	}
	replaced.Close()
	if err := maps.Unpin(bogusDir); err != nil {
		t.Fatal(err)
	}
	if err := maps.Unpin(bogusDir); err != nil {
		t.Errorf("second Unpin: %v", err)
	}
	ents, _ := os.ReadDir(bogusDir)
	for _, e := range ents {
		if !strings.HasSuffix(e.Name(), ".debug") { // the bpffs's own iterators
			t.Errorf("pin %s left after Unpin", e.Name())
		}
	}
}

func TestPrivilegedIPCacheOps(t *testing.T) {
	privileged.Require(t)
	m, err := maps.Open(tempBPFFS(t))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()

	want := map[netip.Prefix]maps.IPCacheEntry{
		netip.MustParsePrefix("10.0.0.1/32"): {Identity: 1001},
		netip.MustParsePrefix("10.0.0.0/24"): {Identity: 1002, TunnelEndpoint: netip.MustParseAddr("192.168.0.2")},
		netip.MustParsePrefix("0.0.0.0/0"):   {Identity: 2},
		netip.MustParsePrefix("fd00::/64"):   {Identity: 1003},
	}
	var ps []netip.Prefix
	var es []maps.IPCacheEntry
	for p, e := range want {
		ps = append(ps, p)
		es = append(es, e)
	}
	if err := m.IPCache.BatchUpdate(ps, es); err != nil {
		t.Fatal(err)
	}
	got := map[netip.Prefix]maps.IPCacheEntry{}
	if err := m.IPCache.Iterate(func(p netip.Prefix, e maps.IPCacheEntry) bool { got[p] = e; return true }); err != nil {
		t.Fatal(err)
	}
	if len(got) != len(want) {
		t.Fatalf("iterated %v, want %v", got, want)
	}
	for p, e := range want {
		if got[p] != e {
			t.Errorf("%v: %+v, want %+v", p, got[p], e)
		}
	}
	p := netip.MustParsePrefix("10.0.0.1/32")
	if err := m.IPCache.Update(p, maps.IPCacheEntry{Identity: 7}); err != nil {
		t.Fatal(err)
	}
	if e, err := m.IPCache.Lookup(p); err != nil || e.Identity != 7 {
		t.Errorf("after update: %+v %v", e, err)
	}
	for range 2 { // deleting twice is fine
		if err := m.IPCache.Delete(p); err != nil {
			t.Fatal(err)
		}
	}
	// Lookups are longest-prefix matches: now the /24 answers.
	if e, err := m.IPCache.Lookup(p); err != nil || e.Identity != 1002 {
		t.Errorf("lookup after delete: %+v, %v; want the /24's identity 1002", e, err)
	}
	if _, err := m.IPCache.Lookup(netip.MustParsePrefix("fe80::1/128")); !errors.Is(err, ebpf.ErrKeyNotExist) {
		t.Errorf("lookup outside every prefix: %v, want ErrKeyNotExist", err)
	}
}

func TestPrivilegedEndpointsOps(t *testing.T) {
	privileged.Require(t)
	m, err := maps.Open(tempBPFFS(t))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	a, b := netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2")
	ia := maps.EndpointInfo{IfIndex: 5, ID: 1, MAC: net.HardwareAddr{2, 0, 0, 0, 0, 1}, NodeMAC: net.HardwareAddr{2, 0, 0, 0, 0, 0xfe}, Identity: 1001}
	ib := maps.EndpointInfo{IfIndex: 6, ID: 2, MAC: net.HardwareAddr{2, 0, 0, 0, 0, 2}, NodeMAC: net.HardwareAddr{2, 0, 0, 0, 0, 0xfe}, Identity: 1002}
	if err := m.Endpoints.BatchUpdate([]netip.Addr{a, b}, []maps.EndpointInfo{ia, ib}); err != nil {
		t.Fatal(err)
	}
	got := map[netip.Addr]maps.EndpointInfo{}
	if err := m.Endpoints.Iterate(func(a netip.Addr, i maps.EndpointInfo) bool { got[a] = i; return true }); err != nil {
		t.Fatal(err)
	}
	for addr, w := range map[netip.Addr]maps.EndpointInfo{a: ia, b: ib} {
		g := got[addr]
		if g.IfIndex != w.IfIndex || g.ID != w.ID || g.Identity != w.Identity || g.MAC.String() != w.MAC.String() || g.NodeMAC.String() != w.NodeMAC.String() {
			t.Errorf("%v: %+v, want %+v", addr, g, w)
		}
	}
	if err := m.Endpoints.Delete(a); err != nil {
		t.Fatal(err)
	}
	if err := m.Endpoints.Delete(a); err != nil {
		t.Errorf("second delete: %v", err)
	}
	if _, err := m.Endpoints.Lookup(a); !errors.Is(err, ebpf.ErrKeyNotExist) {
		t.Errorf("lookup after delete: %v", err)
	}
	if i, err := m.Endpoints.Lookup(b); err != nil || i.ID != 2 {
		t.Errorf("lookup b: %+v %v", i, err)
	}
}

func TestPrivilegedPolicyMapOps(t *testing.T) {
	privileged.Require(t)
	dir := tempBPFFS(t)
	pm, err := maps.OpenPolicyMap(dir, 42)
	if err != nil {
		t.Fatal(err)
	}
	if filepath.Base(pm.Path()) != "cellium_policy_00042" {
		t.Errorf("pin path %s", pm.Path())
	}
	entries := []policy.Entry{
		{Key: policy.NewKey(0, policy.Egress, policy.ProtoAny, 0, 0)},
		{Key: policy.NewKey(1001, policy.Ingress, policy.ProtoTCP, 80, 16)},
		{Key: policy.NewKey(1001, policy.Ingress, policy.ProtoUDP, 1024, 6)},
		{Key: policy.NewKey(0, policy.Ingress, policy.ProtoTCP, 22, 16), Deny: true},
	}
	if err := pm.BatchUpdate(entries); err != nil {
		t.Fatal(err)
	}
	var got []policy.Entry
	if err := pm.Iterate(func(e policy.Entry) bool { got = append(got, e); return true }); err != nil {
		t.Fatal(err)
	}
	cmp := func(a, b policy.Entry) int { return a.Key.Compare(b.Key) }
	slices.SortFunc(got, cmp)
	want := slices.Clone(entries)
	slices.SortFunc(want, cmp)
	if !slices.EqualFunc(got, want, func(a, b policy.Entry) bool { return a.Key == b.Key && a.Deny == b.Deny }) {
		t.Errorf("iterated %v\nwant %v", got, want)
	}
	if v, err := pm.Lookup(entries[3].Key); err != nil || !v.Deny || v.LPMPrefixLen != 24 {
		t.Errorf("lookup deny entry: %+v %v", v, err)
	}
	// A port inside 1024/6 finds that entry.
	if v, err := pm.Lookup(policy.NewKey(1001, policy.Ingress, policy.ProtoUDP, 1500, 16)); err != nil || v.Deny || v.LPMPrefixLen != 14 {
		t.Errorf("lookup udp/1500: %+v %v; want the allow of udp/1024-2047", v, err)
	}
	if err := pm.Delete(entries[1].Key); err != nil {
		t.Fatal(err)
	}
	if err := pm.Delete(entries[1].Key); err != nil {
		t.Errorf("second delete: %v", err)
	}
	if _, err := pm.Lookup(entries[1].Key); !errors.Is(err, ebpf.ErrKeyNotExist) {
		t.Errorf("lookup after delete: %v", err)
	}
	if err := pm.Close(); err != nil {
		t.Fatal(err)
	}

	// Reopening keeps the entries; so does loading the pin read-only,
	// which cannot write.
	pm, err = maps.OpenPolicyMap(dir, 42)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pm.Lookup(entries[2].Key); err != nil {
		t.Errorf("after reopen: %v", err)
	}
	pm.Close()
	ro, err := maps.LoadPinnedPolicyMap(dir, 42)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ro.Lookup(entries[2].Key); err != nil {
		t.Errorf("read-only load: %v", err)
	}
	if err := ro.Update(entries[1]); err == nil {
		t.Error("a read-only policy map took a write")
	}
	ro.Close()
	// Loading never pins a map that is not there.
	if _, err := maps.LoadPinnedPolicyMap(dir, 43); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("load of a missing pin: %v, want os.ErrNotExist", err)
	}
	if _, err := os.Stat(filepath.Join(dir, maps.PolicyMapPinName(43))); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("loading a missing pin created it: %v", err)
	}
	// Removing drops the pin.
	for range 2 {
		if err := maps.RemovePolicyMap(dir, 42); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, maps.PolicyMapPinName(42))); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("pin still there: %v", err)
	}
}

func TestPrivilegedMetricsAndCTEmpty(t *testing.T) {
	privileged.Require(t)
	m, err := maps.Open(tempBPFFS(t))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	all, err := m.Metrics.Read()
	if err != nil || len(all) != 0 {
		t.Errorf("fresh metrics: %v %v", all, err)
	}
	v, err := m.Metrics.Get(maps.MetricsKey{Reason: maps.DropPolicy, Dir: maps.DirIngress})
	if err != nil || v != (maps.MetricsValue{}) {
		t.Errorf("missing counter: %+v %v", v, err)
	}
	n := 0
	if err := m.CT4.Iterate(func(maps.CTKey, maps.CTEntry) bool { n++; return true }); err != nil || n != 0 {
		t.Errorf("fresh conntrack: %d entries, %v", n, err)
	}
	r, err := m.NewEventReader()
	if err != nil {
		t.Fatal(err)
	}
	r.Close()
}

// TestPrivilegedPolicyMapConcurrentOpen: the loader and the policy map
// reconciler open a new endpoint's policy map at the same time; every
// opener gets the one pinned map (before, the opener that lost the race
// to pin failed with "file exists" and the endpoint's CNI ADD with it).
func TestPrivilegedPolicyMapConcurrentOpen(t *testing.T) {
	privileged.Require(t)
	dir := tempBPFFS(t)
	const openers = 8
	for id := uint16(1); id <= 50; id++ {
		var wg sync.WaitGroup
		ids := make([]ebpf.MapID, openers)
		errs := make([]error, openers)
		start := make(chan struct{})
		for i := range openers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				pm, err := maps.OpenPolicyMap(dir, id)
				if err != nil {
					errs[i] = err
					return
				}
				defer pm.Close()
				info, err := pm.Map().Info()
				if err != nil {
					errs[i] = err
					return
				}
				ids[i], _ = info.ID()
			}()
		}
		close(start)
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			t.Fatalf("endpoint %d: concurrent open: %v", id, err)
		}
		for _, mid := range ids[1:] {
			if mid != ids[0] {
				t.Fatalf("endpoint %d: openers got different maps %v", id, ids)
			}
		}
	}
}

// TestPrivilegedPolicyProgsOps: a slot of cellium_policy_progs is set,
// replaced and emptied; a set slot survives closing and reopening the
// pinned maps (what an agent restart does), and the map keeps the program
// alive after its own file descriptor is closed.
func TestPrivilegedPolicyProgsOps(t *testing.T) {
	privileged.Require(t)
	dir := tempBPFFS(t)
	m, err := maps.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	newProg := func() *ebpf.Program {
		t.Helper()
		p, err := ebpf.NewProgram(&ebpf.ProgramSpec{
			Type:         ebpf.SchedCLS,
			Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 0), asm.Return()},
			License:      "GPL",
		})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	has := func(m *maps.Maps, ep uint16) bool {
		t.Helper()
		ok, err := m.PolicyProgs.Has(ep)
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
	if has(m, 7) {
		t.Fatal("slot 7 set in a new map")
	}
	p1, p2 := newProg(), newProg()
	if err := m.PolicyProgs.Set(7, p1); err != nil {
		t.Fatal(err)
	}
	if err := m.PolicyProgs.Set(7, p2); err != nil {
		t.Fatalf("replace: %v", err)
	}
	if err := m.PolicyProgs.Set(65535, p1); err != nil {
		t.Fatalf("highest endpoint ID: %v", err)
	}
	p1.Close()
	p2.Close()
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	m, err = maps.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if !has(m, 7) || !has(m, 65535) {
		t.Error("slots lost when the maps were closed and reopened")
	}
	if err := m.PolicyProgs.Delete(7); err != nil {
		t.Fatal(err)
	}
	if has(m, 7) {
		t.Error("slot 7 still set after Delete")
	}
	if err := m.PolicyProgs.Delete(7); err != nil {
		t.Errorf("Delete of an empty slot: %v", err)
	}
	if err := m.PolicyProgs.Delete(65535); err != nil {
		t.Fatal(err)
	}
}

// TestPrivilegedMapsOpenConcurrently: two Opens of one directory at once
// (the agent's map cell and its datapath monitor) both succeed: the one
// that loses the race to pin a map opens the winner's. Before, it failed
// with "pin map ...: file exists" and the agent did not start.
func TestPrivilegedMapsOpenConcurrently(t *testing.T) {
	privileged.Require(t)
	for range 20 {
		dir := tempBPFFS(t)
		var wg sync.WaitGroup
		errs := make([]error, 4)
		for i := range errs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				m, err := maps.Open(dir)
				if err == nil {
					m.Close()
				}
				errs[i] = err
			}()
		}
		wg.Wait()
		for _, err := range errs {
			if err != nil {
				t.Fatalf("concurrent Open: %v", err)
			}
		}
	}
}
