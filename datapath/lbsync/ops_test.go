package lbsync

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/cilium/statedb"
	"go.uber.org/goleak"
	corev1 "k8s.io/api/core/v1"

	"github.com/cellium/cellium/cells/k8s/k8stest"
	dpmaps "github.com/cellium/cellium/datapath/maps"
	"github.com/cellium/cellium/statedb/lb"
	"github.com/cellium/cellium/statedb/reconciler"
)

var errInjected = errors.New("injected failure")

// fakeLB is the services and backends maps in memory. Every write of a
// service slot checks that its backend ID is in the backends map (the
// programs would otherwise find a slot without a backend).
type fakeLB struct {
	mu       sync.Mutex
	services map[dpmaps.ServiceSlot]dpmaps.ServiceValue
	backends map[uint32]lb.L4Addr
	match    map[dpmaps.AffinityMatch]bool
	// log records the writes in order ("match-", "match+", "slot", "count").
	log []string
	// failBackends fails every backends map update while set.
	failBackends bool
	dangling     []string
	// afterWrite, when set, is called after each services map write
	// (Update or Delete call), with the lock held.
	afterWrite func()
}

func newFakeLB() *fakeLB {
	return &fakeLB{services: map[dpmaps.ServiceSlot]dpmaps.ServiceValue{}, backends: map[uint32]lb.L4Addr{},
		match: map[dpmaps.AffinityMatch]bool{}}
}

type fakeMatch struct{ f *fakeLB }

func (m fakeMatch) Update(keys []dpmaps.AffinityMatch) error {
	m.f.mu.Lock()
	defer m.f.mu.Unlock()
	for _, k := range keys {
		m.f.match[k] = true
		m.f.log = append(m.f.log, fmt.Sprintf("match+ %d", k.BackendID))
	}
	return nil
}

func (m fakeMatch) Delete(keys []dpmaps.AffinityMatch) error {
	m.f.mu.Lock()
	defer m.f.mu.Unlock()
	for _, k := range keys {
		delete(m.f.match, k)
		m.f.log = append(m.f.log, fmt.Sprintf("match- %d", k.BackendID))
	}
	return nil
}

func (m fakeMatch) Dump() ([]dpmaps.AffinityMatch, error) {
	m.f.mu.Lock()
	defer m.f.mu.Unlock()
	return slices.Collect(maps.Keys(m.f.match)), nil
}

type fakeServices struct{ f *fakeLB }

func (s fakeServices) Update(keys []dpmaps.ServiceSlot, vals []dpmaps.ServiceValue) error {
	s.f.mu.Lock()
	defer s.f.mu.Unlock()
	for i, k := range keys {
		scope := ""
		if k.Scope == dpmaps.ScopeInt {
			scope = "int "
		}
		if k.Slot > 0 {
			if _, ok := s.f.backends[vals[i].BackendID]; !ok {
				s.f.dangling = append(s.f.dangling, fmt.Sprintf("%v slot %d -> %d", k.Frontend, k.Slot, vals[i].BackendID))
			}
			s.f.log = append(s.f.log, fmt.Sprintf("%sslot %d=%d", scope, k.Slot, vals[i].BackendID))
		} else {
			s.f.log = append(s.f.log, fmt.Sprintf("%scount %d", scope, vals[i].Count))
		}
		s.f.services[k] = vals[i]
	}
	if s.f.afterWrite != nil {
		s.f.afterWrite()
	}
	return nil
}

func (s fakeServices) Delete(keys []dpmaps.ServiceSlot) error {
	s.f.mu.Lock()
	defer s.f.mu.Unlock()
	for _, k := range keys {
		if _, ok := s.f.services[k]; ok && k.Scope == dpmaps.ScopeInt {
			s.f.log = append(s.f.log, fmt.Sprintf("int delete %d", k.Slot))
		}
		delete(s.f.services, k)
	}
	if s.f.afterWrite != nil {
		s.f.afterWrite()
	}
	return nil
}

func (s fakeServices) Lookup(k dpmaps.ServiceSlot) (dpmaps.ServiceValue, bool, error) {
	s.f.mu.Lock()
	defer s.f.mu.Unlock()
	v, ok := s.f.services[k]
	return v, ok, nil
}

