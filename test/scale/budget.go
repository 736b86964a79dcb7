package scale

import (
	"fmt"
	"time"

	"github.com/cellium/cellium/cells/cesbatcher"
)

// Budget is the regression check of TestScale: the most each figure may
// be. The limits have headroom over what the CI
// size measures on a shared 2-core machine (Documentation/operations/
// scale.md lists both); zero leaves a figure unchecked.
type Budget struct {
	// HeapPerEndpoint and RSSPerEndpoint, in bytes.
	HeapPerEndpoint, RSSPerEndpoint float64
	// CPUPer1000 is CPU seconds per 1,000 remote endpoint changes.
	CPUPer1000 float64
	// IPCacheP99 bounds the CEP-to-ipcache p99; no sample may be missed.
	IPCacheP99 time.Duration
	// PolicyMax bounds every timed policy change.
	PolicyMax time.Duration
	// WatchEventsPerChange and WritesPerSecond bound the API server load
	// cellium causes during the churn.
	WatchEventsPerChange, WritesPerSecond float64
	// EtcdDBSize, in bytes.
	EtcdDBSize float64
}

// CIBudget is the budget of the CI size (CIConfig) in a mode.
func CIBudget(mode Mode) Budget {
	b := Budget{
		// 5.3-6.1 KiB measured (the aim is 5; the live heap 4.1-4.5
		// KiB), 7.2 KiB once with tests running beside it; 8.1-8.3 KiB
		// before the remote-endpoint diet (branch mem), which this
		// budget would catch coming back.
		HeapPerEndpoint: 8 << 10,
		RSSPerEndpoint:  32 << 10,
		CPUPer1000:      5,
		// The agent learns a CEP within milliseconds; seconds mean it
		// stalls.
		IPCacheP99: 2 * time.Second,
		PolicyMax:  2 * time.Second,
		// The agent and the operator each watch every CEP: 2 events a
		// change.
		WatchEventsPerChange: 3,
		// Only the operator's leader Lease renewals, in CEP mode.
		WritesPerSecond: 2,
		EtcdDBSize:      64 << 20,
	}
	if mode == ModeCES {
		// The operator writes the slices at the Helm chart's
		// --ces-rate-limits steps, as the run passes them: at the CI size
		// (100 simulated CiliumNodes and the agent's own) the step from
		// 100 nodes on, 50 writes a second with bursts of 100, where the
		// flag's default (and this budget before) allowed 10 and 20.
		step := chartStep(CIConfig(ModeCES).Nodes + 1)
		// Under churn a change waits for its slice's turn behind the
		// others'. At 10 writes a second (the step before, and the
		// operator's client limit before --operator-k8s-client-qps) the
		// p99 was 13-14 s, the queue growing through the churn; at 50 a
		// second the operator keeps up with the churn's 50 changes a
		// second and the p99 measured 2.3 s. 10 s is four times that as
		// headroom for a loaded machine, and fails an operator held to
		// 10 writes a second again.
		b.IPCacheP99 = 10 * time.Second
		// The limiter lets through at most its rate over the churn window
		// (at least ChurnDuration) plus one burst: 50 + 100/10 s = 60
		// writes a second at the CI size. The operator's Lease renewals
		// (about 1 a second) and the agent's own CiliumEndpoint patches
		// come on top: 5 a second of headroom for them. More means slice
		// writes past the limiter (or a new writer). At the 10/s step the
		// figure was 10.5; it may now be anything up to the limit, as the
		// operator writes each dirty slice as soon as a token allows.
		b.WritesPerSecond = step.Limit + float64(step.Burst)/CIConfig(ModeCES).ChurnDuration.Seconds() + 5
	}
	return b
}

// chartStep is the step of the Helm chart's default
// ciliumEndpointSlice.rateLimits (the operator's --ces-rate-limits in
// CES mode) for a cluster of nodes CiliumNodes.
func chartStep(nodes int) cesbatcher.RateLimit {
	steps, err := cesbatcher.ParseRateLimits(cesbatcher.ChartRateLimits)
	if err != nil {
		panic(err) // a constant of cesbatcher; its tests parse it
	}
	return steps.For(nodes)
}

// Check returns the figures of r over the budget, each as a sentence.
func (b Budget) Check(r *Result) []string {
	var over []string
	check := func(name string, got, limit float64, unit string) {
		if limit > 0 && got > limit {
			over = append(over, fmt.Sprintf("%s: %.2f %s, budget %.2f %s", name, got, unit, limit, unit))
		}
	}
	check("agent heap per remote endpoint", r.HeapPerEndpoint()/1024, b.HeapPerEndpoint/1024, "KiB")
	check("agent RSS per remote endpoint", r.RSSPerEndpoint()/1024, b.RSSPerEndpoint/1024, "KiB")
	check("agent CPU per 1,000 remote endpoint changes", r.CPUPer1000(), b.CPUPer1000, "s")
	check("CEP-to-ipcache p99", r.IPCache.P99.Seconds(), b.IPCacheP99.Seconds(), "s")
	check("policy change to desired map state, max", r.Policy.Max.Seconds(), b.PolicyMax.Seconds(), "s")
	check("watch events per remote endpoint change", r.WatchEventsPerChange(), b.WatchEventsPerChange, "")
	check("cellium writes per second", r.WritesPerSecond(), b.WritesPerSecond, "/s")
	check("etcd database size", r.EtcdDBSize/(1<<20), b.EtcdDBSize/(1<<20), "MiB")
	if r.IPCacheMissed > 0 {
		over = append(over, fmt.Sprintf("%d sampled pods never reached the ipcache", r.IPCacheMissed))
	}
	if r.IPCache.N == 0 && r.Changes > 0 {
		over = append(over, "no CEP-to-ipcache sample")
	}
	if r.Policy.N == 0 && r.Config.PolicyChanges > 0 {
		over = append(over, "no policy change timed")
	}
	return over
}
