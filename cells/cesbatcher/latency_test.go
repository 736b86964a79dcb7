package cesbatcher

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	"github.com/cellium/cellium/api/cilium.io/v2alpha1"
	ciliumclient "github.com/cellium/cellium/api/client/clientset/versioned/typed/cilium.io/v2alpha1"
	"github.com/cellium/cellium/cells/hive/hivetest"
	"github.com/cellium/cellium/cells/k8s/k8stest"
)

// slowClient passes slice writes (create, update, delete) to the fake
// clientset after latency, as an API server that takes that long to
// answer. Several writes may be in flight at once: the delay is outside
// the fake, whose reactors run one call at a time.
type slowClient struct {
	ciliumclient.CiliumEndpointSliceInterface
	latency time.Duration

	inFlight, maxInFlight, writes atomic.Int64
	// written, if set, is called with each slice written and when its
	// write returned.
	written func(*v2alpha1.CiliumEndpointSlice, time.Time)

	mu    sync.Mutex
	calls []call
}

// call is one write: its verb, and when it began and returned.
type call struct {
	verb       string
	begin, end time.Time
}

func newSlowClient(cs *k8stest.Clientset, latency time.Duration) *slowClient {
	return &slowClient{CiliumEndpointSliceInterface: cs.Cilium().CiliumV2alpha1().CiliumEndpointSlices(), latency: latency}
}

func (c *slowClient) CiliumEndpointSlices() ciliumclient.CiliumEndpointSliceInterface { return c }

// begin counts a write in flight and waits out the latency; the returned
// func ends the write.
func (c *slowClient) begin(verb string) func() {
	began := time.Now()
	n := c.inFlight.Add(1)
	for m := c.maxInFlight.Load(); n > m && !c.maxInFlight.CompareAndSwap(m, n); m = c.maxInFlight.Load() {
	}
	time.Sleep(c.latency)
	return func() {
		c.mu.Lock()
		c.calls = append(c.calls, call{verb: verb, begin: began, end: time.Now()})
		c.mu.Unlock()
		c.inFlight.Add(-1)
		c.writes.Add(1)
	}
}

// log returns the writes made so far.
func (c *slowClient) log() []call {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.calls)
}

func (c *slowClient) done(ces *v2alpha1.CiliumEndpointSlice, err error) {
	if err == nil && c.written != nil {
		c.written(ces, time.Now())
	}
}

func (c *slowClient) Create(ctx context.Context, ces *v2alpha1.CiliumEndpointSlice, opts metav1.CreateOptions) (*v2alpha1.CiliumEndpointSlice, error) {
	end := c.begin("create")
	defer end()
	got, err := c.CiliumEndpointSliceInterface.Create(ctx, ces, opts)
	c.done(got, err)
	return got, err
}

func (c *slowClient) Update(ctx context.Context, ces *v2alpha1.CiliumEndpointSlice, opts metav1.UpdateOptions) (*v2alpha1.CiliumEndpointSlice, error) {
	end := c.begin("update")
	defer end()
	got, err := c.CiliumEndpointSliceInterface.Update(ctx, ces, opts)
	c.done(got, err)
	return got, err
}

func (c *slowClient) Delete(ctx context.Context, name string, opts metav1.DeleteOptions) error {
	end := c.begin("delete")
	defer end()
	return c.CiliumEndpointSliceInterface.Delete(ctx, name, opts)
}

// churnFigures are what churnLatency measures.
type churnFigures struct {
	p50, p99, max time.Duration
	samples       int
	writes        int64
	maxInFlight   int64
	window        time.Duration
}

func (f churnFigures) String() string {
	return fmt.Sprintf("CEP change → slice written p50 %v / p99 %v / max %v (%d samples); %d writes in %v (%.1f/s); at most %d in flight",
		f.p50.Round(time.Millisecond), f.p99.Round(time.Millisecond), f.max.Round(time.Millisecond), f.samples,
		f.writes, f.window.Round(time.Millisecond), float64(f.writes)/f.window.Seconds(), f.maxInFlight)
}

