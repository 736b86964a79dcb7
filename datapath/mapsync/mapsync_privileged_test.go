package mapsync

import (
	"encoding/json"
	"errors"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/cilium/statedb"
	"golang.org/x/sys/unix"

	"github.com/cellium/cellium/datapath/maps"
	"github.com/cellium/cellium/statedb/endpoints"
	"github.com/cellium/cellium/statedb/identity"
	"github.com/cellium/cellium/statedb/ipcache"
	"github.com/cellium/cellium/statedb/mapstate"
	"github.com/cellium/cellium/statedb/policy"
	"github.com/cellium/cellium/test/privileged"
)

// tempBPFFS mounts a bpffs of the test's own on a temporary directory,
// unmounted (which drops every pin in it) when the test ends.
func tempBPFFS(tb testing.TB) string {
	tb.Helper()
	dir := filepath.Join(tb.TempDir(), "mapsync-bpffs")
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

// pinnedEnv are the pinned maps of a temporary bpffs, wrapped so that a test
// can wait for the reconcilers' writes.
type pinnedEnv struct {
	dir string
	m   *maps.Maps
	n   *notifier
	tg  targets
}

func openReal(t testing.TB) *pinnedEnv {
	t.Helper()
	dir := tempBPFFS(t)
	m, err := maps.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close() })
	n := &notifier{}
	return &pinnedEnv{dir: dir, m: m, n: n, tg: targets{
		ipc: notifying[netip.Prefix, IPCacheValue]{IPCacheMap(m.IPCache), n},
		lxc: notifying[netip.Addr, EndpointInfo]{EndpointsMap(m.Endpoints), n},
		pol: notifyingPolicies{PinnedPolicyMaps{Dir: dir}, n},
	}}
}

// notifying tells n after each write.
type notifying[K, V comparable] struct {
	Map[K, V]
	n *notifier
}

func (m notifying[K, V]) Update(k []K, v []V) error {
	defer m.n.notify()
	return m.Map.Update(k, v)
}

func (m notifying[K, V]) Delete(k []K) error {
	defer m.n.notify()
	return m.Map.Delete(k)
}

type notifyingPolicies struct {
	PolicyMaps
	n *notifier
}

type notifyingPolicyMap struct {
	notifying[policy.Key, PolicyValue]
	c PolicyMap
}

func (m notifyingPolicyMap) Close() error    { return m.c.Close() }
func (m notifyingPolicyMap) MaxEntries() int { return m.c.MaxEntries() }

func (p notifyingPolicies) Open(id uint16) (PolicyMap, error) {
	m, err := p.PolicyMaps.Open(id)
	if err != nil {
		return nil, err
	}
	return notifyingPolicyMap{notifying[policy.Key, PolicyValue]{m, p.n}, m}, nil
}

func (p notifyingPolicies) Remove(id uint16) error {
	defer p.n.notify()
	return p.PolicyMaps.Remove(id)
}

