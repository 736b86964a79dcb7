package nodediscovery

import (
	"fmt"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/cellium/cellium/statedb/nodes"
)

// RefusalStats is what the agent refuses of the CiliumNodes (see
// nodes.RefusalReason).
type RefusalStats struct {
	// Refused is how many addresses and pod CIDRs are refused now.
	Refused map[nodes.RefusalReason]int
	// RefusedTotal is how many times one became refused since the start.
	RefusedTotal map[nodes.RefusalReason]uint64
}

// refusalStats is written by the nodes-table job and read by scrapes.
type refusalStats struct {
	mu      sync.Mutex
	refused map[nodes.RefusalReason]int
	total   map[nodes.RefusalReason]uint64
}

func (s *refusalStats) count(why nodes.RefusalReason) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.total[why]++
}

func (s *refusalStats) set(now map[nodes.RefusalReason]int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	clear(s.refused)
	for k, v := range now {
		s.refused[k] = v
	}
}

func (s *refusalStats) get() RefusalStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := RefusalStats{Refused: map[nodes.RefusalReason]int{}, RefusedTotal: map[nodes.RefusalReason]uint64{}}
	for k, v := range s.refused {
		out.Refused[k] = v
	}
	for k, v := range s.total {
		out.RefusedTotal[k] = v
	}
	return out
}

// registerRefusalMetrics registers cellium_nodes_refused and
// cellium_nodes_refused_total; without a registry it does nothing.
func registerRefusalMetrics(reg prometheus.Registerer, s *refusalStats) error {
	if reg == nil {
		return nil
	}
	c := &refusalCollector{s: s,
		refused: prometheus.NewDesc("cellium_nodes_refused",
			"Addresses and pod CIDRs of CiliumNodes the agent refuses now, by reason", []string{"reason"}, nil),
		total: prometheus.NewDesc("cellium_nodes_refused_total",
			"Times an address or pod CIDR of a CiliumNode became refused, by reason", []string{"reason"}, nil),
	}
	if err := reg.Register(c); err != nil {
		return fmt.Errorf("register nodes metrics: %w", err)
	}
	return nil
}

type refusalCollector struct {
	s              *refusalStats
	refused, total *prometheus.Desc
}

func (c *refusalCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.refused
	ch <- c.total
}

func (c *refusalCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.s.get()
	for _, why := range nodes.RefusalReasons {
		ch <- prometheus.MustNewConstMetric(c.refused, prometheus.GaugeValue, float64(s.Refused[why]), string(why))
		ch <- prometheus.MustNewConstMetric(c.total, prometheus.CounterValue, float64(s.RefusedTotal[why]), string(why))
	}
}