func (s fakeServices) Dump() (map[dpmaps.ServiceSlot]dpmaps.ServiceValue, error) {
	s.f.mu.Lock()
	defer s.f.mu.Unlock()
	return maps.Clone(s.f.services), nil
}

type fakeBackends struct{ f *fakeLB }

func (b fakeBackends) Update(ids []uint32, addrs []lb.L4Addr) error {
	b.f.mu.Lock()
	defer b.f.mu.Unlock()
	if b.f.failBackends {
		return errInjected
	}
	for i, id := range ids {
		b.f.backends[id] = addrs[i]
	}
	return nil
}

func (b fakeBackends) Delete(ids []uint32) error {
	b.f.mu.Lock()
	defer b.f.mu.Unlock()
	for _, id := range ids {
		delete(b.f.backends, id)
	}
	return nil
}

func (b fakeBackends) Dump() (map[uint32]lb.L4Addr, error) {
	b.f.mu.Lock()
	defer b.f.mu.Unlock()
	return maps.Clone(b.f.backends), nil
}

// resolved returns what a program would pick from for each frontend:
// frontend -> backend addresses by slot; an error for an inconsistent map.
func (f *fakeLB) resolved() (map[lb.L4Addr][]lb.L4Addr, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[lb.L4Addr][]lb.L4Addr{}
	for k, v := range f.services {
		if k.Slot != 0 || k.Scope != dpmaps.ScopeExt {
			continue
		}
		bs := []lb.L4Addr{}
		for s := uint16(1); s <= v.Count; s++ {
			sv, ok := f.services[dpmaps.ServiceSlot{Frontend: k.Frontend, Slot: s, Bank: bankOf(v)}]
			if !ok {
				return nil, fmt.Errorf("%v: slot %d of %d missing", k.Frontend, s, v.Count)
			}
			a, ok := f.backends[sv.BackendID]
			if !ok {
				return nil, fmt.Errorf("%v: slot %d: backend %d missing", k.Frontend, s, sv.BackendID)
			}
			bs = append(bs, a)
		}
		out[k.Frontend] = bs
	}
	for k := range f.services {
		if _, ok := out[k.Frontend]; !ok {
			return nil, fmt.Errorf("%v: slot %d without slot 0", k.Frontend, k.Slot)
		}
		v0, ok := f.services[dpmaps.ServiceSlot{Frontend: k.Frontend, Scope: k.Scope}]
		if k.Slot > 0 && (!ok || k.Bank != bankOf(v0) || k.Slot > v0.Count) {
			return nil, fmt.Errorf("%v: slot %d of bank %d beside slot 0 %+v", k.Frontend, k.Slot, k.Bank, v0)
		}
	}
	// The affinity matches are exactly the (frontend, backend ID) pairs
	// of the slots.
	want := map[dpmaps.AffinityMatch]bool{}
	for k, v := range f.services {
		if k.Slot != 0 {
			want[dpmaps.AffinityMatch{Frontend: k.Frontend, BackendID: v.BackendID}] = true
		}
	}
	if !maps.Equal(want, f.match) {
		return nil, fmt.Errorf("affinity matches %v, want %v", f.match, want)
	}
	return out, nil
}

type nopHealth struct{}

func (nopHealth) OK(string)              {}
func (nopHealth) Degraded(string, error) {}

