package cesbatcher

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/pflag"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/cells/hive/hivetest"
	"github.com/cellium/cellium/cells/k8s/k8stest"
)

func mustParse(t *testing.T, s string) RateLimits {
	t.Helper()
	rl, err := ParseRateLimits(s)
	if err != nil {
		t.Fatal(err)
	}
	return rl
}

func TestParseRateLimits(t *testing.T) {
	if got, want := mustParse(t, DefaultRateLimits), (RateLimits{{Nodes: 0, Limit: 10, Burst: 20}}); !slices.Equal(got, want) {
		t.Errorf("default: %v, want %v", got, want)
	}
	if got, want := mustParse(t, ChartRateLimits), (RateLimits{{0, 10, 20}, {100, 50, 100}}); !slices.Equal(got, want) {
		t.Errorf("chart default: %v, want %v", got, want)
	}
	// Unsorted steps are sorted; fractional limits are fine.
	got := mustParse(t, `[{"nodes":500,"limit":50,"burst":100},{"nodes":0,"limit":2.5,"burst":5},{"nodes":100,"limit":20,"burst":40}]`)
	if want := (RateLimits{{0, 2.5, 5}, {100, 20, 40}, {500, 50, 100}}); !slices.Equal(got, want) {
		t.Errorf("unsorted: %v, want %v", got, want)
	}
	for _, c := range []struct{ in, why string }{
		{``, "JSON list"},
		{`{"nodes":0,"limit":10,"burst":20}`, "JSON list"},
		{`[{"nodes":0,"limit":10,"burst":20}`, "JSON list"},
		{`[{"nodes":0,"limit":10,"burst":20}] []`, "more after it"},
		{`[{"nodes":0,"limit":10,"burst":20,"qps":3}]`, `unknown field "qps"`},
		{`[{"nodes":"0","limit":10,"burst":20}]`, "JSON list"},
		{`[]`, "empty"},
		{`[{"nodes":0,"limit":51,"burst":20}]`, "at most 50"},
		{`[{"nodes":0,"limit":10,"burst":101}]`, "at most 100"},
		{`[{"nodes":0,"limit":0,"burst":20}]`, "limit 0 must be greater than 0"},
		{`[{"nodes":0,"limit":-1,"burst":20}]`, "greater than 0"},
		{`[{"nodes":0,"limit":10}]`, "burst 0 must be greater than 0"},
		{`[{"nodes":-1,"limit":10,"burst":20}]`, "must not be negative"},
		{`[{"nodes":5,"limit":10,"burst":20},{"nodes":5,"limit":20,"burst":40}]`, "two steps for 5 nodes"},
	} {
		_, err := ParseRateLimits(c.in)
		if err == nil || !strings.Contains(err.Error(), "--ces-rate-limits") || !strings.Contains(err.Error(), c.why) {
			t.Errorf("%s: err = %v, want one naming --ces-rate-limits and saying %q", c.in, err, c.why)
		}
	}
}

func TestRateLimitsFor(t *testing.T) {
	chart := mustParse(t, ChartRateLimits)
	for _, c := range []struct {
		nodes int
		want  RateLimit
	}{
		{0, RateLimit{0, 10, 20}},
		{99, RateLimit{0, 10, 20}},
		{100, RateLimit{100, 50, 100}},
		{1000, RateLimit{100, 50, 100}},
	} {
		if got := chart.For(c.nodes); got != c.want {
			t.Errorf("%d nodes: %+v, want %+v", c.nodes, got, c.want)
		}
	}
	// Below the smallest step its rate applies (as in Cilium).
	three := mustParse(t, `[{"nodes":5,"limit":1,"burst":1},{"nodes":10,"limit":2,"burst":2},{"nodes":20,"limit":3,"burst":3}]`)
	for nodes, want := range map[int]float64{0: 1, 4: 1, 5: 1, 9: 1, 10: 2, 19: 2, 20: 3, 1 << 20: 3} {
		if got := three.For(nodes).Limit; got != want {
			t.Errorf("%d nodes: limit %v, want %v", nodes, got, want)
		}
	}
}

