package lbsync

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	dpmaps "github.com/cellium/cellium/datapath/maps"
	"github.com/cellium/cellium/statedb/lb"
	"github.com/cellium/cellium/statedb/reconciler"
	"github.com/cellium/cellium/test/privileged"
)

// Environment of TestPrivilegedChangeLatencyAtScale.
const (
	// scaleServicesEnv is the number of Services (default 1,000; the
	// kube-proxy replacement target is 10,000).
	scaleServicesEnv = "CELLIUM_LBSCALE_SERVICES"
	// scaleChangesEnv is the number of single-Service changes timed
	// (default 200).
	scaleChangesEnv = "CELLIUM_LBSCALE_CHANGES"
)

// scaleBackends is the backends of each Service.
const scaleBackends = 10

// opTimes records the reconcilers' operation durations by reconciler and
// operation.
type opTimes struct {
	mu sync.Mutex
	d  map[string][]time.Duration
}

func (o *opTimes) Operation(name, op string, d time.Duration, _ error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.d[name+" "+op] = append(o.d[name+" "+op], d)
}

func (*opTimes) Errors(string, int) {}

func (o *opTimes) count(key string) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.d[key])
}

func (o *opTimes) take(key string) []time.Duration {
	o.mu.Lock()
	defer o.mu.Unlock()
	out := o.d[key]
	delete(o.d, key)
	return out
}

// quantiles formats p50, p99 and max of ds.
func quantiles(ds []time.Duration) string {
	if len(ds) == 0 {
		return "none"
	}
	ds = slices.Clone(ds)
	slices.Sort(ds)
	q := func(p float64) time.Duration { return ds[min(len(ds)-1, int(p*float64(len(ds))))] }
	r := func(d time.Duration) string { return d.Round(10 * time.Microsecond).String() }
	return fmt.Sprintf("n=%d p50=%s p99=%s max=%s", len(ds), r(q(0.5)), r(q(0.99)), r(ds[len(ds)-1]))
}

func scaleEnv(tb testing.TB, name string, def int) int {
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	n, err := strconv.Atoi(s)
	if err != nil || n <= 0 {
		tb.Fatalf("%s=%q: want a positive number", name, s)
	}
	return n
}

// scaleService is Service i: ClusterIP 10.96.<i/256>.<i%256>, port 80.
func scaleService(i int) *corev1.Service {
	ip := netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)}).String()
	return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: fmt.Sprintf("svc%d", i)},
		Spec: corev1.ServiceSpec{ClusterIP: ip, ClusterIPs: []string{ip},
			Ports: []corev1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80}}}}
}

// scaleSlice is the slice of Service i with n endpoints at
// 10.128.0.0/9 addresses of its own, port 8080.
func scaleSlice(i, n int) *discoveryv1.EndpointSlice {
	s := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: fmt.Sprintf("svc%d-x", i),
		Labels: map[string]string{discoveryv1.LabelServiceName: fmt.Sprintf("svc%d", i)}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr("http"), Protocol: ptr(corev1.ProtocolTCP), Port: ptr(int32(8080))}}}
	for e := range n {
		a := uint32(10)<<24 | 1<<23 | uint32(i*(scaleBackends+1)+e)
		ip := netip.AddrFrom4([4]byte{byte(a >> 24), byte(a >> 16), byte(a >> 8), byte(a)})
		s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{Addresses: []string{ip.String()},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr(true)}})
	}
	return s
}

