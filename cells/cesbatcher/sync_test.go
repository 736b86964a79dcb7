package cesbatcher

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cilium/statedb"
	"go.uber.org/goleak"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	k8stesting "k8s.io/client-go/testing"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	"github.com/cellium/cellium/api/cilium.io/v2alpha1"
	ciliumclient "github.com/cellium/cellium/api/client/clientset/versioned/typed/cilium.io/v2alpha1"
	"github.com/cellium/cellium/cells/hive/hivetest"
	"github.com/cellium/cellium/cells/k8s/k8stest"
	k8stables "github.com/cellium/cellium/statedb/k8s"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("k8s.io/klog/v2.(*loggingT).flushDaemon"))
}

// syncEnv is a syncer over a fake clientset: the CEP table is written by
// the test, the slice table mirrors the fake's slices.
type syncEnv struct {
	t      *testing.T
	cs     *k8stest.Clientset
	db     *statedb.DB
	ceps   statedb.RWTable[*ciliumv2.CiliumEndpoint]
	slices statedb.RWTable[*v2alpha1.CiliumEndpointSlice]
	nodes  statedb.RWTable[*ciliumv2.CiliumNode]
	// rateLimits, if set, replaces the syncer's one step of 50 writes a
	// second with bursts of 100.
	rateLimits string
	syncer     *Syncer
	runs       int
	// delay and maxDelay, if set, replace the syncer's 10ms and 2s.
	delay, maxDelay time.Duration
	// client, if set, is what the syncer writes through instead of the
	// fake clientset's own client (a slowClient around it).
	client ciliumclient.CiliumEndpointSlicesGetter
}

func newSyncEnv(t *testing.T, cs *k8stest.Clientset) *syncEnv {
	t.Helper()
	e := &syncEnv{t: t, cs: cs, db: statedb.New()}
	var err error
	if e.ceps, err = k8stables.NewCiliumEndpointsTable(e.db); err != nil {
		t.Fatal(err)
	}
	if e.slices, err = k8stables.NewCiliumEndpointSlicesTable(e.db); err != nil {
		t.Fatal(err)
	}
	k8stest.Mirror(t, e.db, e.slices, cs.Cilium().CiliumV2alpha1().CiliumEndpointSlices(), k8stest.Closed())
	if e.nodes, err = k8stables.NewCiliumNodesTable(e.db); err != nil {
		t.Fatal(err)
	}
	k8stest.Mirror(t, e.db, e.nodes, cs.Cilium().CiliumV2().CiliumNodes(), k8stest.Closed())
	return e
}

// run starts a syncer (max entries per slice) until the test ends or the
// returned stop is called.
func (e *syncEnv) run(max int) (stop func()) {
	cfg := DefaultConfig
	cfg.CESMaxCiliumendpointsPerCES = max
	cfg.CESRateLimits = fmt.Sprintf(`[{"nodes":0,"limit":%d,"burst":%d}]`, MaxWriteQPS, MaxWriteBurst)
	if e.rateLimits != "" {
		cfg.CESRateLimits = e.rateLimits
	}
	var client ciliumclient.CiliumEndpointSlicesGetter = e.cs.Cilium().CiliumV2alpha1()
	if e.client != nil {
		client = e.client
	}
	s, err := NewSyncer(cfg, Tables{DB: e.db, CEPs: e.ceps, Slices: e.slices, Nodes: e.nodes}, client,
		hivetest.Logger(e.t), &k8stest.HealthRecorder{})
	if err != nil {
		e.t.Fatal(err)
	}
	e.syncer = s
	s.Delay, s.RetryDelay = 10*time.Millisecond, 20*time.Millisecond
	if e.delay != 0 {
		s.Delay, s.MaxDelay = e.delay, e.maxDelay
	}
	// Names in creation order (ties between slices break by name).
	e.runs++
	n, run := 0, e.runs
	s.NewName = func() string { n++; return fmt.Sprintf("ces-r%d-%03d", run, n) }
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { _ = s.Run(ctx) })
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); wg.Wait() }) }
	e.t.Cleanup(stop)
	return stop
}

func (e *syncEnv) set(ceps ...*ciliumv2.CiliumEndpoint) {
	txn := e.db.WriteTxn(e.ceps)
	for _, c := range ceps {
		if _, _, err := e.ceps.Insert(txn, c); err != nil {
			e.t.Fatal(err)
		}
	}
	txn.Commit()
}