// permitted counts the writes the limiter lets through in window, asking
// every 10 ms of its fake clock from *now on, and moves *now past it.
func permitted(w *writeLimiter, now *time.Time, window time.Duration) int {
	n := 0
	end := now.Add(window)
	for ; now.Before(end); *now = now.Add(10 * time.Millisecond) {
		for w.lim.AllowN(*now, 1) {
			n++
		}
	}
	return n
}

// TestWriteLimiterFollowsNodes: the writes the limiter permits in 10 s
// (of a fake clock) go from 10 a second with bursts of 20 to 50 a second
// with bursts of 100 when the cluster reaches 100 nodes, and back.
func TestWriteLimiterFollowsNodes(t *testing.T) {
	now := time.Unix(1_000_000, 0)
	w := newWriteLimiter(mustParse(t, ChartRateLimits), hivetest.Logger(t))
	w.now = func() time.Time { return now }
	// The bucket starts full: the burst, then the rate.
	if got := permitted(w, &now, 10*time.Second); got < 119 || got > 121 {
		t.Errorf("0 nodes: %d writes in 10 s, want 20 + 10/s = 120", got)
	}
	if w.SetNodes(99) {
		t.Error("99 nodes changed the step")
	}
	if got := permitted(w, &now, 10*time.Second); got < 99 || got > 101 {
		t.Errorf("99 nodes: %d writes in 10 s, want 10/s = 100", got)
	}
	if !w.SetNodes(100) {
		t.Error("100 nodes did not change the step")
	}
	if got, want := w.Current(), (RateLimit{100, 50, 100}); got != want {
		t.Errorf("step %+v, want %+v", got, want)
	}
	if got := permitted(w, &now, 10*time.Second); got < 499 || got > 501 {
		t.Errorf("100 nodes: %d writes in 10 s, want 50/s = 500", got)
	}
	// Idle, the bucket fills to the new burst.
	now = now.Add(time.Minute)
	if !w.lim.AllowN(now, 100) {
		t.Error("100 nodes: a burst of 100 refused")
	}
	if w.SetNodes(1000) {
		t.Error("1000 nodes changed the step")
	}
	// Nodes go: back to the first step.
	if !w.SetNodes(50) {
		t.Error("50 nodes did not change the step back")
	}
	now = now.Add(time.Minute)
	if w.lim.AllowN(now, 21) {
		t.Error("50 nodes: a burst of 21 allowed")
	}
	if got := permitted(w, &now, 10*time.Second); got < 119 || got > 121 {
		t.Errorf("back at 50 nodes: %d writes in 10 s, want 20 + 10/s = 120", got)
	}
}