// TestPrivilegedChangeLatencyAtScale runs the deriver and both
// reconcilers against real (pinned, temporary) BPF maps holding
// CELLIUM_LBSCALE_SERVICES Services of 10 backends each, with full
// reconciliations back to back, and times how long a one-backend change
// of one Service takes to reach the services map while they run. It
// prints the prune and full-pass round durations and the change latency
// (p50, p99, max) and fails if the maps end up not matching the tables.
// At the kube-proxy replacement target (about 10 s; figures in
// Documentation/operations/kube-proxy-replacement.md):
//
//	sudo CELLIUM_REQUIRE_PRIVILEGED=1 CELLIUM_LBSCALE_SERVICES=10000 \
//	  go test ./datapath/lbsync -run TestPrivilegedChangeLatencyAtScale -v -count=1
func TestPrivilegedChangeLatencyAtScale(t *testing.T) {
	privileged.Require(t)
	defer goleak.VerifyNone(t)
	nSvc := scaleEnv(t, scaleServicesEnv, 1000)
	nChanges := scaleEnv(t, scaleChangesEnv, 200)
	if nSvc > 1<<16 {
		t.Fatalf("%s=%d: at most 65536", scaleServicesEnv, nSvc)
	}

	dir := filepath.Join(t.TempDir(), "bpffs")
	if err := dpmaps.EnsureBPFFS(dir); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(dir, 0); err != nil {
			t.Errorf("unmount %s: %v", dir, err)
		}
	})
	mapMax := 1 << 18 // 2 x (Services x 11 entries) with room for the banks
	for mapMax < 2*nSvc*(scaleBackends+2) {
		mapMax *= 2
	}
	m, err := dpmaps.OpenLBWith(dir, dpmaps.LBOptions{MapMax: mapMax})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()

	tt := newTables(t)
	tt.MaxBackendID, tt.MaxServiceEntries = uint32(mapMax-1), mapMax
	ops := &opTimes{d: map[string][]time.Duration{}}
	d := NewDeriver(tt.Tables, nil)
	fc := FrontendsConfigWithRanges(tt.Tables, PinnedServices{m.Services}, PinnedAffinityMatch{m.AffinityMatch},
		PinnedSourceRange{m.SourceRange})
	bc := BackendsConfig(tt.Tables, PinnedBackends{m.Backends})
	// Full reconciliations back to back: a change always meets one.
	fc.FullInterval, bc.FullInterval = 100*time.Millisecond, 100*time.Millisecond
	fc.Metrics, bc.Metrics = ops, ops
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
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { d.Run(ctx, nopHealth{}) })
	wg.Go(func() { fr.Run(ctx, nopHealth{}) })
	wg.Go(func() { br.Run(ctx, nopHealth{}) })
	defer func() { cancel(); wg.Wait() }()

	t0 := time.Now()
	for lo := 0; lo < nSvc; lo += 1000 {
		wtxn := tt.DB.WriteTxn(tt.svcs, tt.slices)
		for i := lo; i < min(lo+1000, nSvc); i++ {
			_, _, _ = tt.svcs.Insert(wtxn, scaleService(i))
			_, _, _ = tt.slices.Insert(wtxn, scaleSlice(i, scaleBackends))
		}
		if lo+1000 >= nSvc {
			tt.svcs.RegisterInitializer(wtxn, "test")(wtxn)
			tt.slices.RegisterInitializer(wtxn, "test")(wtxn)
		}
		wtxn.Commit()
	}
	done := func() bool {
		n := 0
		for f := range tt.Frontends.All(tt.DB.ReadTxn()) {
			if f.Status.Kind != reconciler.StatusDone {
				return false
			}
			n++
		}
		return n == nSvc
	}
	for !done() {
		if time.Since(t0) > 10*time.Minute {
			t.Fatal("the frontends are not all Done after 10 minutes")
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("%d Services x %d backends in the maps after %s", nSvc, scaleBackends, time.Since(t0).Round(time.Millisecond))
	// Let a few full passes with pruning run over the whole table.
	for ops.count(FrontendsReconciler+" prune") < 3 || ops.count(BackendsReconciler+" prune") < 3 {
		time.Sleep(50 * time.Millisecond)
	}
	ops.take(FrontendsReconciler + " prune")
	ops.take(BackendsReconciler + " prune")
	ops.take(FrontendsReconciler + " update")
	ops.take(BackendsReconciler + " update")

	// One change at a time: a random Service loses its last backend, the
	// next change gives it back (a new backend ID).
	rng := rand.New(rand.NewPCG(1, 2))
	nBackends := make([]int, nSvc)
	for i := range nBackends {
		nBackends[i] = scaleBackends
	}
	var lat, gains []time.Duration
	i := 0
	for c := range nChanges {
		time.Sleep(time.Duration(rng.IntN(20)) * time.Millisecond)
		if c%2 == 0 {
			i = rng.IntN(nSvc)
			nBackends[i]--
		} else {
			nBackends[i]++
		}
		fe := lb.L4Addr{Addr: netip.MustParseAddr(scaleService(i).Spec.ClusterIP), Port: 80, Proto: lb.TCP}
		began := time.Now()
		wtxn := tt.DB.WriteTxn(tt.slices)
		_, _, _ = tt.slices.Insert(wtxn, scaleSlice(i, nBackends[i]))
		wtxn.Commit()
		for {
			f, _, w, ok := tt.Frontends.GetWatch(tt.DB.ReadTxn(), lb.FrontendAddressIndex.Query(fe))
			if ok && len(f.Backends) == nBackends[i] && f.Status.Kind == reconciler.StatusDone {
				break
			}
			select {
			case <-w:
			case <-time.After(time.Minute):
				t.Fatalf("frontend %v: not Done with %d backends after a minute", fe, nBackends[i])
			}
		}
		lat = append(lat, time.Since(began))
		if nBackends[i] == scaleBackends {
			// A new backend: the frontend waits for the backends map.
			gains = append(gains, time.Since(began))
		}
		v, err := m.Services.Lookup(dpmaps.ServiceSlot{Frontend: fe})
		if err != nil || int(v.Count) != nBackends[i] {
			t.Fatalf("frontend %v Done but slot 0 is %+v, %v; want count %d", fe, v, err, nBackends[i])
		}
	}
	t.Logf("prune %s: %s", FrontendsReconciler, quantiles(ops.take(FrontendsReconciler+" prune")))
	t.Logf("prune %s: %s", BackendsReconciler, quantiles(ops.take(BackendsReconciler+" prune")))
	for _, name := range []string{FrontendsReconciler, BackendsReconciler} {
		for _, op := range []string{"prune-round", "full-round"} {
			if ds := ops.take(name + " " + op); len(ds) > 0 {
				t.Logf("%s %s: %s", op, name, quantiles(ds))
			}
		}
	}
	t.Logf("change latency while full passes run: %s", quantiles(lat))
	t.Logf("of which a backend gained: %s", quantiles(gains))

	// Stopped, the maps hold the tables: a slot 0 per frontend with its
	// count, and nothing else beside the slots.
	// (The last change's backend deletion may still be on its way.)
	time.Sleep(time.Second)
	cancel()
	wg.Wait()
	txn := tt.DB.ReadTxn()
	want := 0
	for f := range tt.Frontends.All(txn) {
		want += 1 + len(f.Backends)
		v, err := m.Services.Lookup(dpmaps.ServiceSlot{Frontend: f.Address})
		if err != nil || int(v.Count) != len(f.Backends) {
			t.Errorf("frontend %v: slot 0 %+v, %v; want count %d", f.Address, v, err, len(f.Backends))
		}
	}
	have, err := PinnedServices{m.Services}.Dump()
	if err != nil {
		t.Fatal(err)
	}
	if len(have) != want {
		t.Errorf("services map holds %d entries, the tables want %d", len(have), want)
	}
	haveBE, err := PinnedBackends{m.Backends}.Dump()
	if err != nil {
		t.Fatal(err)
	}
	if n := tt.Backends.NumObjects(txn); len(haveBE) != n {
		t.Errorf("backends map holds %d entries, the table %d", len(haveBE), n)
	}
}