func (e *syncEnv) del(ns, name string) {
	txn := e.db.WriteTxn(e.ceps)
	if _, _, err := e.ceps.Delete(txn, &ciliumv2.CiliumEndpoint{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}); err != nil {
		e.t.Fatal(err)
	}
	txn.Commit()
}

// initCEPs marks the CEP table initialized.
func (e *syncEnv) initCEPs() {
	txn := e.db.WriteTxn(e.ceps)
	done := e.ceps.RegisterInitializer(txn, "test")
	txn.Commit()
	txn = e.db.WriteTxn(e.ceps)
	done(txn)
	txn.Commit()
}

// cluster lists the fake's slices as "name ns: ep=id,ep=id" lines, sorted.
func (e *syncEnv) cluster() []string {
	l, err := e.cs.Cilium().CiliumV2alpha1().CiliumEndpointSlices().List(context.Background(), metav1.ListOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	var out []string
	for _, ces := range l.Items {
		var eps []string
		for _, ep := range ces.Endpoints {
			eps = append(eps, fmt.Sprintf("%s=%d", ep.Name, ep.IdentityID))
		}
		sort.Strings(eps)
		out = append(out, ces.Name+" "+ces.Namespace+": "+strings.Join(eps, ","))
	}
	sort.Strings(out)
	return out
}

// shape is cluster() without the slice names.
func (e *syncEnv) shape() []string {
	var out []string
	for _, l := range e.cluster() {
		_, rest, _ := strings.Cut(l, " ")
		out = append(out, rest)
	}
	sort.Strings(out)
	return out
}

func (e *syncEnv) waitShape(what string, want ...string) {
	e.t.Helper()
	k8stest.Eventually(e.t, what, func() error {
		if got := e.shape(); !slices.Equal(got, want) {
			return fmt.Errorf("slices %q, want %q", got, want)
		}
		return nil
	})
}

// writes counts the fake's slice writes by verb.
func (e *syncEnv) writes() map[string]int {
	n := map[string]int{}
	for _, a := range e.cs.CiliumFake.Actions() {
		if a.GetResource().Resource == "ciliumendpointslices" && a.GetVerb() != "list" && a.GetVerb() != "watch" {
			n[a.GetVerb()]++
		}
	}
	return n
}

func TestSyncer(t *testing.T) {
	e := newSyncEnv(t, k8stest.NewClientset())
	e.set(cep("a", "x1", 1000, "10.0.0.1"), cep("a", "x2", 1000, "10.0.0.2"), cep("a", "x3", 1000, "10.0.0.3"),
		cep("b", "y", 1000, "10.0.0.4"))
	e.initCEPs()
	e.run(2)
	e.waitShape("the first slices", "a: x1=1000,x2=1000", "a: x3=1000", "b: y=1000")

	// x2 changes identity: it moves to a slice of its own (the others
	// stay where they are: slices are not repacked).
	e.set(cep("a", "x2", 2000, "10.0.0.2"))
	e.waitShape("x2 moved", "a: x1=1000", "a: x2=2000", "a: x3=1000", "b: y=1000")

	// y goes: its slice goes.
	e.del("b", "y")
	e.waitShape("y's slice deleted", "a: x1=1000", "a: x2=2000", "a: x3=1000")
	// A new endpoint of identity 1000 fills a slice with room.
	e.set(cep("a", "x4", 1000, "10.0.0.5"))
	e.waitShape("x4 placed", "a: x1=1000,x4=1000", "a: x2=2000", "a: x3=1000")

	// Someone edits a slice: it is put back.
	l, err := e.cs.Cilium().CiliumV2alpha1().CiliumEndpointSlices().List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range l.Items {
		if ces := &l.Items[i]; ces.Endpoints[0].Name == "x2" {
			ces.Endpoints[0].IdentityID = 666
			if _, err := e.cs.Cilium().CiliumV2alpha1().CiliumEndpointSlices().Update(context.Background(), ces, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
	}
	e.waitShape("the edited slice repaired", "a: x1=1000,x4=1000", "a: x2=2000", "a: x3=1000")
	// Someone deletes a slice: it is re-created.
	for _, ces := range l.Items {
		if ces.Endpoints[0].Name == "x1" {
			if err := e.cs.Cilium().CiliumV2alpha1().CiliumEndpointSlices().Delete(context.Background(), ces.Name, metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
		}
	}
	e.waitShape("the deleted slice re-created", "a: x1=1000,x4=1000", "a: x2=2000", "a: x3=1000")
}

// TestSyncerCoalescesABurst: endpoints that arrive one after another
// faster than Delay are written in a round every MaxDelay, not in one
// round per Delay; the last ones once the endpoints are quiet.
func TestSyncerCoalescesABurst(t *testing.T) {
	e := newSyncEnv(t, k8stest.NewClientset())
	e.delay, e.maxDelay = 100*time.Millisecond, 500*time.Millisecond
	e.initCEPs()
	e.run(200)
	var want []string
	began := time.Now()
	for i := range 100 {
		e.set(cep("a", fmt.Sprintf("x%03d", i), 1000, fmt.Sprintf("10.0.%d.%d", i/200, i%200+1)))
		want = append(want, fmt.Sprintf("x%03d=1000", i))
		time.Sleep(10 * time.Millisecond)
	}
	took := time.Since(began)
	e.waitShape("all in one slice", "a: "+strings.Join(want, ","))
	w := e.writes()
	rounds := w["create"] + w["update"]
	// One round per MaxDelay of the burst, one at its end, and one for
	// the time the test's goroutine was not scheduled (1 s of -race on
	// a busy machine may be 2); one round per Delay would be ten or more.
	if max := int(took/e.maxDelay) + 3; rounds > max {
		t.Errorf("%d slice writes (%v) for 100 endpoints arriving over %s, want at most %d", rounds, w, took.Round(time.Millisecond), max)
	}
	t.Logf("%d slice writes for 100 endpoints arriving over %s", rounds, took.Round(time.Millisecond))
}

// TestSyncerRestartAdopts: a new syncer (a restarted or new leader) keeps
// the slices it finds and writes nothing when they are right.
func TestSyncerRestartAdopts(t *testing.T) {
	cs := k8stest.NewClientset()
	e := newSyncEnv(t, cs)
	var ceps []*ciliumv2.CiliumEndpoint
	for i := range 7 {
		ceps = append(ceps, cep("a", fmt.Sprintf("x%d", i), 1000, fmt.Sprintf("10.0.0.%d", i+1)))
	}
	e.set(ceps...)
	e.initCEPs()
	stop := e.run(3)
	e.waitShape("the first slices", "a: x0=1000,x1=1000,x2=1000", "a: x3=1000,x4=1000,x5=1000", "a: x6=1000")
	stop()
	before := e.cluster()
	written := e.writes()

	// A new operator: same API server, fresh tables.
	e2 := newSyncEnv(t, cs)
	e2.set(ceps...)
	e2.initCEPs()
	e2.run(3)
	// Prove it has caught up: a new endpoint lands in the one slice with room.
	e2.set(cep("a", "x7", 1000, "10.0.0.8"))
	e2.waitShape("x7 placed", "a: x0=1000,x1=1000,x2=1000", "a: x3=1000,x4=1000,x5=1000", "a: x6=1000,x7=1000")
	after := e2.cluster()
	names := func(lines []string) []string {
		var out []string
		for _, l := range lines {
			n, _, _ := strings.Cut(l, " ")
			out = append(out, n)
		}
		return out
	}
	if !slices.Equal(names(before), names(after)) {
		t.Errorf("slices across the restart: %q -> %q, want the same names", before, after)
	}
	got := e2.writes()
	if got["create"] != written["create"] || got["delete"] != written["delete"] || got["update"] != written["update"]+1 {
		t.Errorf("writes after restart %v, before %v: want exactly one more update", got, written)
	}
}

// TestSyncerRetriesFailedWrites: a failed create is retried.
func TestSyncerRetriesFailedWrites(t *testing.T) {
	cs := k8stest.NewClientset()
	var mu sync.Mutex
	fail := 2
	cs.CiliumFake.PrependReactor("create", "ciliumendpointslices", func(k8stesting.Action) (bool, runtime.Object, error) {
		mu.Lock()
		defer mu.Unlock()
		if fail > 0 {
			fail--
			return true, nil, fmt.Errorf("injected failure")
		}
		return false, nil, nil
	})
	e := newSyncEnv(t, cs)
	e.set(cep("a", "x", 1000, "10.0.0.1"))
	e.initCEPs()
	e.run(10)
	e.waitShape("the slice created after two failures", "a: x=1000")
}

// TestSyncerFailedAddKeepsTheOldEntry: an endpoint moving to another
// slice (its identity changed) whose new slice cannot be written stays in
// its old slice until a retry has written the new one: it is never in no
// slice, so other nodes never drop its address. Before, the round went on
// to its removals after the failed create and took the endpoint out of
// its old slice; it was in none until the retry.
func TestSyncerFailedAddKeepsTheOldEntry(t *testing.T) {
	cs := k8stest.NewClientset()
	var mu sync.Mutex
	failing := false
	fails := 0
	cs.CiliumFake.PrependReactor("create", "ciliumendpointslices", func(k8stesting.Action) (bool, runtime.Object, error) {
		mu.Lock()
		defer mu.Unlock()
		if failing && fails < 3 {
			fails++
			return true, nil, fmt.Errorf("injected failure")
		}
		return false, nil, nil
	})
	e := newSyncEnv(t, cs)
	// x and y share a slice; z is alone in another.
	e.set(cep("a", "x", 1000, "10.0.0.1"), cep("a", "y", 1000, "10.0.0.2"), cep("a", "z", 3000, "10.0.0.3"))
	e.initCEPs()
	e.run(10)
	e.waitShape("two slices", "a: x=1000,y=1000", "a: z=3000")

	// Every state of the cluster from now on must hold x, y and z.
	var violations []string
	watchCtx, stopWatch := context.WithCancel(context.Background())
	defer stopWatch()
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() {
		for watchCtx.Err() == nil {
			in := map[string]bool{}
			for _, l := range e.cluster() {
				_, eps, _ := strings.Cut(l, ": ")
				for _, ep := range strings.Split(eps, ",") {
					name, _, _ := strings.Cut(ep, "=")
					in[name] = true
				}
			}
			for _, n := range []string{"x", "y", "z"} {
				if !in[n] {
					mu.Lock()
					violations = append(violations, fmt.Sprintf("%s in no slice: %q", n, e.cluster()))
					mu.Unlock()
				}
			}
			time.Sleep(time.Millisecond)
		}
	})
	mu.Lock()
	failing = true
	mu.Unlock()
	// x moves to identity 2000 (a new slice, whose create fails three
	// times); z moves to 2000 too (its old slice goes).
	e.set(cep("a", "x", 2000, "10.0.0.1"), cep("a", "z", 2000, "10.0.0.3"))
	e.waitShape("x and z moved once the create went through", "a: x=2000,z=2000", "a: y=1000")
	stopWatch()
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	if fails != 3 {
		t.Fatalf("%d creates failed, want 3", fails)
	}
	if len(violations) > 0 {
		t.Errorf("an endpoint was in no slice (%d times), first: %s", len(violations), violations[0])
	}
}

// TestSyncerFailedAddHoldsRemove: while the write that puts a moving
// endpoint into its new slice fails, the write that takes it out of its
// old slice is not made (the endpoint would be in no slice until the
// retry); once the add succeeds, the remove follows.
func TestSyncerFailedAddHoldsRemove(t *testing.T) {
	cs := k8stest.NewClientset()
	var (
		mu              sync.Mutex
		armed, created  bool
		fail            = 3
		early, attempts int
	)
	cs.CiliumFake.PrependReactor("create", "ciliumendpointslices", func(k8stesting.Action) (bool, runtime.Object, error) {
		mu.Lock()
		defer mu.Unlock()
		if armed && fail > 0 {
			fail--
			attempts++
			return true, nil, fmt.Errorf("injected failure")
		}
		created = created || armed
		return false, nil, nil
	})
	cs.CiliumFake.PrependReactor("update", "ciliumendpointslices", func(k8stesting.Action) (bool, runtime.Object, error) {
		mu.Lock()
		defer mu.Unlock()
		if armed && !created {
			early++
		}
		return false, nil, nil
	})
	e := newSyncEnv(t, cs)
	e.set(cep("a", "x", 1000, "10.0.0.1"), cep("a", "y", 1000, "10.0.0.2"))
	e.initCEPs()
	e.run(10)
	e.waitShape("one slice", "a: x=1000,y=1000")
	mu.Lock()
	armed = true
	mu.Unlock()
	e.set(cep("a", "x", 2000, "10.0.0.1"))
	e.waitShape("x moved after three failed creates", "a: x=2000", "a: y=1000")
	mu.Lock()
	defer mu.Unlock()
	if attempts != 3 {
		t.Fatalf("%d failed creates, want 3", attempts)
	}
	if early > 0 {
		t.Errorf("the old slice was updated %d times while x's new slice was not created: x was in no slice", early)
	}
}
