package mapsync

import (
	"context"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cilium/statedb"
	"go.uber.org/goleak"

	"github.com/cellium/cellium/statedb/endpoints"
	"github.com/cellium/cellium/statedb/identity"
	"github.com/cellium/cellium/statedb/ipcache"
	"github.com/cellium/cellium/statedb/mapstate"
	"github.com/cellium/cellium/statedb/policy"
	"github.com/cellium/cellium/statedb/reconciler"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type nopHealth struct{}

func (nopHealth) OK(string)              {}
func (nopHealth) Degraded(string, error) {}

// env is the three reconcilers and the deriver over fake maps.
type env struct {
	t       testing.TB
	db      *statedb.DB
	eps     statedb.RWTable[*endpoints.Endpoint]
	pols    statedb.RWTable[*policy.EndpointPolicyRow]
	ipc     statedb.RWTable[*ipcache.Entry]
	tables  Tables
	ipcMap  *fakeMap[netip.Prefix, IPCacheValue]
	lxcMap  *fakeMap[netip.Addr, EndpointInfo]
	polMaps *fakePolicyMaps
	polOps  *PolicyOps
	cancel  context.CancelFunc
	wg      sync.WaitGroup
}

// targets are the maps an env reconciles into.
type targets struct {
	ipc Map[netip.Prefix, IPCacheValue]
	lxc Map[netip.Addr, EndpointInfo]
	pol PolicyMaps
}

// newEnv runs the reconcilers on fake maps.
func newEnv(t *testing.T, full time.Duration, setup func(*env, targets)) *env {
	t.Helper()
	ipc, lxc, pol := newFakeMap[netip.Prefix, IPCacheValue](nil), newFakeMap[netip.Addr, EndpointInfo](nil), newFakePolicyMaps()
	e := newEnvWith(t, full, setup, targets{ipc, lxc, pol})
	e.ipcMap, e.lxcMap, e.polMaps = ipc, lxc, pol
	return e
}

// newEnvWith runs the reconcilers on the maps of tg.
func newEnvWith(t testing.TB, full time.Duration, setup func(*env, targets), tg targets) *env {
	t.Helper()
	e := &env{t: t, db: statedb.New()}
	var err error
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	e.eps, err = endpoints.NewTable(e.db)
	must(err)
	e.pols, err = policy.NewTable(e.db)
	must(err)
	e.ipc, err = ipcache.NewTable(e.db)
	must(err)
	lxc, err := mapstate.NewEndpointsTable(e.db)
	must(err)
	pm, err := mapstate.NewPoliciesTable(e.db)
	must(err)
	e.tables = Tables{DB: e.db, Endpoints: e.eps, Policies: e.pols, LXC: lxc, PolicyMap: pm}
	if setup != nil {
		setup(e, tg)
	}
	d := NewDeriver(e.tables)
	must(d.Subscribe())
	ic := IPCacheConfig(ipcache.StatusTable{RWTable: e.ipc}, tg.ipc)
	ec := EndpointsConfig(e.tables, tg.lxc)
	e.polOps = NewPolicyOps(tg.pol, e.tables.Endpoints)
	pc := PoliciesConfig(e.tables, e.polOps)
	ic.FullInterval, ec.FullInterval, pc.FullInterval = full, full, full
	ic.RetryMin, ec.RetryMin, pc.RetryMin = time.Millisecond, time.Millisecond, time.Millisecond
	ir, err := reconciler.New(e.db, ic)
	must(err)
	er, err := reconciler.New(e.db, ec)
	must(err)
	pr, err := reconciler.New(e.db, pc)
	must(err)
	must(ir.Subscribe())
	must(er.Subscribe())
	must(pr.Subscribe())
	ctx, cancel := context.WithCancel(context.Background())
	e.cancel = cancel
	for _, run := range []func(context.Context, reconciler.Health){d.Run, ir.Run, er.Run, pr.Run} {
		e.wg.Add(1)
		go func() {
			defer e.wg.Done()
			run(ctx, nopHealth{})
		}()
	}
	t.Cleanup(func() {
		cancel()
		e.wg.Wait()
	})
	return e
}

func (e *env) write(fn func(statedb.WriteTxn)) {
	wtxn := e.db.WriteTxn(e.eps, e.pols, e.ipc)
	fn(wtxn)
	wtxn.Commit()
}

func tableWatch[T any](db *statedb.DB, t statedb.Table[T]) func() <-chan struct{} {
	return func() <-chan struct{} {
		_, w := t.AllWatch(db.ReadTxn())
		return w
	}
}

var (
	pfx  = netip.MustParsePrefix
	addr = netip.MustParseAddr
)

func entry(p string, id identity.NumericIdentity) *ipcache.Entry {
	return &ipcache.Entry{Prefix: pfx(p), Identity: id, Source: ipcache.SourceEndpoint, Status: reconciler.Pending()}
}

// Rows in -> entries in the map with status Done; a deleted row's entry
// goes; an entry written behind the reconciler's back is pruned by the
// periodic full reconciliation.
func TestIPCacheReconciler(t *testing.T) {
	e := newEnv(t, 20*time.Millisecond, nil)
	e.write(func(w statedb.WriteTxn) {
		_, _, _ = e.ipc.Insert(w, entry("10.1.0.7/32", 1234))
		_, _, _ = e.ipc.Insert(w, entry("10.2.0.0/24", 16777217))
		r := entry("10.3.0.9/32", 2000)
		r.HostIP = addr("192.168.0.2")
		_, _, _ = e.ipc.Insert(w, r)
	})
	allDone := func() bool {
		for row := range e.ipc.All(e.db.ReadTxn()) {
			if row.Status.Kind != reconciler.StatusDone {
				return false
			}
		}
		return true
	}
	waitFor(t, "three entries done", func() bool { return len(e.ipcMap.snapshot()) == 3 && allDone() },
		e.ipcMap.watch, tableWatch(e.db, e.ipc))
	if got := e.ipcMap.snapshot()[pfx("10.3.0.9/32")]; got != (IPCacheValue{Identity: 2000, TunnelEndpoint: addr("192.168.0.2")}) {
		t.Errorf("10.3.0.9/32 -> %+v", got)
	}
	e.write(func(w statedb.WriteTxn) { _, _, _ = e.ipc.Delete(w, entry("10.2.0.0/24", 0)) })
	waitFor(t, "deleted entry gone", func() bool {
		_, ok := e.ipcMap.snapshot()[pfx("10.2.0.0/24")]
		return !ok
	}, e.ipcMap.watch)

	e.ipcMap.put(pfx("172.16.0.0/12"), IPCacheValue{Identity: 99})
	waitFor(t, "stray entry pruned", func() bool {
		_, ok := e.ipcMap.snapshot()[pfx("172.16.0.0/12")]
		return !ok
	}, e.ipcMap.watch)
	if n := len(e.ipcMap.snapshot()); n != 2 {
		t.Errorf("%d entries after pruning, want 2", n)
	}
}

// A failing map update shows as an Error status with the error, and is
// retried until it succeeds.
func TestIPCacheReconcilerRetries(t *testing.T) {
	e := newEnv(t, 0, nil)
	e.ipcMap.fail(-1)
	e.write(func(w statedb.WriteTxn) { _, _, _ = e.ipc.Insert(w, entry("10.1.0.7/32", 1234)) })
	status := func() reconciler.Status {
		row, _, _ := e.ipc.Get(e.db.ReadTxn(), ipcache.PrefixIndex.Query(pfx("10.1.0.7/32")))
		return row.Status
	}
	waitFor(t, "the failure in the row's status", func() bool {
		s := status()
		return s.Kind == reconciler.StatusError && strings.Contains(s.Error, errInjected.Error())
	}, tableWatch(e.db, e.ipc))
	e.ipcMap.fail(0)
	waitFor(t, "done after a retry", func() bool { return status().Kind == reconciler.StatusDone }, tableWatch(e.db, e.ipc))
	if got := e.ipcMap.snapshot()[pfx("10.1.0.7/32")]; got.Identity != 1234 {
		t.Errorf("after retries: %+v", got)
	}
}

// Endpoints -> lxc-map rows -> cellium_lxc entries; an endpoint without a
// veth has none; a bad MAC is an error in the row's status; a deleted
// endpoint's entry goes.
func TestEndpointsReconciler(t *testing.T) {
	e := newEnv(t, 0, nil)
	e.write(func(w statedb.WriteTxn) {
		_, _, _ = e.eps.Insert(w, &endpoints.Endpoint{ID: 1, IPv4: addr("10.1.0.1"), HostIfIndex: 11,
			MAC: "02:00:00:00:00:01", HostMAC: "02:00:00:00:01:01", Identity: 1234})
		_, _, _ = e.eps.Insert(w, &endpoints.Endpoint{ID: 2, IPv4: addr("10.1.0.2")}) // no veth yet
		_, _, _ = e.eps.Insert(w, &endpoints.Endpoint{ID: 3, IPv4: addr("10.1.0.3"), HostIfIndex: 13, MAC: "bogus"})
	})
	lxc := e.tables.LXC
	waitFor(t, "endpoint 1 in the map, endpoint 3 failed", func() bool {
		row, _, ok := lxc.Get(e.db.ReadTxn(), mapstate.EndpointIPIndex.Query(addr("10.1.0.3")))
		return len(e.lxcMap.snapshot()) == 1 && ok && row.Status.Kind == reconciler.StatusError &&
			strings.Contains(row.Status.Error, "MAC")
	}, e.lxcMap.watch, tableWatch(e.db, statedb.Table[*mapstate.Endpoint](lxc)))
	want := EndpointInfo{IfIndex: 11, EndpointID: 1, MAC: [6]byte{2, 0, 0, 0, 0, 1}, NodeMAC: [6]byte{2, 0, 0, 0, 1, 1}, Identity: 1234}
	if got := e.lxcMap.snapshot()[addr("10.1.0.1")]; got != want {
		t.Errorf("10.1.0.1 -> %+v, want %+v", got, want)
	}
	e.write(func(w statedb.WriteTxn) { _, _, _ = e.eps.Delete(w, &endpoints.Endpoint{ID: 1}) })
	waitFor(t, "endpoint 1 gone", func() bool { return len(e.lxcMap.snapshot()) == 0 }, e.lxcMap.watch)
}

func key(id identity.NumericIdentity, dir policy.Direction, proto uint8, port uint16) policy.Key {
	plen := uint8(16)
	if port == 0 {
		plen = 0
	}
	return policy.NewKey(id, dir, proto, port, plen)
}

func policyRow(ep uint16, rev uint64, ingress []policy.Entry) *policy.EndpointPolicyRow {
	return &policy.EndpointPolicyRow{EndpointID: ep, Identity: 1234, Policy: &policy.EndpointPolicy{
		Revision: rev,
		Ingress:  policy.DirectionPolicy{Enforcing: true, Entries: ingress},
		Egress:   policy.DirectionPolicy{Entries: []policy.Entry{{Key: key(0, policy.Egress, 0, 0)}}},
	}}
}

func policyMapRow(e *env, ep uint16) (*mapstate.PolicyMap, bool) {
	row, _, ok := e.tables.PolicyMap.Get(e.db.ReadTxn(), mapstate.PolicyEndpointIndex.Query(ep))
	return row, ok
}

// An endpoint's policy goes into its map; a new revision replaces the
// entries by difference without the map ever being empty; the row says
// which revision the map holds. A policy row that disappears while the
// endpoint lives leaves the map alone; the endpoint's deletion removes it.
func TestPolicyReconciler(t *testing.T) {
	e := newEnv(t, 0, nil)
	pm := tableWatch(e.db, statedb.Table[*mapstate.PolicyMap](e.tables.PolicyMap))
	web, dns := key(1000, policy.Ingress, policy.ProtoTCP, 80), key(1001, policy.Ingress, policy.ProtoUDP, 53)
	e.write(func(w statedb.WriteTxn) {
		_, _, _ = e.eps.Insert(w, &endpoints.Endpoint{ID: 5, IPv4: addr("10.1.0.5"), Identity: 1234})
		_, _, _ = e.pols.Insert(w, policyRow(5, 1, []policy.Entry{{Key: web}, {Key: dns, Deny: true}}))
	})
	waitFor(t, "revision 1 realized", func() bool {
		row, ok := policyMapRow(e, 5)
		return ok && row.Realized == 1 && row.Status.Kind == reconciler.StatusDone
	}, pm)
	m, ok := e.polMaps.get(5)
	if !ok {
		t.Fatal("no policy map for endpoint 5")
	}
	got := m.snapshot()
	if len(got) != 3 || got[dns] != (PolicyValue{Deny: true, LPMPrefixLen: 24}) || got[web] != (PolicyValue{LPMPrefixLen: 24}) {
		t.Fatalf("map of endpoint 5 at revision 1: %+v", got)
	}

	// Revision 2: web stays, dns goes, ssh comes.
	ssh := key(1000, policy.Ingress, policy.ProtoTCP, 22)
	e.write(func(w statedb.WriteTxn) {
		_, _, _ = e.pols.Insert(w, policyRow(5, 2, []policy.Entry{{Key: ssh}, {Key: web}}))
	})
	waitFor(t, "revision 2 realized", func() bool {
		row, ok := policyMapRow(e, 5)
		return ok && row.Realized == 2 && row.Revision == 2 && row.Entries == 3
	}, pm)
	got = m.snapshot()
	if _, ok := got[dns]; ok || len(got) != 3 {
		t.Errorf("map of endpoint 5 at revision 2: %+v", got)
	}

	// Revision 3 shares no entry with revision 2.
	r3 := policyRow(5, 3, []policy.Entry{{Key: dns}})
	r3.Policy.Egress = policy.DirectionPolicy{Enforcing: true, Entries: []policy.Entry{{Key: key(1002, policy.Egress, policy.ProtoTCP, 443)}}}
	e.write(func(w statedb.WriteTxn) { _, _, _ = e.pols.Insert(w, r3) })
	waitFor(t, "revision 3 realized", func() bool {
		row, ok := policyMapRow(e, 5)
		return ok && row.Realized == 3
	}, pm)
	if got = m.snapshot(); len(got) != 2 {
		t.Errorf("map of endpoint 5 at revision 3: %+v", got)
	}
	if m.emptied {
		t.Error("the map was empty during an update")
	}

	// The policy row goes, the endpoint stays: the map is kept.
	e.write(func(w statedb.WriteTxn) { _, _, _ = e.pols.Delete(w, policyRow(5, 0, nil)) })
	// The endpoint goes: the row and the map go. (The write above is
	// seen first: changes are consumed in order.)
	e.write(func(w statedb.WriteTxn) { _, _, _ = e.eps.Delete(w, &endpoints.Endpoint{ID: 5}) })
	waitFor(t, "map removed", func() bool {
		_, ok := e.polMaps.get(5)
		_, rowOK := policyMapRow(e, 5)
		return !ok && !rowOK
	}, e.polMaps.watch, pm)
}

// The row stays while its endpoint lives after the policy row is deleted.
func TestPolicyRowKeptWhileEndpointLives(t *testing.T) {
	e := newEnv(t, 0, nil)
	pm := tableWatch(e.db, statedb.Table[*mapstate.PolicyMap](e.tables.PolicyMap))
	e.write(func(w statedb.WriteTxn) {
		_, _, _ = e.eps.Insert(w, &endpoints.Endpoint{ID: 5, IPv4: addr("10.1.0.5"), Identity: 1234})
		_, _, _ = e.pols.Insert(w, policyRow(5, 1, nil))
	})
	waitFor(t, "revision 1 realized", func() bool {
		row, ok := policyMapRow(e, 5)
		return ok && row.Realized == 1
	}, pm)
	e.write(func(w statedb.WriteTxn) {
		_, _, _ = e.pols.Delete(w, policyRow(5, 0, nil))
		// A later change proves the deriver has seen the deletion.
		_, _, _ = e.eps.Insert(w, &endpoints.Endpoint{ID: 6, IPv4: addr("10.1.0.6"), Identity: 1234})
		_, _, _ = e.pols.Insert(w, policyRow(6, 1, nil))
	})
	waitFor(t, "endpoint 6 realized", func() bool {
		row, ok := policyMapRow(e, 6)
		return ok && row.Realized == 1
	}, pm)
	if _, ok := policyMapRow(e, 5); !ok {
		t.Error("the row of endpoint 5 went while the endpoint lives")
	}
	if _, ok := e.polMaps.get(5); !ok {
		t.Error("the map of endpoint 5 went while the endpoint lives")
	}
}

// Full reconciliation removes entries written into a desired map behind
// the reconciler's back and the maps of endpoints that do not exist, and
// keeps the map of an endpoint whose policy is not computed yet.
func TestPolicyReconcilerPrunes(t *testing.T) {
	e := newEnv(t, 20*time.Millisecond, func(e *env, tg targets) {
		// Left from before a restart: a map of a gone endpoint, and one
		// of an endpoint whose policy is not computed yet.
		_, _ = tg.pol.Open(40)
		_, _ = tg.pol.Open(41)
		e.write(func(w statedb.WriteTxn) {
			_, _, _ = e.eps.Insert(w, &endpoints.Endpoint{ID: 5, IPv4: addr("10.1.0.5"), Identity: 1234})
			_, _, _ = e.eps.Insert(w, &endpoints.Endpoint{ID: 41, IPv4: addr("10.1.0.41")})
			_, _, _ = e.pols.Insert(w, policyRow(5, 1, nil))
		})
	})
	pm := tableWatch(e.db, statedb.Table[*mapstate.PolicyMap](e.tables.PolicyMap))
	waitFor(t, "revision 1 realized and map 40 pruned", func() bool {
		row, ok := policyMapRow(e, 5)
		_, stray := e.polMaps.get(40)
		return ok && row.Realized == 1 && !stray
	}, pm, e.polMaps.watch)
	if _, ok := e.polMaps.get(41); !ok {
		t.Error("the map of endpoint 41 (no policy yet) was pruned")
	}
	m, _ := e.polMaps.get(5)
	stray := key(666, policy.Ingress, 0, 0)
	m.put(stray, PolicyValue{})
	waitFor(t, "stray entry pruned", func() bool {
		_, ok := m.snapshot()[stray]
		return !ok
	}, e.polMaps.watch)
	if n := len(m.snapshot()); n != 1 {
		t.Errorf("%d entries after pruning, want 1", n)
	}
}

// A failing policy map update leaves Realized where it was and shows the
// error; the retry realizes the revision.
func TestPolicyReconcilerRetries(t *testing.T) {
	var m PolicyMap
	e := newEnv(t, 0, func(e *env, tg targets) {
		// The endpoint exists before the reconcilers start, so that the
		// first full reconciliation keeps its failing map.
		e.write(func(w statedb.WriteTxn) {
			_, _, _ = e.eps.Insert(w, &endpoints.Endpoint{ID: 5, IPv4: addr("10.1.0.5"), Identity: 1234})
		})
		m, _ = tg.pol.Open(5)
		m.(fakePolicyMap).fail(-1)
	})
	pm := tableWatch(e.db, statedb.Table[*mapstate.PolicyMap](e.tables.PolicyMap))
	e.write(func(w statedb.WriteTxn) { _, _, _ = e.pols.Insert(w, policyRow(5, 3, nil)) })
	waitFor(t, "the failure in the row's status", func() bool {
		row, ok := policyMapRow(e, 5)
		return ok && row.Status.Kind == reconciler.StatusError && strings.Contains(row.Status.Error, errInjected.Error())
	}, pm)
	if row, _ := policyMapRow(e, 5); row.Realized != 0 || row.RealizedAt(3) {
		t.Errorf("realized %d while failing", row.Realized)
	}
	m.(fakePolicyMap).fail(0)
	waitFor(t, "revision 3 realized after a retry", func() bool {
		row, ok := policyMapRow(e, 5)
		return ok && row.Realized == 3 && row.RealizedAt(3) && row.Status.Kind == reconciler.StatusDone
	}, pm)
}

// When the old and the new policy do not fit the map together, the new
// entries go in as room is made by deleting stale ones: the map never
// overflows, is never empty, and ends with exactly the new policy. A
// policy larger than the map is an error in the row's status.
func TestPolicyReconcilerFullMap(t *testing.T) {
	e := newEnv(t, 0, func(e *env, tg targets) { tg.pol.(*fakePolicyMaps).max = 5 })
	pm := tableWatch(e.db, statedb.Table[*mapstate.PolicyMap](e.tables.PolicyMap))
	policyOf := func(rev uint64, base identity.NumericIdentity) *policy.EndpointPolicyRow {
		var entries []policy.Entry
		for i := range identity.NumericIdentity(4) {
			entries = append(entries, policy.Entry{Key: key(base+i, policy.Ingress, policy.ProtoTCP, 80)})
		}
		return policyRow(5, rev, entries) // 4 ingress + the egress allow-all
	}
	e.write(func(w statedb.WriteTxn) {
		_, _, _ = e.eps.Insert(w, &endpoints.Endpoint{ID: 5, IPv4: addr("10.1.0.5"), Identity: 1234})
		_, _, _ = e.pols.Insert(w, policyOf(1, 1000))
	})
	waitFor(t, "revision 1", func() bool { row, ok := policyMapRow(e, 5); return ok && row.Realized == 1 }, pm)
	e.write(func(w statedb.WriteTxn) { _, _, _ = e.pols.Insert(w, policyOf(2, 2000)) })
	waitFor(t, "revision 2", func() bool { row, ok := policyMapRow(e, 5); return ok && row.Realized == 2 }, pm)
	m, _ := e.polMaps.get(5)
	got := m.snapshot()
	if len(got) != 5 {
		t.Errorf("%d entries, want 5: %v", len(got), got)
	}
	for k := range got {
		if k.Identity != 0 && k.Identity < 2000 {
			t.Errorf("stale entry %s left", k)
		}
	}
	if m.emptied {
		t.Error("the map was empty during the update")
	}

	big := policyOf(3, 3000)
	big.Policy.Ingress.Entries = append(big.Policy.Ingress.Entries, policy.Entry{Key: key(3999, policy.Ingress, policy.ProtoTCP, 80)})
	e.write(func(w statedb.WriteTxn) { _, _, _ = e.pols.Insert(w, big) })
	waitFor(t, "revision 3 refused", func() bool {
		row, ok := policyMapRow(e, 5)
		return ok && row.Status.Kind == reconciler.StatusError && strings.Contains(row.Status.Error, ErrPolicyTooLarge.Error())
	}, pm)
	if row, _ := policyMapRow(e, 5); row.Realized != 2 {
		t.Errorf("realized %d after a refused revision, want 2", row.Realized)
	}
}

// The endpoints map: an entry written behind the reconciler's back is
// pruned, and a failing write is retried until the row is Done.
func TestEndpointsReconcilerPrunesAndRetries(t *testing.T) {
	e := newEnv(t, 20*time.Millisecond, nil)
	lxc := tableWatch(e.db, statedb.Table[*mapstate.Endpoint](e.tables.LXC))
	e.lxcMap.fail(-1)
	e.write(func(w statedb.WriteTxn) {
		_, _, _ = e.eps.Insert(w, &endpoints.Endpoint{ID: 1, IPv4: addr("10.1.0.1"), HostIfIndex: 11, Identity: 1234})
	})
	status := func() reconciler.Status {
		row, _, ok := e.tables.LXC.Get(e.db.ReadTxn(), mapstate.EndpointIPIndex.Query(addr("10.1.0.1")))
		if !ok {
			return reconciler.Status{}
		}
		return row.Status
	}
	waitFor(t, "the failure in the row's status", func() bool {
		s := status()
		return s.Kind == reconciler.StatusError && strings.Contains(s.Error, errInjected.Error())
	}, lxc)
	e.lxcMap.fail(0)
	waitFor(t, "done after a retry", func() bool { return status().Kind == reconciler.StatusDone }, lxc)
	e.lxcMap.put(addr("10.9.9.9"), EndpointInfo{EndpointID: 99})
	waitFor(t, "stray entry pruned", func() bool {
		_, ok := e.lxcMap.snapshot()[addr("10.9.9.9")]
		return !ok
	}, e.lxcMap.watch)
	if got := e.lxcMap.snapshot(); len(got) != 1 || got[addr("10.1.0.1")].EndpointID != 1 {
		t.Errorf("after pruning: %+v", got)
	}
}
