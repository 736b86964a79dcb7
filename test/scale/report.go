package scale

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"
)

// Cilium's published figures, for the table's last column: its
// scalability report (Documentation/operations/performance/scalability/
// report.rst in Cilium's source; 1,000 nodes, 50,000 pods, CRD mode).
const (
	ciliumMemPerEndpoint = "10.5 KiB per pod (scalability report)"
	ciliumPolicy         = "< 600 ms to enforce (scalability report)"
)

// Table prints the results (one column each, usually the cep and ces
// runs of one size) as one markdown table, each run's setup line above.
func Table(results ...*Result) string {
	var b strings.Builder
	for _, r := range results {
		fmt.Fprintf(&b, "Setup (%s): %s.\n", r.Config.Mode, r.Config.Setup())
	}
	b.WriteString("\n| Figure |")
	for _, r := range results {
		fmt.Fprintf(&b, " %s |", strings.ToUpper(string(r.Config.Mode)))
	}
	b.WriteString(" Aim | Cilium |\n|---|")
	for range results {
		b.WriteString("---|")
	}
	b.WriteString("---|---|\n")
	row := func(name, aim, cilium string, f func(r *Result) string) {
		fmt.Fprintf(&b, "| %s |", name)
		for _, r := range results {
			fmt.Fprintf(&b, " %s |", f(r))
		}
		fmt.Fprintf(&b, " %s | %s |\n", aim, cilium)
	}
	row("Objects created (setup time)", "", "", func(r *Result) string {
		return fmt.Sprintf("%s; ipcache complete %s later", round(r.Setup), round(r.Converged))
	})
	row("Agent memory per remote endpoint, Go heap in use", "≤ 5 KiB", ciliumMemPerEndpoint, func(r *Result) string {
		return fmt.Sprintf("%.2f KiB (%.0f → %.0f MiB)", r.HeapPerEndpoint()/1024, r.HeapBefore/(1<<20), r.HeapAfter/(1<<20))
	})
	row("Agent memory per remote endpoint, Go heap live (after a GC)", "", "", func(r *Result) string {
		return fmt.Sprintf("%.2f KiB (%.0f → %.0f MiB)", r.LivePerEndpoint()/1024, r.LiveBefore/(1<<20), r.LiveAfter/(1<<20))
	})
	row("Agent memory per remote endpoint, RSS", "", "", func(r *Result) string {
		return fmt.Sprintf("%.2f KiB (%.0f → %.0f MiB)", r.RSSPerEndpoint()/1024, r.RSSBefore/(1<<20), r.RSSAfter/(1<<20))
	})
	row("Agent CPU per 1,000 remote endpoint changes (idle subtracted)", "", "", func(r *Result) string {
		return fmt.Sprintf("%.0f ms (%d changes; idle %.1f%% of a core)", r.CPUPer1000()*1000, r.Changes, r.IdleCPU*100)
	})
	latency := "Remote pod's CEP write → agent's ipcache entry, p50 / p99 / max"
	if slices.ContainsFunc(results, func(r *Result) bool { return r.Config.Mode == ModeKVStore }) {
		latency = "Remote pod's CEP write (kvstore mode: its ipcache key's etcd put) → agent's ipcache entry (kvstore mode: of source kvstore), p50 / p99 / max"
	}
	row(latency, "", "", func(r *Result) string {
		s := fmt.Sprintf("%s / %s / %s (%d samples)", ms(r.IPCache.P50), ms(r.IPCache.P99), ms(r.IPCache.Max), r.IPCache.N)
		if r.IPCacheMissed > 0 {
			s += fmt.Sprintf(", %d missed", r.IPCacheMissed)
		}
		return s
	})
	row("Policy change → agent's desired policy map state, p50 / max", "", ciliumPolicy, func(r *Result) string {
		return fmt.Sprintf("%s / %s (%d changes; %d identities, %d selected)", ms(r.Policy.P50), ms(r.Policy.Max),
			r.Policy.N, r.Config.Identities, r.PolicyIdentities)
	})
	row("API server watch events to cellium per second (churn)", "", "", func(r *Result) string {
		return fmt.Sprintf("%.0f, %.2f per change (%s)", r.WatchEventsPerSecond(), r.WatchEventsPerChange(), topCounts(r.WatchEvents))
	})
	row("cellium's API writes per second (churn)", "", "", func(r *Result) string {
		m := map[string]float64{}
		for k, v := range r.Writes {
			m[k] = float64(v)
		}
		return fmt.Sprintf("%.1f (%s)", r.WritesPerSecond(), topCounts(m))
	})
	row("etcd database size (in use)", "", "", func(r *Result) string {
		return fmt.Sprintf("%.0f MiB (%.0f MiB)", r.EtcdDBSize/(1<<20), r.EtcdDBInUse/(1<<20))
	})
	if slices.ContainsFunc(results, func(r *Result) bool { return r.Config.Mode == ModeKVStore }) {
		row("kvstore: keys under cilium/ in etcd (keys' and values' bytes)", "", "", func(r *Result) string {
			if r.Config.Mode != ModeKVStore {
				return "(not used)"
			}
			return fmt.Sprintf("%d keys (%.0f KiB)", r.KVStoreKeys, float64(r.KVStoreBytes)/1024)
		})
	}
	return b.String()
}

// topCounts prints the three largest counts.
func topCounts(m map[string]float64) string {
	keys := slices.SortedFunc(maps.Keys(m), func(a, b string) int {
		if m[a] != m[b] {
			if m[a] > m[b] {
				return -1
			}
			return 1
		}
		return strings.Compare(a, b)
	})
	var parts []string
	for _, k := range keys[:min(3, len(keys))] {
		parts = append(parts, fmt.Sprintf("%s %.0f", k, m[k]))
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}

func round(d time.Duration) string { return d.Round(100 * time.Millisecond).String() }

func ms(d time.Duration) string { return fmt.Sprintf("%.0f ms", float64(d)/float64(time.Millisecond)) }
