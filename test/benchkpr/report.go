package benchkpr

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"time"
)

// Result is a whole run.
type Result struct {
	Config  Config
	Started time.Time
	Took    time.Duration
	Modes   []ModeResult
}

// ModeResult is one mode's figures.
type ModeResult struct {
	Mode  string
	Paths []PathResult
	Sizes []SizeResult
}

// PathResult are a path's per-packet figures, one per round.
type PathResult struct {
	Name                string
	BitsPerSecond       []float64
	RoundTripsPerSecond []float64
}

// SizeResult are the figures with Services Services present.
type SizeResult struct {
	Services int
	// Settled is how long adding the Services took until every node
	// served the one created after them.
	Settled time.Duration
	// Connect is connect latency pod -> ClusterIP -> pod.
	Connect ProbeResult
	// Changes are the times from a backend's addition or removal (the
	// EndpointSlice update sent) until a process of every node saw it,
	// sorted.
	Changes []time.Duration
	Memory  Memory
}

// Memory is resident memory (the larger of the two nodes') and the load
// balancer maps.
type Memory struct {
	AgentRSS     uint64
	KubeProxyRSS uint64
	// Maps are the load balancer's maps by (BPF, truncated) name.
	Maps map[string]MapSize
}

// MapSize is a map's entries, capacity and memory (memlock).
type MapSize struct {
	Entries    int
	MaxEntries int
	Bytes      uint64
}

// median of v; 0 if empty.
func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func (r Result) mode(name string) *ModeResult {
	for i := range r.Modes {
		if r.Modes[i].Mode == name {
			return &r.Modes[i]
		}
	}
	return nil
}

func (m *ModeResult) path(name string) *PathResult {
	if m == nil {
		return nil
	}
	for i := range m.Paths {
		if m.Paths[i].Name == name {
			return &m.Paths[i]
		}
	}
	return nil
}

func (m *ModeResult) size(n int) *SizeResult {
	if m == nil {
		return nil
	}
	for i := range m.Sizes {
		if m.Sizes[i].Services == n {
			return &m.Sizes[i]
		}
	}
	return nil
}

// ratio formats a/b, or "-" when either is missing.
func ratio(a, b float64) string {
	if a == 0 || b == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2fx", a/b)
}

func orDash(ok bool, format string, args ...any) string {
	if !ok {
		return "-"
	}
	return fmt.Sprintf(format, args...)
}

func us(ns int64) float64 { return float64(ns) / 1e3 }

func mib(b uint64) float64 { return float64(b) / (1 << 20) }

