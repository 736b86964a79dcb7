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
}

func newSlowClient(cs *k8stest.Clientset, latency time.Duration) *slowClient {
	return &slowClient{CiliumEndpointSliceInterface: cs.Cilium().CiliumV2alpha1().CiliumEndpointSlices(), latency: latency}
}

func (c *slowClient) CiliumEndpointSlices() ciliumclient.CiliumEndpointSliceInterface { return c }

// begin counts a write in flight and waits out the latency; the returned
// func ends the write.
func (c *slowClient) begin() func() {
	n := c.inFlight.Add(1)
	for m := c.maxInFlight.Load(); n > m && !c.maxInFlight.CompareAndSwap(m, n); m = c.maxInFlight.Load() {
	}
	time.Sleep(c.latency)
	return func() { c.inFlight.Add(-1); c.writes.Add(1) }
}

func (c *slowClient) done(ces *v2alpha1.CiliumEndpointSlice, err error) {
	if err == nil && c.written != nil {
		c.written(ces, time.Now())
	}
}

func (c *slowClient) Create(ctx context.Context, ces *v2alpha1.CiliumEndpointSlice, opts metav1.CreateOptions) (*v2alpha1.CiliumEndpointSlice, error) {
	end := c.begin()
	defer end()
	got, err := c.CiliumEndpointSliceInterface.Create(ctx, ces, opts)
	c.done(got, err)
	return got, err
}

func (c *slowClient) Update(ctx context.Context, ces *v2alpha1.CiliumEndpointSlice, opts metav1.UpdateOptions) (*v2alpha1.CiliumEndpointSlice, error) {
	end := c.begin()
	defer end()
	got, err := c.CiliumEndpointSliceInterface.Update(ctx, ces, opts)
	c.done(got, err)
	return got, err
}

func (c *slowClient) Delete(ctx context.Context, name string, opts metav1.DeleteOptions) error {
	end := c.begin()
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