// churnLatency runs the scale simulation's CES churn in process: groups
// identities of podsPerGroup pods each (in slices made beforehand, which
// the syncer adopts), the syncer at the chart's 50 writes a second and
// bursts of 100 with its default coalescing, writes taking latency; then
// pods replaced (the old one's CEP deleted, a new one's CEP created, same
// identity) at rate CEP changes a second for d. It measures, for every
// new pod, the time from its CEP to the return of the first slice write
// that holds it.
func churnLatency(t *testing.T, latency time.Duration, groups, podsPerGroup int, rate float64, d time.Duration) churnFigures {
	t.Helper()
	cs := k8stest.NewClientset()
	ip := 0
	nextIP := func() string { ip++; return fmt.Sprintf("10.%d.%d.%d", ip>>16&255, ip>>8&255, ip&255) }
	type pod struct {
		name string
		id   int64
	}
	var pods []pod
	var ceps []*ciliumv2.CiliumEndpoint
	for g := range groups {
		for k := range podsPerGroup {
			p := pod{name: fmt.Sprintf("p%03d-%02d", g, k), id: int64(1000 + g)}
			pods = append(pods, p)
			ceps = append(ceps, cep("a", p.name, p.id, nextIP()))
		}
	}
	e := newSyncEnv(t, cs)
	// The slices exist already (what the operator wrote while the pods
	// were created), and the syncer starts once its table has them.
	b := NewBatcher(100, counter())
	b.Plan(ceps, nil)
	// (In steps: the fake's watch holds at most 100 events.)
	n := 0
	for _, ces := range b.Desired() {
		if _, err := cs.Cilium().CiliumV2alpha1().CiliumEndpointSlices().Create(context.Background(), ces, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if n++; n%50 == 0 || n == len(b.Desired()) {
			k8stest.Eventually(t, "the slice table", func() error {
				if got := e.slices.NumObjects(e.db.ReadTxn()); got != n {
					return fmt.Errorf("%d slices, want %d", got, n)
				}
				return nil
			})
		}
	}
	slow := newSlowClient(cs, latency)
	var (
		mu      sync.Mutex
		pending = map[string]time.Time{}
		lat     []time.Duration
	)
	slow.written = func(ces *v2alpha1.CiliumEndpointSlice, at time.Time) {
		mu.Lock()
		defer mu.Unlock()
		for _, ep := range ces.Endpoints {
			if t0, ok := pending[ep.Name]; ok {
				lat = append(lat, at.Sub(t0))
				delete(pending, ep.Name)
			}
		}
	}
	e.client = slow
	e.delay, e.maxDelay = DefaultDelay, DefaultMaxDelay
	e.set(ceps...)
	e.initCEPs()
	e.run(100)
	// The syncer adopts the slices (no write); give it the time to.
	time.Sleep(time.Second)
	if n := slow.writes.Load(); n != 0 {
		t.Fatalf("%d writes adopting slices that were right", n)
	}

	replacements := int(rate / 2 * d.Seconds())
	interval := time.Duration(float64(time.Second) / (rate / 2))
	order := rand.New(rand.NewPCG(1, 2)).Perm(len(pods))[:replacements]
	start := time.Now()
	for k, j := range order {
		if w := time.Until(start.Add(time.Duration(k) * interval)); w > 0 {
			time.Sleep(w)
		}
		old := pods[j]
		nu := pod{name: old.name + "-r", id: old.id}
		e.del("a", old.name)
		mu.Lock()
		pending[nu.name] = time.Now()
		mu.Unlock()
		e.set(cep("a", nu.name, nu.id, nextIP()))
		pods[j] = nu
	}
	mu.Lock()
	defer mu.Unlock()
	for deadline := time.Now().Add(time.Minute); len(pending) > 0; {
		if time.Now().After(deadline) {
			t.Fatalf("%d new pods in no slice a minute after the churn", len(pending))
		}
		mu.Unlock()
		time.Sleep(10 * time.Millisecond)
		mu.Lock()
	}
	window := time.Since(start)
	slices.Sort(lat)
	q := func(p float64) time.Duration { return lat[min(len(lat)-1, int(p*float64(len(lat))))] }
	return churnFigures{p50: q(0.5), p99: q(0.99), max: lat[len(lat)-1], samples: len(lat),
		writes: slow.writes.Load(), maxInFlight: slow.maxInFlight.Load(), window: window}
}

// TestSyncerChurnLatency prints the CEP change → slice written latency
// of the scale simulation's churn (200 identities of 10 pods, 50 CEP
// changes a second for 10 s, 50 writes a second) with writes taking 20,
// 50 and 80 ms. It takes about a minute: set CELLIUM_CES_LATENCY=1.
func TestSyncerChurnLatency(t *testing.T) {
	if os.Getenv("CELLIUM_CES_LATENCY") == "" {
		t.Skip("a minute of churn; set CELLIUM_CES_LATENCY=1 to print the figures")
	}
	for _, latency := range []time.Duration{20 * time.Millisecond, 50 * time.Millisecond, 80 * time.Millisecond} {
		t.Run(latency.String(), func(t *testing.T) {
			f := churnLatency(t, latency, 200, 10, 50, 10*time.Second)
			t.Logf("writes taking %v: %s", latency, f)
		})
	}
}

// TestSyncerWritesConcurrently: with writes that take 50 ms, a round's
// writes are in flight several at once (one at a time, 50 ms each, the
// latency and not the rate limit would bound the rate: 20 writes a
// second), but never more than writeWorkers.
func TestSyncerWritesConcurrently(t *testing.T) {
	cs := k8stest.NewClientset()
	e := newSyncEnv(t, cs)
	slow := newSlowClient(cs, 50*time.Millisecond)
	e.client = slow
	var want []string
	for i := range 24 {
		e.set(cep("a", fmt.Sprintf("x%02d", i), int64(1000+i), fmt.Sprintf("10.0.0.%d", i+1)))
		want = append(want, fmt.Sprintf("a: x%02d=%d", i, 1000+i))
	}
	e.initCEPs()
	e.run(10)
	e.waitShape("24 slices", want...)
	if got := slow.maxInFlight.Load(); got < writeWorkers/2 || got > writeWorkers {
		t.Errorf("at most %d writes in flight at once, want %d to %d", got, writeWorkers/2, writeWorkers)
	}
	t.Logf("24 creates, at most %d in flight", slow.maxInFlight.Load())
}

// TestSyncerConcurrentWritesKeepTheRate: writes in flight together still
// pass the limiter one token each: in any span of time the writes that
// began number at most the burst plus the rate times the span.
func TestSyncerConcurrentWritesKeepTheRate(t *testing.T) {
	cs := k8stest.NewClientset()
	e := newSyncEnv(t, cs)
	e.rateLimits = `[{"nodes":0,"limit":20,"burst":5}]`
	slow := newSlowClient(cs, 20*time.Millisecond)
	e.client = slow
	var want []string
	for i := range 30 {
		e.set(cep("a", fmt.Sprintf("x%02d", i), int64(1000+i), fmt.Sprintf("10.0.0.%d", i+1)))
		want = append(want, fmt.Sprintf("a: x%02d=%d", i, 1000+i))
	}
	e.initCEPs()
	e.run(10)
	e.waitShape("30 slices", want...)
	calls := slow.log()
	slices.SortFunc(calls, func(x, y call) int { return x.begin.Compare(y.begin) })
	for i := range calls {
		for j := i; j < len(calls); j++ {
			span := calls[j].begin.Sub(calls[i].begin)
			if n, allowed := j-i+1, 5+int(20*span.Seconds())+1; n > allowed {
				t.Fatalf("%d writes began within %v, want at most %d (burst 5, 20/s)", n, span, allowed)
			}
		}
	}
	if got := slow.maxInFlight.Load(); got < 2 {
		t.Errorf("at most %d writes in flight, want several", got)
	}
}

// TestSyncerMovesAddBeforeRemove: endpoints that all change identity at
// once are written into their new slices before any write takes them out
// of the old ones, though the writes of each kind go several at once.
func TestSyncerMovesAddBeforeRemove(t *testing.T) {
	cs := k8stest.NewClientset()
	e := newSyncEnv(t, cs)
	slow := newSlowClient(cs, 20*time.Millisecond)
	e.client = slow
	var old, moved, want []string
	// Two endpoints a slice: each old slice keeps one endpoint (an update
	// that only removes) or loses both (a delete).
	for i := range 24 {
		e.set(cep("a", fmt.Sprintf("x%02d", i), 1000, fmt.Sprintf("10.0.0.%d", i+1)))
		old = append(old, fmt.Sprintf("x%02d=1000", i))
	}
	e.initCEPs()
	e.run(2)
	var shape []string
	for i := 0; i < len(old); i += 2 {
		shape = append(shape, "a: "+old[i]+","+old[i+1])
	}
	e.waitShape("12 slices", shape...)
	before := len(slow.log())
	var changed []*ciliumv2.CiliumEndpoint
	for i := range 24 {
		if i%4 == 3 {
			want = append(want, "a: "+old[i]) // stays; its partner leaves
			continue
		}
		changed = append(changed, cep("a", fmt.Sprintf("x%02d", i), 2000, fmt.Sprintf("10.0.0.%d", i+1)))
		moved = append(moved, fmt.Sprintf("x%02d=2000", i))
	}
	e.set(changed...)
	for i := 0; i < len(moved); i += 2 {
		want = append(want, "a: "+moved[i]+","+moved[i+1])
	}
	slices.Sort(want)
	e.waitShape("the endpoints moved", want...)
	calls := slow.log()[before:]
	var lastAdd, firstRemove time.Time
	adds := 0
	for _, c := range calls {
		switch c.verb {
		case "create":
			adds++
			if c.end.After(lastAdd) {
				lastAdd = c.end
			}
		default:
			if firstRemove.IsZero() || c.begin.Before(firstRemove) {
				firstRemove = c.begin
			}
		}
	}
	if adds != 9 || len(calls) != 9+12 {
		t.Fatalf("writes %+v: want 9 creates, 6 updates and 6 deletes", calls)
	}
	if !firstRemove.After(lastAdd) {
		t.Errorf("a write that removes entries began %v before the last create returned", lastAdd.Sub(firstRemove))
	}
	if got := slow.maxInFlight.Load(); got < 2 {
		t.Errorf("at most %d writes in flight, want several", got)
	}
}

// TestCoalesceCountsFromTheChange: the wait for quiet endpoints ends
// MaxDelay after since (the first change waited for, which may have come
// during the last round's writes), not MaxDelay after the wait began: a
// round that took longer than MaxDelay is followed by the next at once,
// even while the endpoints keep changing.
func TestCoalesceCountsFromTheChange(t *testing.T) {
	e := newSyncEnv(t, k8stest.NewClientset())
	e.initCEPs()
	s, err := NewSyncer(DefaultConfig, Tables{DB: e.db, CEPs: e.ceps, Slices: e.slices, Nodes: e.nodes},
		e.cs.Cilium().CiliumV2alpha1(), hivetest.Logger(t), &k8stest.HealthRecorder{})
	if err != nil {
		t.Fatal(err)
	}
	s.Delay, s.MaxDelay = time.Second, 2*time.Second
	// Endpoints change every 100 ms: never quiet for Delay.
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	wg.Go(func() {
		for i := 0; ctx.Err() == nil; i++ {
			e.set(cep("a", "x", int64(1000+i%2), "10.0.0.1"))
			time.Sleep(100 * time.Millisecond)
		}
	})
	began := time.Now()
	if !s.coalesce(ctx, began.Add(-5*time.Second)) {
		t.Fatal("coalesce ended early")
	}
	if took := time.Since(began); took > s.Delay/2 {
		t.Errorf("coalesce waited %v for a change 5 s before, want no wait (MaxDelay %v)", took, s.MaxDelay)
	}
	// From a change now: MaxDelay.
	began = time.Now()
	if !s.coalesce(ctx, began) {
		t.Fatal("coalesce ended early")
	}
	if took := time.Since(began); took < s.MaxDelay {
		t.Errorf("coalesce waited %v under churn, want MaxDelay %v", took, s.MaxDelay)
	}
}
