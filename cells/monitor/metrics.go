package monitor

import (
	"github.com/prometheus/client_golang/prometheus"

	hub "github.com/cellium/cellium/statedb/monitor"
)

// hubCollector reports the hub's counters at scrape time.
type hubCollector struct {
	hub                          *hub.Hub
	published, lost, subscribers *prometheus.Desc
}

func registerMetrics(reg prometheus.Registerer, h *hub.Hub) error {
	return reg.Register(&hubCollector{
		hub: h,
		published: prometheus.NewDesc("cellium_monitor_events_total",
			"Datapath events published to the monitor hub", nil, nil),
		lost: prometheus.NewDesc("cellium_monitor_events_lost_total",
			"Events monitor clients lost because they read too slowly (summed over clients)", nil, nil),
		subscribers: prometheus.NewDesc("cellium_monitor_clients",
			"Open monitor streams (GET /v1/monitor)", nil, nil),
	})
}

func (c *hubCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.published
	ch <- c.lost
	ch <- c.subscribers
}

func (c *hubCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.hub.Stats()
	ch <- prometheus.MustNewConstMetric(c.published, prometheus.CounterValue, float64(st.Published))
	ch <- prometheus.MustNewConstMetric(c.lost, prometheus.CounterValue, float64(st.Lost))
	ch <- prometheus.MustNewConstMetric(c.subscribers, prometheus.GaugeValue, float64(st.Subscribers))
}