// TestSyncerRateFollowsCiliumNodes: the syncer's write rate follows the
// CiliumNodes of the cluster as they come and go, while it writes slices.
func TestSyncerRateFollowsCiliumNodes(t *testing.T) {
	e := newSyncEnv(t, k8stest.NewClientset())
	e.rateLimits = ChartRateLimits
	e.set(cep("a", "x", 1000, "10.0.0.1"))
	e.initCEPs()
	e.run(10)
	e.waitShape("the first slice", "a: x=1000")
	waitLimit := func(what string, want RateLimit) {
		t.Helper()
		k8stest.Eventually(t, what, func() error {
			got := e.syncer.WriteLimit()
			lim := e.syncer.limiter.lim
			if got != want || lim.Limit() != rateOf(want) || lim.Burst() != want.Burst {
				return fmt.Errorf("step %+v, bucket %v/s burst %d, want %+v", got, lim.Limit(), lim.Burst(), want)
			}
			return nil
		})
	}
	waitLimit("the step for no nodes", RateLimit{0, 10, 20})
	reg := prometheus.NewRegistry()
	if err := registerRateMetrics(reg, e.syncer.WriteLimit); err != nil {
		t.Fatal(err)
	}
	gauges := func() string {
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, mf := range mfs {
			out = append(out, fmt.Sprintf("%s=%v", mf.GetName(), mf.GetMetric()[0].GetGauge().GetValue()))
		}
		return strings.Join(out, " ")
	}
	if got, want := gauges(), "cellium_ces_write_burst_limit=20 cellium_ces_write_rate_limit=10"; got != want {
		t.Errorf("metrics %s, want %s", got, want)
	}
	api := e.cs.Cilium().CiliumV2().CiliumNodes()
	for i := range 100 {
		if _, err := api.Create(context.Background(), &ciliumv2.CiliumNode{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("n%03d", i)}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	waitLimit("the step for 100 nodes", RateLimit{100, 50, 100})
	if got, want := gauges(), "cellium_ces_write_burst_limit=100 cellium_ces_write_rate_limit=50"; got != want {
		t.Errorf("metrics %s, want %s", got, want)
	}
	// Slices are still written at the new rate.
	e.set(cep("b", "y", 1000, "10.0.0.2"))
	e.waitShape("y's slice", "a: x=1000", "b: y=1000")
	if err := api.Delete(context.Background(), "n042", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitLimit("the step for 99 nodes", RateLimit{0, 10, 20})
}

// TestDeprecatedWriteQPSFlags: --ces-write-qps-limit and
// --ces-write-qps-burst still work, as one step for any number of nodes,
// are marked deprecated, and cannot be combined with --ces-rate-limits.
func TestDeprecatedWriteQPSFlags(t *testing.T) {
	steps := func(args ...string) (RateLimits, error) {
		var cfg Config
		if err := hivetest.New(t, args, hive.Module("ces", "CES", hive.Config(DefaultConfig)), hivetest.Capture(&cfg)).Populate(); err != nil {
			return nil, err
		}
		return cfg.RateLimits()
	}
	for _, c := range []struct {
		args []string
		want RateLimits
	}{
		{nil, RateLimits{{0, 10, 20}}},
		{[]string{"--ces-rate-limits=" + ChartRateLimits}, RateLimits{{0, 10, 20}, {100, 50, 100}}},
		{[]string{"--ces-write-qps-limit=50", "--ces-write-qps-burst=100"}, RateLimits{{0, 50, 100}}},
		// The other keeps Cilium 1.18's default.
		{[]string{"--ces-write-qps-limit=30"}, RateLimits{{0, 30, 20}}},
		{[]string{"--ces-write-qps-burst=40"}, RateLimits{{0, 10, 40}}},
	} {
		got, err := steps(c.args...)
		if err != nil || !slices.Equal(got, c.want) {
			t.Errorf("%v: %v, %v; want %v", c.args, got, err, c.want)
		}
	}
	for _, c := range []struct {
		args []string
		why  string
	}{
		{[]string{"--ces-write-qps-limit=50", "--ces-rate-limits=" + ChartRateLimits}, "set only --ces-rate-limits"},
		// Given even with its default value, --ces-rate-limits is set.
		{[]string{"--ces-write-qps-burst=100", "--ces-rate-limits=" + DefaultRateLimits}, "set only --ces-rate-limits"},
		{[]string{"--ces-write-qps-limit=51"}, "--ces-write-qps-limit=51"},
		{[]string{"--ces-write-qps-limit=0"}, "--ces-write-qps-limit=0"},
		{[]string{"--ces-write-qps-burst=101"}, "--ces-write-qps-burst=101"},
		{[]string{`--ces-rate-limits=[{"nodes":0,"limit":10,"burst":20,"x":1}]`}, "--ces-rate-limits"},
	} {
		if _, err := steps(c.args...); err == nil || !strings.Contains(err.Error(), c.why) {
			t.Errorf("%v: err = %v, want one saying %q", c.args, err, c.why)
		}
	}
	fs := pflag.NewFlagSet("", pflag.ContinueOnError)
	DefaultConfig.Flags(fs)
	for _, name := range []string{FlagWriteQPS, FlagWriteBurst} {
		if f := fs.Lookup(name); f == nil || !strings.Contains(f.Deprecated, "--ces-rate-limits") {
			t.Errorf("--%s is not deprecated in favour of --ces-rate-limits", name)
		}
	}
	if f := fs.Lookup(FlagRateLimits); f == nil || f.DefValue != `[{"nodes":0,"limit":10,"burst":20}]` || f.Deprecated != "" {
		t.Errorf("--ces-rate-limits: %+v, want Cilium's default", f)
	}
}