// Write prints the report: one markdown table per measure, kube-proxy and
// the replacement side by side, with the aims.
func (r Result) Write(w io.Writer) {
	kp, kpr := r.mode(ModeKubeProxy), r.mode(ModeKPR)
	fmt.Fprintf(w, "\n## make bench-kpr: kube-proxy (nftables) vs cellium's kube-proxy replacement\n\n")
	fmt.Fprintf(w, "Two real nodes (test/realnode, tunnel routing) on this machine, a cluster of its own per mode; client pod on node 1, server pod on node 2;\n")
	fmt.Fprintf(w, "%d rounds of iperf3 -t %d and %d 1-byte round trips per path (medians); %d connects and %d Service changes per size; %d backends per bulk Service. Took %s.\n\n",
		r.Config.Rounds, r.Config.IperfSeconds, r.Config.RoundTrips, r.Config.Connects, r.Config.Changes, r.Config.BackendsPerService, r.Took.Round(time.Second))

	fmt.Fprintf(w, "### Per-packet cost (aim: replacement >= 1.0x kube-proxy, and >= 0.95x the same path without a Service)\n\n")
	fmt.Fprintf(w, "| path | kube-proxy Gbit/s | replacement Gbit/s | ratio | kube-proxy RR/s | replacement RR/s | ratio |\n|---|---|---|---|---|---|---|\n")
	var names []string
	for _, m := range r.Modes {
		for _, p := range m.Paths {
			if !slices.Contains(names, p.Name) {
				names = append(names, p.Name)
			}
		}
	}
	for _, name := range names {
		a, b := kp.path(name), kpr.path(name)
		var abps, bbps, arr, brr float64
		if a != nil {
			abps, arr = median(a.BitsPerSecond), median(a.RoundTripsPerSecond)
		}
		if b != nil {
			bbps, brr = median(b.BitsPerSecond), median(b.RoundTripsPerSecond)
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s | %s |\n", name,
			orDash(a != nil, "%.2f", abps/1e9), orDash(b != nil, "%.2f", bbps/1e9), ratio(bbps, abps),
			orDash(a != nil, "%.0f", arr), orDash(b != nil, "%.0f", brr), ratio(brr, arr))
	}
	for _, pair := range [][2]string{{pathClusterIP, pathPodToPod}, {pathNodePort, pathNodePortNS}} {
		for _, m := range []*ModeResult{kp, kpr} {
			svc, direct := m.path(pair[0]), m.path(pair[1])
			if svc == nil || direct == nil {
				continue
			}
			fmt.Fprintf(w, "\n%s: %s vs %s: throughput %s, RR %s", m.Mode, pair[0], pair[1],
				ratio(median(svc.BitsPerSecond), median(direct.BitsPerSecond)), ratio(median(svc.RoundTripsPerSecond), median(direct.RoundTripsPerSecond)))
		}
	}
	fmt.Fprintf(w, "\n\n### Connect latency pod -> ClusterIP -> pod with N Services present (aim: flat)\n\n")
	fmt.Fprintf(w, "| Services | kube-proxy p50 / p99 µs | replacement p50 / p99 µs |\n|---|---|---|\n")
	for _, n := range r.Config.Sizes {
		a, b := kp.size(n), kpr.size(n)
		fmt.Fprintf(w, "| %d | %s | %s |\n", n,
			orDash(a != nil, "%.0f / %.0f", us(sizeOr(a).Connect.P50), us(sizeOr(a).Connect.P99)),
			orDash(b != nil, "%.0f / %.0f", us(sizeOr(b).Connect.P50), us(sizeOr(b).Connect.P99)))
	}
	fmt.Fprintf(w, "\n### A Service change (a backend added or removed) applied on every node (aim: p99 <= 50 ms, and <= 1/10 of kube-proxy's at 10,000)\n\n")
	fmt.Fprintf(w, "| Services | kube-proxy p50 / p99 / max ms | replacement p50 / p99 / max ms | kube-proxy p99 / replacement p99 | Services present after (s) kube-proxy / replacement |\n|---|---|---|---|---|\n")
	for _, n := range r.Config.Sizes {
		a, b := kp.size(n), kpr.size(n)
		fmt.Fprintf(w, "| %d | %s | %s | %s | %s / %s |\n", n, changes(a), changes(b),
			ratio(ms(percentileOr(a, 99)), ms(percentileOr(b, 99))),
			orDash(a != nil, "%.1f", sizeOr(a).Settled.Seconds()), orDash(b != nil, "%.1f", sizeOr(b).Settled.Seconds()))
	}
	fmt.Fprintf(w, "\n### Memory and maps\n\n")
	fmt.Fprintf(w, "| Services | kube-proxy mode: agent / kube-proxy RSS MiB | replacement: agent RSS MiB | replacement: lb maps entries (capacity, MiB) |\n|---|---|---|---|\n")
	for _, n := range r.Config.Sizes {
		a, b := kp.size(n), kpr.size(n)
		fmt.Fprintf(w, "| %d | %s | %s | %s |\n", n,
			orDash(a != nil, "%.1f / %.1f", mib(sizeOr(a).Memory.AgentRSS), mib(sizeOr(a).Memory.KubeProxyRSS)),
			orDash(b != nil, "%.1f", mib(sizeOr(b).Memory.AgentRSS)), mapsLine(b))
	}
	fmt.Fprintln(w)
}

func sizeOr(s *SizeResult) SizeResult {
	if s == nil {
		return SizeResult{}
	}
	return *s
}

func percentileOr(s *SizeResult, p int) time.Duration {
	if s == nil {
		return 0
	}
	return percentile(s.Changes, p)
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func changes(s *SizeResult) string {
	if s == nil || len(s.Changes) == 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f / %.1f / %.1f", ms(percentile(s.Changes, 50)), ms(percentile(s.Changes, 99)), ms(s.Changes[len(s.Changes)-1]))
}

func mapsLine(s *SizeResult) string {
	if s == nil || len(s.Memory.Maps) == 0 {
		return "-"
	}
	var parts []string
	for _, name := range []string{"cellium_lb4_ser", "cellium_lb4_bac"} {
		if m, ok := s.Memory.Maps[name]; ok {
			parts = append(parts, fmt.Sprintf("%s %d (%d, %.1f)", strings.TrimPrefix(name, "cellium_lb4_"), m.Entries, m.MaxEntries, mib(m.Bytes)))
		}
	}
	return strings.Join(parts, ", ")
}
