package ipcache

import (
	"fmt"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// TrustStats is what the CiliumEndpoint checks did (see Refusal).
type TrustStats struct {
	// Refused is how many CEPs are refused now, by reason.
	Refused map[Refusal]int
	// RefusedTotal is how many times a CEP became refused (or changed
	// reason) since the start, by reason.
	RefusedTotal map[Refusal]uint64
	// Conflicts is how many addresses have acceptable CEPs that disagree,
	// so that none of them gives the address its identity.
	Conflicts int
}

// trustStats is the deriver's TrustStats, written by its goroutine and read
// by scrapes.
type trustStats struct {
	mu sync.Mutex
	s  TrustStats
}

func newTrustStats() *trustStats {
	return &trustStats{s: TrustStats{Refused: map[Refusal]int{}, RefusedTotal: map[Refusal]uint64{}}}
}

// count notes that a CEP became refused for why.
func (t *trustStats) count(why Refusal) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.s.RefusedTotal[why]++
}

// set replaces the current numbers.
func (t *trustStats) set(refused map[Refusal]int, conflicts int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	clear(t.s.Refused)
	for why, n := range refused {
		if n > 0 {
			t.s.Refused[why] = n
		}
	}
	t.s.Conflicts = conflicts
}

func (t *trustStats) get() TrustStats {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := TrustStats{Refused: map[Refusal]int{}, RefusedTotal: map[Refusal]uint64{}, Conflicts: t.s.Conflicts}
	for k, v := range t.s.Refused {
		out.Refused[k] = v
	}
	for k, v := range t.s.RefusedTotal {
		out.RefusedTotal[k] = v
	}
	return out
}

// registerMetrics registers cellium_ipcache_cep_refused,
// cellium_ipcache_cep_refused_total and cellium_ipcache_cep_conflicts,
// read from the deriver at scrape time. Without a registry (a test hive)
// it does nothing.
func registerMetrics(reg prometheus.Registerer, d *Deriver) error {
	if reg == nil {
		return nil
	}
	c := &trustCollector{
		d: d,
		refused: prometheus.NewDesc("cellium_ipcache_cep_refused",
			"CiliumEndpoints of other nodes whose addresses the ipcache refuses now, by reason", []string{"reason"}, nil),
		refusedTotal: prometheus.NewDesc("cellium_ipcache_cep_refused_total",
			"Times a CiliumEndpoint of another node became refused by the ipcache, by reason", []string{"reason"}, nil),
		conflicts: prometheus.NewDesc("cellium_ipcache_cep_conflicts",
			"Addresses whose acceptable CiliumEndpoints disagree, so that none of them gives the address its identity", nil, nil),
	}
	if err := reg.Register(c); err != nil {
		return fmt.Errorf("register ipcache metrics: %w", err)
	}
	return nil
}

type trustCollector struct {
	d                                *Deriver
	refused, refusedTotal, conflicts *prometheus.Desc
}

func (c *trustCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.refused
	ch <- c.refusedTotal
	ch <- c.conflicts
}

func (c *trustCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.d.Trust()
	for _, why := range Refusals {
		ch <- prometheus.MustNewConstMetric(c.refused, prometheus.GaugeValue, float64(s.Refused[why]), string(why))
		ch <- prometheus.MustNewConstMetric(c.refusedTotal, prometheus.CounterValue, float64(s.RefusedTotal[why]), string(why))
	}
	ch <- prometheus.MustNewConstMetric(c.conflicts, prometheus.GaugeValue, float64(s.Conflicts))
}
