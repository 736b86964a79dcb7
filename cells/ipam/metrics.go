package ipam

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/cellium/cellium/cells/hive"
)

// metricsParams are registerMetrics' inputs.
type metricsParams struct {
	hive.In

	Registerer prometheus.Registerer `optional:"true"`
	Allocator  *allocator
}

// registerMetrics registers cellium_ipam_capacity and cellium_ip_addresses
// (Cilium's names), read from the pool at scrape time, and
// cellium_ipam_gc_released_total.
func registerMetrics(p metricsParams) error {
	if p.Registerer == nil {
		return nil
	}
	c := &collector{
		a: p.Allocator,
		capacity: prometheus.NewDesc("cellium_ipam_capacity",
			"Addresses the node's pod CIDRs hold, the router's included", []string{"family"}, nil),
		used: prometheus.NewDesc("cellium_ip_addresses",
			"Allocated addresses, the router's included", []string{"family"}, nil),
		gc: prometheus.NewDesc("cellium_ipam_gc_released_total",
			"Pod addresses the IPAM garbage collector freed because no endpoint used them for --ipam-gc-grace", nil, nil),
	}
	if err := p.Registerer.Register(c); err != nil {
		return fmt.Errorf("register IPAM metrics: %w", err)
	}
	return nil
}

type collector struct {
	a                  *allocator
	capacity, used, gc *prometheus.Desc
}

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.capacity
	ch <- c.used
	ch <- c.gc
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	used, capacity := c.a.stats()
	ch <- prometheus.MustNewConstMetric(c.capacity, prometheus.GaugeValue, float64(capacity), "ipv4")
	ch <- prometheus.MustNewConstMetric(c.used, prometheus.GaugeValue, float64(used), "ipv4")
	ch <- prometheus.MustNewConstMetric(c.gc, prometheus.CounterValue, float64(c.a.gcTotal.Load()))
}
