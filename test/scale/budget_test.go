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