func (r *pinnedEnv) ipcache(t testing.TB) map[netip.Prefix]IPCacheValue {
	t.Helper()
	got, err := IPCacheMap(r.m.IPCache).Dump()
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// bpftoolCount is the number of entries `bpftool map dump pinned` shows.
func bpftoolCount(t *testing.T, path string) int {
	t.Helper()
	out, err := exec.Command("bpftool", "-j", "map", "dump", "pinned", path).Output()
	if err != nil {
		t.Fatalf("bpftool map dump pinned %s: %v", path, err)
	}
	var entries []json.RawMessage
	if err := json.Unmarshal(out, &entries); err != nil {
		t.Fatalf("bpftool output: %v: %s", err, out)
	}
	return len(entries)
}

// Rows in -> entries in the pinned cellium_ipcache (read back through
// datapath/maps, and counted by bpftool); a deleted row's entry goes; an
// entry written behind the reconciler's back is pruned.
func TestPrivilegedMapSyncIPCache(t *testing.T) {
	privileged.Require(t)
	r := openReal(t)
	e := newEnvWith(t, 50*time.Millisecond, nil, r.tg)
	e.write(func(w statedb.WriteTxn) {
		_, _, _ = e.ipc.Insert(w, entry("10.1.0.7/32", 1234))
		_, _, _ = e.ipc.Insert(w, entry("10.2.0.0/24", 16777217))
		row := entry("10.3.0.9/32", 2000)
		row.HostIP = addr("192.168.0.2")
		_, _, _ = e.ipc.Insert(w, row)
		vip := entry("10.96.0.10/32", identity.ReservedIdentityWorld)
		vip.Source, vip.ServiceFrontend = ipcache.SourceServiceFrontend, true
		_, _, _ = e.ipc.Insert(w, vip)
	})
	waitFor(t, "four entries", func() bool { return len(r.ipcache(t)) == 4 }, r.n.watch)
	if got := r.ipcache(t)[pfx("10.3.0.9/32")]; got != (IPCacheValue{Identity: 2000, TunnelEndpoint: addr("192.168.0.2")}) {
		t.Errorf("10.3.0.9/32 -> %+v", got)
	}
	if got, err := r.m.IPCache.Lookup(pfx("10.96.0.10/32")); err != nil || got != (maps.IPCacheEntry{Identity: 2, Flags: maps.IPCacheFlagService}) {
		t.Errorf("the Service frontend 10.96.0.10/32 -> %+v, %v; want world with the service flag", got, err)
	}
	if n := bpftoolCount(t, filepath.Join(r.dir, maps.IPCacheMapName)); n != 4 {
		t.Errorf("bpftool shows %d entries, want 4", n)
	}
	// The datapath's longest-prefix lookup finds the /24.
	if got, err := r.m.IPCache.Lookup(pfx("10.2.0.77/32")); err != nil || got.Identity != 16777217 {
		t.Errorf("lookup 10.2.0.77: %+v, %v", got, err)
	}

	e.write(func(w statedb.WriteTxn) { _, _, _ = e.ipc.Delete(w, entry("10.2.0.0/24", 0)) })
	waitFor(t, "deleted entry gone", func() bool {
		_, ok := r.ipcache(t)[pfx("10.2.0.0/24")]
		return !ok
	}, r.n.watch)

	if err := r.m.IPCache.Update(pfx("172.16.0.0/12"), maps.IPCacheEntry{Identity: 99}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "stray entry pruned", func() bool {
		_, ok := r.ipcache(t)[pfx("172.16.0.0/12")]
		return !ok
	}, r.n.watch)
	if got := r.ipcache(t); len(got) != 3 {
		t.Errorf("after pruning: %v", got)
	}
}

// Endpoints -> cellium_lxc entries; deletion removes them.
func TestPrivilegedMapSyncEndpoints(t *testing.T) {
	privileged.Require(t)
	r := openReal(t)
	e := newEnvWith(t, 0, nil, r.tg)
	e.write(func(w statedb.WriteTxn) {
		_, _, _ = e.eps.Insert(w, &endpoints.Endpoint{ID: 1, IPv4: addr("10.1.0.1"), HostIfIndex: 11,
			MAC: "02:00:00:00:00:01", HostMAC: "02:00:00:00:01:01", Identity: 1234})
	})
	dump := func() map[netip.Addr]EndpointInfo {
		got, err := EndpointsMap(r.m.Endpoints).Dump()
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	waitFor(t, "endpoint in the map", func() bool { return len(dump()) == 1 }, r.n.watch)
	info, err := r.m.Endpoints.Lookup(addr("10.1.0.1"))
	if err != nil || info.ID != 1 || info.IfIndex != 11 || info.Identity != 1234 || info.MAC.String() != "02:00:00:00:00:01" ||
		info.NodeMAC.String() != "02:00:00:00:01:01" {
		t.Errorf("lookup 10.1.0.1: %+v, %v", info, err)
	}
	e.write(func(w statedb.WriteTxn) { _, _, _ = e.eps.Delete(w, &endpoints.Endpoint{ID: 1}) })
	waitFor(t, "endpoint gone", func() bool { return len(dump()) == 0 }, r.n.watch)
}

// An endpoint's policy lands in its pinned cellium_policy_<id>; a new
// revision is applied by difference; a stray entry is pruned; the
// endpoint's deletion unpins the map.
func TestPrivilegedMapSyncPolicy(t *testing.T) {
	privileged.Require(t)
	r := openReal(t)
	e := newEnvWith(t, 50*time.Millisecond, nil, r.tg)
	pm := tableWatch(e.db, statedb.Table[*mapstate.PolicyMap](e.tables.PolicyMap))
	web, dns := key(1000, policy.Ingress, policy.ProtoTCP, 80), key(1001, policy.Ingress, policy.ProtoUDP, 53)
	e.write(func(w statedb.WriteTxn) {
		_, _, _ = e.eps.Insert(w, &endpoints.Endpoint{ID: 5, IPv4: addr("10.1.0.5"), Identity: 1234})
		_, _, _ = e.pols.Insert(w, policyRow(5, 1, []policy.Entry{{Key: web}, {Key: dns, Deny: true}}))
	})
	waitFor(t, "revision 1 realized", func() bool {
		row, ok := policyMapRow(e, 5)
		return ok && row.Realized == 1
	}, pm)
	pinned := filepath.Join(r.dir, maps.PolicyMapPinName(5))
	pmap, err := maps.OpenPolicyMap(r.dir, 5)
	if err != nil {
		t.Fatal(err)
	}
	defer pmap.Close()
	entries := func() map[policy.Key]bool {
		out := map[policy.Key]bool{}
		if err := pmap.Iterate(func(e policy.Entry) bool { out[e.Key] = e.Deny; return true }); err != nil {
			t.Fatal(err)
		}
		return out
	}
	if got := entries(); len(got) != 3 || !got[dns] || got[web] {
		t.Errorf("revision 1 in the map: %v", got)
	}
	if n := bpftoolCount(t, pinned); n != 3 {
		t.Errorf("bpftool shows %d entries, want 3", n)
	}

	ssh := key(1000, policy.Ingress, policy.ProtoTCP, 22)
	e.write(func(w statedb.WriteTxn) {
		_, _, _ = e.pols.Insert(w, policyRow(5, 2, []policy.Entry{{Key: ssh}, {Key: web}}))
	})
	waitFor(t, "revision 2 realized", func() bool {
		row, ok := policyMapRow(e, 5)
		return ok && row.Realized == 2
	}, pm)
	if got := entries(); len(got) != 3 {
		t.Errorf("revision 2 in the map: %v", got)
	} else if _, ok := got[dns]; ok {
		t.Errorf("revision 2 still has %s", dns)
	}

	stray := key(666, policy.Egress, policy.ProtoTCP, 1)
	if err := pmap.Update(policy.Entry{Key: stray}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "stray entry pruned", func() bool {
		_, ok := entries()[stray]
		return !ok
	}, r.n.watch)

	e.write(func(w statedb.WriteTxn) {
		_, _, _ = e.pols.Delete(w, policyRow(5, 0, nil))
		_, _, _ = e.eps.Delete(w, &endpoints.Endpoint{ID: 5})
	})
	waitFor(t, "map unpinned", func() bool {
		_, err := os.Stat(pinned)
		return errors.Is(err, os.ErrNotExist)
	}, r.n.watch)
	if _, ok := policyMapRow(e, 5); ok {
		t.Error("the policy-maps row outlived its endpoint")
	}
}
