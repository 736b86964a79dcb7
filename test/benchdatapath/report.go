package benchdatapath

import (
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"
)

// The aims of issue 8, checked in the report.
const (
	AimThroughput  = 0.95                  // cellium / bare TCP throughput
	AimRR          = 1.0                   // cellium / bare request/response rate
	AimPolicyDelay = 50 * time.Millisecond // agent-driven policy update p99
)

// Result is everything one run measured.
type Result struct {
	// Duration and Rounds of the throughput and request/response runs.
	Duration time.Duration
	Rounds   int
	// Variants are bare, stack and redirect, each with one figure per
	// round.
	Variants []Variant
	// MapLatency: policy map written directly (datapath/maps), no agent.
	// AgentLatency: a CNP through the agent's cells.
	MapLatency, AgentLatency Latency
	// Reconcilers are the map reconcilers' throughputs.
	Reconcilers ReconcilerRates
	// LoadBefore and LoadAfter are /proc/loadavg at the start and end.
	LoadBefore, LoadAfter string
	// made are the mount points the run made (namespaces, bpffs), for
	// the test that checks they are gone.
	made []string
}

// Variant is one way of connecting the pods with its per-round figures.
type Variant struct {
	Name string
	// Bps and RR are the TCP throughput (bits/s) and request/response
	// rate (/s) of each round.
	Bps, RR []float64
}

// Latency is one enforcer's policy update timings.
type Latency struct {
	Enforcer string
	latencies
}

func (r *Result) variant(name string) Variant {
	for _, v := range r.Variants {
		if v.Name == name {
			return v
		}
	}
	return Variant{Name: name}
}

// Stat is a summary of durations.
type Stat struct {
	N             int
	P50, P99, Max time.Duration
}

// summarize returns p50, p99 (nearest rank) and the maximum of d.
func summarize(d []time.Duration) Stat {
	s := slices.Clone(d)
	slices.Sort(s)
	st := Stat{N: len(s), P50: percentile(s, 50), P99: percentile(s, 99)}
	if len(s) > 0 {
		st.Max = s[len(s)-1]
	}
	return st
}

func (s Stat) String() string {
	return fmt.Sprintf("p50 %9s  p99 %9s  max %9s  (n=%d)", fmtDur(s.P50), fmtDur(s.P99), fmtDur(s.Max), s.N)
}

// fmtDur prints d with three significant decimals in a fitting unit.
func fmtDur(d time.Duration) string {
	switch {
	case d >= time.Second:
		return fmt.Sprintf("%.3fs", d.Seconds())
	case d >= time.Millisecond:
		return fmt.Sprintf("%.3fms", float64(d)/float64(time.Millisecond))
	default:
		return fmt.Sprintf("%.1fµs", float64(d)/float64(time.Microsecond))
	}
}

// Aim is one aim's check.
type Aim struct {
	What  string
	Value string
	Want  string
	Met   bool
}

// Aims checks the figures against the aims: the medians of the per-round
// ratios of the redirect variant (what the agent loads) to bare, and the
// p99 of the agent-driven policy update in both directions.
func (r *Result) Aims() []Aim {
	bare, redir := r.variant("bare"), r.variant("redirect")
	tp, rr := medianRatio(redir.Bps, bare.Bps), medianRatio(redir.RR, bare.RR)
	deny, allow := summarize(r.AgentLatency.FirstDrop), summarize(r.AgentLatency.FirstPass)
	return []Aim{
		{"TCP throughput, cellium / bare", fmt.Sprintf("%.3fx", tp), fmt.Sprintf(">= %.2fx", AimThroughput), tp >= AimThroughput},
		{"request/response rate, cellium / bare", fmt.Sprintf("%.3fx", rr), fmt.Sprintf(">= %.2fx", AimRR), rr >= AimRR},
		{"agent policy update -> first drop, p99", fmtDur(deny.P99), "<= " + fmtDur(AimPolicyDelay), deny.N > 0 && deny.P99 <= AimPolicyDelay},
		{"agent policy update -> traffic again, p99", fmtDur(allow.P99), "<= " + fmtDur(AimPolicyDelay), allow.N > 0 && allow.P99 <= AimPolicyDelay},
	}
}

// WriteRound prints one round's figures of one variant.
func WriteRound(w io.Writer, round int, name string, bps, rr float64, viaStack uint64) {
	fmt.Fprintf(w, "round %d %-8s throughput %8.2f Gbit/s   request/response %9.0f /s   packets to b through the stack %d\n",
		round, name, bps/1e9, rr, viaStack)
}