// The deriver and both reconcilers against fake maps: the maps come to
// resolve every frontend to its backends, a frontend waits while its
// backends cannot be written (never a slot pointing at a missing
// backend), and a deleted Service leaves empty maps.
func TestReconcilersAgainstFakeMaps(t *testing.T) {
	defer goleak.VerifyNone(t)
	tt := newTables(t)
	f := newFakeLB()
	d := NewDeriver(tt.Tables, nil)
	fc := FrontendsConfig(tt.Tables, fakeServices{f}, fakeMatch{f})
	bc := BackendsConfig(tt.Tables, fakeBackends{f})
	fc.FullInterval, bc.FullInterval = 50*time.Millisecond, 50*time.Millisecond
	fr, err := reconciler.New(tt.DB, fc)
	if err != nil {
		t.Fatal(err)
	}
	br, err := reconciler.New(tt.DB, bc)
	if err != nil {
		t.Fatal(err)
	}
	for _, sub := range []func() error{d.Subscribe, fr.Subscribe, br.Subscribe} {
		if err := sub(); err != nil {
			t.Fatal(err)
		}
	}
	// A stray entry from an earlier run: pruned.
	stray := lb.L4Addr{Addr: mustAddr("10.96.0.99"), Port: 1, Proto: lb.TCP}
	f.services[dpmaps.ServiceSlot{Frontend: stray}] = dpmaps.ServiceValue{Count: 0}
	f.backends[77] = stray
	f.match[dpmaps.AffinityMatch{Frontend: stray, BackendID: 77}] = true

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { d.Run(ctx, nopHealth{}) })
	wg.Go(func() { fr.Run(ctx, nopHealth{}) })
	wg.Go(func() { br.Run(ctx, nopHealth{}) })
	defer func() { cancel(); wg.Wait() }()

	f.mu.Lock()
	f.failBackends = true
	f.mu.Unlock()
	wtxn := tt.DB.WriteTxn(tt.svcs, tt.slices)
	_, _, _ = tt.svcs.Insert(wtxn, service(1, "http TCP 80", "dns UDP 53"))
	_, _, _ = tt.slices.Insert(wtxn, slice("a", 1, map[int]bool{1: true, 2: true, 3: false}, "http TCP 8080", "dns UDP 5353"))
	_, _, _ = tt.svcs.Insert(wtxn, service(2, "- TCP 443"))
	tt.svcs.RegisterInitializer(wtxn, "test")(wtxn)
	tt.slices.RegisterInitializer(wtxn, "test")(wtxn)
	wtxn.Commit()

	tcp := func(ip string, port uint16) lb.L4Addr {
		return lb.L4Addr{Addr: mustAddr(ip), Port: port, Proto: lb.TCP}
	}
	udp := func(ip string, port uint16) lb.L4Addr {
		return lb.L4Addr{Addr: mustAddr(ip), Port: port, Proto: lb.UDP}
	}
	// Backends fail: only the frontend without backends is written
	// (and the stray entries are pruned once the tables are initialized).
	k8stest.Eventually(t, "the backend-less frontend alone", func() error {
		got, err := f.resolved()
		if err != nil {
			return err
		}
		if want := map[lb.L4Addr][]lb.L4Addr{tcp("10.96.0.2", 443): {}}; !equal(got, want) {
			return fmt.Errorf("maps resolve to %v, want %v", got, want)
		}
		row, _, _ := tt.Frontends.Get(tt.DB.ReadTxn(), lb.FrontendAddressIndex.Query(tcp("10.96.0.1", 80)))
		if row == nil || row.Status.Kind != reconciler.StatusError {
			return fmt.Errorf("frontend 10.96.0.1:80 row %+v, want status Error (backends not ready)", row)
		}
		return nil
	})
	f.mu.Lock()
	f.failBackends = false
	f.mu.Unlock()
	want := map[lb.L4Addr][]lb.L4Addr{
		tcp("10.96.0.1", 80):  {tcp("10.0.0.1", 8080), tcp("10.0.0.2", 8080)},
		udp("10.96.0.1", 53):  {udp("10.0.0.1", 5353), udp("10.0.0.2", 5353)},
		tcp("10.96.0.2", 443): {},
	}
	k8stest.Eventually(t, "every frontend", func() error {
		got, err := f.resolved()
		if err != nil {
			return err
		}
		if !equal(got, want) {
			return fmt.Errorf("maps resolve to %v, want %v", got, want)
		}
		return nil
	})
	// Session affinity switched on: slot 0 of both frontends says so.
	withAffinity := service(1, "http TCP 80", "dns UDP 53")
	withAffinity.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
	withAffinity.Spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: ptr(int32(5))}}
	wtxn = tt.DB.WriteTxn(tt.svcs)
	_, _, _ = tt.svcs.Insert(wtxn, withAffinity)
	wtxn.Commit()
	k8stest.Eventually(t, "session affinity in slot 0", func() error {
		f.mu.Lock()
		defer f.mu.Unlock()
		for _, fe := range []lb.L4Addr{tcp("10.96.0.1", 80), udp("10.96.0.1", 53)} {
			v := f.services[dpmaps.ServiceSlot{Frontend: fe}]
			v.Bank1 = false // the bank is whichever the last write used
			if v != (dpmaps.ServiceValue{Count: 2, Affinity: true, AffinityTimeout: 5}) {
				return fmt.Errorf("%v slot 0 %+v", fe, v)
			}
		}
		return nil
	})
	// Backend 2 goes unready, 4 comes: the slots shrink and grow.
	wtxn = tt.DB.WriteTxn(tt.slices)
	_, _, _ = tt.slices.Insert(wtxn, slice("a", 1, map[int]bool{1: true, 2: false, 4: true, 5: true}, "http TCP 8080"))
	wtxn.Commit()
	want = map[lb.L4Addr][]lb.L4Addr{
		tcp("10.96.0.1", 80):  {tcp("10.0.0.1", 8080), tcp("10.0.0.4", 8080), tcp("10.0.0.5", 8080)},
		udp("10.96.0.1", 53):  {},
		tcp("10.96.0.2", 443): {},
	}
	k8stest.Eventually(t, "the new backends", func() error {
		got, err := f.resolved()
		if err != nil {
			return err
		}
		if !equal(got, want) {
			return fmt.Errorf("maps resolve to %v, want %v", got, want)
		}
		return nil
	})
	// Both Services go: the maps empty.
	wtxn = tt.DB.WriteTxn(tt.svcs)
	_, _, _ = tt.svcs.Delete(wtxn, service(1))
	_, _, _ = tt.svcs.Delete(wtxn, service(2))
	wtxn.Commit()
	k8stest.Eventually(t, "empty maps", func() error {
		f.mu.Lock()
		defer f.mu.Unlock()
		if len(f.services) != 0 || len(f.backends) != 0 || len(f.match) != 0 {
			return fmt.Errorf("services %v, backends %v, affinity matches %v", f.services, f.backends, f.match)
		}
		return nil
	})
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.dangling) > 0 {
		t.Errorf("slots written before their backends: %v", f.dangling)
	}
}

