package mapsync

import (
	"github.com/prometheus/client_golang/prometheus"
)

// PolicyCollector is a prometheus.Collector of the policy map reconciler's
// state, read at scrape time:
//
//	cellium_policy_map_overflow_endpoints  endpoints whose policy does not fit their map
//
// Such an endpoint's map fails closed (FailClosed): it drops all traffic
// and is not-ready until its policy fits again.
type PolicyCollector struct {
	ops      *PolicyOps
	overflow *prometheus.Desc
}

// NewPolicyCollector reports on ops.
func NewPolicyCollector(ops *PolicyOps) *PolicyCollector {
	return &PolicyCollector{ops: ops, overflow: prometheus.NewDesc("cellium_policy_map_overflow_endpoints",
		"Endpoints whose policy has more entries than their policy map holds: their map holds the deny entries alone and they drop all traffic",
		nil, nil)}
}

// Describe implements prometheus.Collector.
func (c *PolicyCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.overflow }

// Collect implements prometheus.Collector.
func (c *PolicyCollector) Collect(ch chan<- prometheus.Metric) {
	ch <- prometheus.MustNewConstMetric(c.overflow, prometheus.GaugeValue, float64(len(c.ops.Overflowing())))
}