// Write prints the summary: the throughput and request/response figures,
// the policy update latencies, the reconcilers' rates and the aims.
func (r *Result) Write(w io.Writer) {
	bare, stack, redir := r.variant("bare"), r.variant("stack"), r.variant("redirect")
	fmt.Fprintf(w, "\n== datapath: %d rounds of %s each, every round runs the variants back to back (every other one in reverse) ==\n", r.Rounds, r.Duration)
	fmt.Fprintf(w, "a = bare routed veths, no programs; b = cellium's programs + policy (stack: packets between the pods\n")
	fmt.Fprintf(w, "through the host stack; redirect: bpf_redirect_peer after both policies, as the agent loads them)\n")
	fmt.Fprintf(w, "                                   a (median)       b stack (median)        b redirect (median)\n")
	fmt.Fprintf(w, "  TCP throughput (iperf3)          %7.2f Gbit/s   %7.2f Gbit/s (%.3fx)   %7.2f Gbit/s (%.3fx)\n",
		median(bare.Bps)/1e9, median(stack.Bps)/1e9, ratio(median(stack.Bps), median(bare.Bps)),
		median(redir.Bps)/1e9, ratio(median(redir.Bps), median(bare.Bps)))
	fmt.Fprintf(w, "  TCP_RR (sockperf ping-pong, 64B) %7.0f /s        %7.0f /s (%.3fx)        %7.0f /s (%.3fx)\n",
		median(bare.RR), median(stack.RR), ratio(median(stack.RR), median(bare.RR)),
		median(redir.RR), ratio(median(redir.RR), median(bare.RR)))
	fmt.Fprintf(w, "  median of the per-round ratios b/a (a and b measured back to back; the figures the aims use):\n")
	fmt.Fprintf(w, "    throughput      b stack %.3fx  b redirect %.3fx\n", medianRatio(stack.Bps, bare.Bps), medianRatio(redir.Bps, bare.Bps))
	fmt.Fprintf(w, "    request/resp.   b stack %.3fx  b redirect %.3fx\n", medianRatio(stack.RR, bare.RR), medianRatio(redir.RR, bare.RR))
	fmt.Fprintf(w, "  per-round ratios b redirect / a, sorted (their spread is the run's noise):\n")
	fmt.Fprintf(w, "    throughput      %s\n", fmtRatios(ratios(redir.Bps, bare.Bps)))
	fmt.Fprintf(w, "    request/resp.   %s\n", fmtRatios(ratios(redir.RR, bare.RR)))

	fmt.Fprintf(w, "\n== policy update -> enforced (UDP stream a -> b, a deny of it applied and removed) ==\n")
	for _, l := range []struct {
		title string
		lat   Latency
		done  string
	}{
		{"through the agent", r.AgentLatency, "agent reports the map holds it"},
		{"policy map written directly, no agent", r.MapLatency, "map update call returned"},
	} {
		fmt.Fprintf(w, "  %s: %s\n", l.title, l.lat.Enforcer)
		fmt.Fprintf(w, "    deny: %-36s %s\n", l.done, summarize(l.lat.Applied))
		fmt.Fprintf(w, "    deny: %-36s %s\n", "update -> first packet dropped", summarize(l.lat.FirstDrop))
		fmt.Fprintf(w, "    allow: %-35s %s\n", "update -> first packet through", summarize(l.lat.FirstPass))
		fmt.Fprintf(w, "    (stream gap %s: the first drop or pass waits for the next datagram)\n", fmtDur(l.lat.StreamGap))
	}

	rc := r.Reconcilers
	fmt.Fprintf(w, "\n== map reconcilers into pinned BPF maps (daemon/bpfmaps as in the agent; median of %d) ==\n", rc.Rounds)
	fmt.Fprintf(w, "  policy map: %d entries replaced by %d others   %10.0f entries/s\n", rc.PolicyEntries, rc.PolicyEntries, rc.PolicyEntriesPerSec)
	fmt.Fprintf(w, "  ipcache:    %d prefixes written               %10.0f prefixes/s\n", rc.IPCachePrefixes, rc.IPCachePrefixesPerSec)

	fmt.Fprintf(w, "\n== aims ==\n")
	for _, a := range r.Aims() {
		verdict := "MISS"
		if a.Met {
			verdict = "PASS"
		}
		fmt.Fprintf(w, "  %-4s %-42s %10s  (aim %s)\n", verdict, a.What, a.Value, a.Want)
	}
	fmt.Fprintf(w, "\nload average (1, 5, 15 min) before %s, after %s. A shared machine is noisy: single rounds vary\n", r.LoadBefore, r.LoadAfter)
	fmt.Fprintf(w, "a lot; trust the per-round ratios, and run more rounds (-rounds) before concluding.\n")
}

// ratios are b[i]/a[i] for the rounds both measured, sorted.
func ratios(b, a []float64) []float64 {
	r := make([]float64, 0, len(a))
	for i := range min(len(a), len(b)) {
		if a[i] > 0 {
			r = append(r, b[i]/a[i])
		}
	}
	slices.Sort(r)
	return r
}

func fmtRatios(r []float64) string {
	parts := make([]string, len(r))
	for i, x := range r {
		parts[i] = fmt.Sprintf("%.2f", x)
	}
	return strings.Join(parts, " ")
}

func ratio(b, a float64) float64 {
	if a <= 0 {
		return 0
	}
	return b / a
}

// loadAvg returns the three load averages of /proc/loadavg.
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}