func equal(a, b map[lb.L4Addr][]lb.L4Addr) bool {
	return maps.EqualFunc(a, b, func(x, y []lb.L4Addr) bool { return fmt.Sprint(x) == fmt.Sprint(y) })
}

// Deleting a backend whose ID another backend holds now leaves the map
// entry to the new owner.
func TestBackendDeleteOfReusedID(t *testing.T) {
	tt := newTables(t)
	f := newFakeLB()
	ops := NewBackendOps(fakeBackends{f}, tt.Backends)
	oldB := &lb.Backend{Address: lb.L4Addr{Addr: mustAddr("10.0.0.1"), Port: 80, Proto: lb.TCP}, ID: 5}
	newB := &lb.Backend{Address: lb.L4Addr{Addr: mustAddr("10.0.0.2"), Port: 80, Proto: lb.TCP}, ID: 5}
	wtxn := tt.DB.WriteTxn(tt.Backends)
	_, _, _ = tt.Backends.Insert(wtxn, newB)
	txn := wtxn.Commit()
	ctx := context.Background()
	if err := ops.Update(ctx, txn, newB); err != nil {
		t.Fatal(err)
	}
	if err := ops.Delete(ctx, txn, oldB); err != nil {
		t.Fatal(err)
	}
	if got := f.backends[5]; got != newB.Address {
		t.Fatalf("ID 5 -> %v, want %v", got, newB.Address)
	}
	// Gone from the table: deleted.
	if err := ops.Delete(ctx, tt.DB.ReadTxn(), &lb.Backend{Address: lb.L4Addr{Addr: mustAddr("10.0.0.9"), Port: 80, Proto: lb.TCP}, ID: 9}); err != nil {
		t.Fatal(err)
	}
	wtxn = tt.DB.WriteTxn(tt.Backends)
	_, _, _ = tt.Backends.Delete(wtxn, newB)
	txn = wtxn.Commit()
	if err := ops.Delete(ctx, txn, newB); err != nil {
		t.Fatal(err)
	}
	if _, ok := f.backends[5]; ok {
		t.Fatal("ID 5 still in the map after its backend went")
	}
}

