package scale

import (
	"strings"
	"testing"
	"time"
)

// TestBudgetCheck: a result within the CI budget passes; a leak, a slow
// ipcache or a missed sample each fail it.
func TestBudgetCheck(t *testing.T) {
	good := func() *Result {
		return &Result{Config: CIConfig(ModeCEP), HeapBefore: 8 << 20, HeapAfter: 8<<20 + 2000*6<<10,
			RSSBefore: 64 << 20, RSSAfter: 64<<20 + 2000*12<<10, Changes: 1000, ChurnWindow: 10 * time.Second,
			ChurnCPU: 1, IPCache: Latencies{N: 200, P50: 5 * time.Millisecond, P99: 40 * time.Millisecond, Max: 90 * time.Millisecond},
			Policy: Latencies{N: 5, P50: 10 * time.Millisecond, Max: 20 * time.Millisecond}, WatchEvents: map[string]float64{"ciliumendpoints": 2000},
			Writes: map[string]int{"operator leases update": 5}, EtcdDBSize: 10 << 20}
	}
	b := CIBudget(ModeCEP)
	if over := b.Check(good()); len(over) != 0 {
		t.Fatalf("a good result is over budget: %v", over)
	}
	for name, tc := range map[string]struct {
		spoil func(r *Result)
		want  string
	}{
		"leak":   {func(r *Result) { r.HeapAfter += 2000 * 20 << 10 }, "heap per remote endpoint"},
		"slow":   {func(r *Result) { r.IPCache.P99 = 3 * time.Second }, "CEP-to-ipcache p99"},
		"missed": {func(r *Result) { r.IPCacheMissed = 1 }, "never reached"},
		"writes": {func(r *Result) { r.Writes["agent ciliumendpoints update"] = 1000 }, "writes per second"},
	} {
		r := good()
		tc.spoil(r)
		over := b.Check(r)
		if len(over) != 1 || !strings.Contains(over[0], tc.want) {
			t.Errorf("%s: over budget %v, want one finding about %q", name, over, tc.want)
		}
	}
}

// The CES budget follows the Helm chart's steps the run passes: at the
// CI size (101 CiliumNodes) the operator may write 50 slices a second
// and a burst of 100, so a churn window in which it used all of that
// (and renewed its Lease) is within budget, while the 15 writes a second
// the budget of the 10/s step allowed would have failed it; writes past
// the limiter are over.
func TestCESBudgetFollowsChartSteps(t *testing.T) {
	cfg := CIConfig(ModeCES)
	if step := chartStep(cfg.Nodes + 1); step.Limit != 50 || step.Burst != 100 {
		t.Fatalf("the chart's step at the CI size is %+v, want 50/s with bursts of 100", step)
	}
	if step := chartStep(5); step.Limit != 10 || step.Burst != 20 {
		t.Fatalf("the chart's step below 100 nodes is %+v, want 10/s with bursts of 20", step)
	}
	window := 12 * time.Second
	full := func(slices int) *Result {
		return &Result{Config: cfg, Changes: 500, ChurnWindow: window,
			IPCache: Latencies{N: 200, P50: time.Second, P99: 4 * time.Second, Max: 5 * time.Second},
			Policy:  Latencies{N: 5, Max: 20 * time.Millisecond},
			Writes:  map[string]int{"operator ciliumendpointslices update": slices, "operator leases update": 12}}
	}
	limiterMax := 100 + 50*int(window.Seconds())
	b := CIBudget(ModeCES)
	if over := b.Check(full(limiterMax)); len(over) != 0 {
		t.Errorf("the operator writing as fast as the chart's step allows is over budget: %v", over)
	}
	if got := full(limiterMax).WritesPerSecond(); got <= 15 {
		t.Fatalf("%.1f writes/s: the test no longer tells the budgets apart", got)
	}
	if over := b.Check(full(2 * limiterMax)); len(over) != 1 || !strings.Contains(over[0], "writes per second") {
		t.Errorf("twice what the limiter allows: over budget %v, want one finding about writes", over)
	}
	slow := full(limiterMax)
	slow.IPCache.P99 = 45 * time.Second
	if over := b.Check(slow); len(over) != 1 || !strings.Contains(over[0], "p99") {
		t.Errorf("a 45 s p99: over budget %v, want one finding about the p99", over)
	}
}