// A frontend's session affinity and timeout reach slot 0; a backend the
// frontend loses loses its affinity match before any slot is rewritten
// (so no affinity entry leads to it from then on), a new one gains it
// before the slots name it; switching affinity off clears the flag; a
// deleted frontend leaves no match behind.
func TestFrontendOpsAffinity(t *testing.T) {
	tt := newTables(t)
	f := newFakeLB()
	ops := NewFrontendOps(fakeServices{f}, fakeMatch{f}, tt.Backends)
	fe := lb.L4Addr{Addr: mustAddr("10.96.0.7"), Port: 80, Proto: lb.TCP}
	be := func(i int) lb.L4Addr {
		return lb.L4Addr{Addr: mustAddr(fmt.Sprintf("10.0.0.%d", i)), Port: 8080, Proto: lb.TCP}
	}
	wtxn := tt.DB.WriteTxn(tt.Backends)
	for i := 1; i <= 3; i++ {
		_, _, _ = tt.Backends.Insert(wtxn, &lb.Backend{Address: be(i), ID: uint32(i), Status: reconciler.Done()})
		f.backends[uint32(i)] = be(i)
	}
	txn := wtxn.Commit()
	ctx := context.Background()
	row := &lb.Frontend{Address: fe, Service: "ns/s", Backends: []lb.L4Addr{be(1), be(2)}, BackendIDs: []uint32{1, 2},
		SessionAffinity: true, AffinityTimeout: 2}
	if err := ops.Update(ctx, txn, row); err != nil {
		t.Fatal(err)
	}
	if v := f.services[dpmaps.ServiceSlot{Frontend: fe}]; v != (dpmaps.ServiceValue{Count: 2, Affinity: true, AffinityTimeout: 2}) {
		t.Errorf("slot 0 %+v, want count 2, affinity, timeout 2", v)
	}
	if _, err := f.resolved(); err != nil {
		t.Fatal(err)
	}
	// Backend 1 goes, 3 comes.
	f.log = nil
	row = &lb.Frontend{Address: fe, Service: "ns/s", Backends: []lb.L4Addr{be(2), be(3)}, BackendIDs: []uint32{2, 3},
		SessionAffinity: true, AffinityTimeout: 2}
	if err := ops.Update(ctx, txn, row); err != nil {
		t.Fatal(err)
	}
	if want := []string{"match- 1", "match+ 2", "match+ 3", "slot 1=2", "slot 2=3", "count 2"}; !slices.Equal(f.log, want) {
		t.Errorf("writes %q, want %q", f.log, want)
	}
	if _, err := f.resolved(); err != nil {
		t.Fatal(err)
	}
	// Affinity off.
	row = &lb.Frontend{Address: fe, Service: "ns/s", Backends: []lb.L4Addr{be(2), be(3)}, BackendIDs: []uint32{2, 3}}
	if err := ops.Update(ctx, txn, row); err != nil {
		t.Fatal(err)
	}
	if v := f.services[dpmaps.ServiceSlot{Frontend: fe}]; v != (dpmaps.ServiceValue{Count: 2}) {
		t.Errorf("slot 0 after affinity off %+v, want count 2 only", v)
	}
	// Deleted (the row names fewer backends than the map holds).
	if err := ops.Delete(ctx, txn, &lb.Frontend{Address: fe, Service: "ns/s"}); err != nil {
		t.Fatal(err)
	}
	if len(f.services) != 0 || len(f.match) != 0 {
		t.Errorf("after delete: services %v, matches %v", f.services, f.match)
	}
}

// A frontend with two scopes (externalTrafficPolicy Local) gets its
// internal scope written before the external scope's slot 0 says it has
// one; when it loses it, slot 0 says so before the internal entries go;
// Prune removes an internal scope no row has; Delete removes both.
func TestFrontendOpsTwoScopes(t *testing.T) {
	tt := newTables(t)
	f := newFakeLB()
	ops := NewFrontendOps(fakeServices{f}, fakeMatch{f}, tt.Backends)
	fe := lb.L4Addr{Addr: mustAddr("192.168.56.11"), Port: 30080, Proto: lb.TCP}
	be := func(i int) lb.L4Addr {
		return lb.L4Addr{Addr: mustAddr(fmt.Sprintf("10.0.0.%d", i)), Port: 8080, Proto: lb.TCP}
	}
	wtxn := tt.DB.WriteTxn(tt.Backends)
	for i := 1; i <= 2; i++ {
		_, _, _ = tt.Backends.Insert(wtxn, &lb.Backend{Address: be(i), ID: uint32(i), Status: reconciler.Done()})
		f.backends[uint32(i)] = be(i)
	}
	txn := wtxn.Commit()
	ctx := context.Background()
	local := &lb.Frontend{Address: fe, Type: lb.TypeNodePort, Service: "ns/s", Local: true, TwoScopes: true,
		Backends: []lb.L4Addr{be(1)}, BackendIDs: []uint32{1},
		IntBackends: []lb.L4Addr{be(1), be(2)}, IntBackendIDs: []uint32{1, 2}}
	if err := ops.Update(ctx, txn, local); err != nil {
		t.Fatal(err)
	}
	if want := []string{"match+ 1", "match+ 2", "int slot 1=1", "int slot 2=2", "int count 2", "slot 1=1", "count 1"}; !slices.Equal(f.log, want) {
		t.Errorf("writes %q, want %q", f.log, want)
	}
	if v := f.services[dpmaps.ServiceSlot{Frontend: fe}]; v != (dpmaps.ServiceValue{Count: 1, NodePort: true, Local: true, TwoScopes: true}) {
		t.Errorf("external slot 0 %+v", v)
	}
	if v := f.services[dpmaps.ServiceSlot{Frontend: fe, Scope: dpmaps.ScopeInt}]; v != (dpmaps.ServiceValue{Count: 2, NodePort: true}) {
		t.Errorf("internal slot 0 %+v", v)
	}
	// externalTrafficPolicy Cluster: one scope with both backends.
	f.log = nil
	cluster := &lb.Frontend{Address: fe, Type: lb.TypeNodePort, Service: "ns/s",
		Backends: []lb.L4Addr{be(1), be(2)}, BackendIDs: []uint32{1, 2}}
	if err := ops.Update(ctx, txn, cluster); err != nil {
		t.Fatal(err)
	}
	if want := []string{"match+ 1", "match+ 2", "slot 1=1", "slot 2=2", "count 2", "int delete 0", "int delete 1", "int delete 2"}; !slices.Equal(f.log, want) {
		t.Errorf("writes %q, want %q", f.log, want)
	}
	if len(f.services) != 3 {
		t.Errorf("services map %v, want slot 0..2 of the external scope", f.services)
	}
	// A stray internal scope (a crash between the writes) is pruned.
	f.services[dpmaps.ServiceSlot{Frontend: fe, Scope: dpmaps.ScopeInt}] = dpmaps.ServiceValue{Count: 1}
	f.services[dpmaps.ServiceSlot{Frontend: fe, Scope: dpmaps.ScopeInt, Slot: 1}] = dpmaps.ServiceValue{BackendID: 2}
	if err := ops.Prune(ctx, txn, func(yield func(*lb.Frontend, statedb.Revision) bool) { yield(cluster, 1) }); err != nil {
		t.Fatal(err)
	}
	if len(f.services) != 3 {
		t.Errorf("after prune %v, want slot 0..2 of the external scope", f.services)
	}
	if err := ops.Update(ctx, txn, local); err != nil {
		t.Fatal(err)
	}
	if err := ops.Delete(ctx, txn, &lb.Frontend{Address: fe, Service: "ns/s"}); err != nil {
		t.Fatal(err)
	}
	if len(f.services) != 0 || len(f.match) != 0 {
		t.Errorf("after delete: services %v, matches %v", f.services, f.match)
	}
}
