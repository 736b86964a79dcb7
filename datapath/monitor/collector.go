package monitor

import (
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/cellium/cellium/datapath/maps"
)

// MetricsSource is what Collector reads: *maps.Metrics, the counters of
// cellium_metrics summed over CPUs.
type MetricsSource interface {
	Read() (map[maps.MetricsKey]maps.MetricsValue, error)
}

// Collector is a prometheus.Collector of the datapath's drop and forward
// counters, read from the map at each scrape.
type Collector struct {
	source func() MetricsSource

	dropCount, dropBytes, forwardCount, forwardBytes, readErrors *prometheus.Desc
	errors                                                       atomic.Uint64
}

// NewCollector returns a collector of the map source returns; source may
// return nil (the map is not open yet), and the collector then reports
// no datapath counters.
func NewCollector(source func() MetricsSource) *Collector {
	return &Collector{
		source: source,
		dropCount: prometheus.NewDesc("cellium_drop_count_total",
			"Packets the datapath dropped, by reason and direction", []string{"reason", "direction"}, nil),
		dropBytes: prometheus.NewDesc("cellium_drop_bytes_total",
			"Bytes the datapath dropped, by reason and direction", []string{"reason", "direction"}, nil),
		forwardCount: prometheus.NewDesc("cellium_forward_count_total",
			"Packets the datapath forwarded, by direction", []string{"direction"}, nil),
		forwardBytes: prometheus.NewDesc("cellium_forward_bytes_total",
			"Bytes the datapath forwarded, by direction", []string{"direction"}, nil),
		readErrors: prometheus.NewDesc("cellium_datapath_metrics_read_errors_total",
			"Scrapes that could not read the datapath's counters map", nil, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.dropCount, c.dropBytes, c.forwardCount, c.forwardBytes, c.readErrors} {
		ch <- d
	}
}

type dropLabels struct{ reason, direction string }

// Collect implements prometheus.Collector. Keys that map to the same
// labels (two codes with the same name) are summed.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	defer func() {
		ch <- prometheus.MustNewConstMetric(c.readErrors, prometheus.CounterValue, float64(c.errors.Load()))
	}()
	src := c.source()
	if src == nil {
		return
	}
	counters, err := src.Read()
	if err != nil {
		c.errors.Add(1)
		return
	}
	drops := map[dropLabels]maps.MetricsValue{}
	forwards := map[string]maps.MetricsValue{}
	for k, v := range counters {
		dir := DirectionLabel(k.Dir)
		if k.Reason == maps.ReasonForwarded {
			f := forwards[dir]
			f.Packets += v.Packets
			f.Bytes += v.Bytes
			forwards[dir] = f
			continue
		}
		l := dropLabels{maps.DropReasonName(k.Reason), dir}
		d := drops[l]
		d.Packets += v.Packets
		d.Bytes += v.Bytes
		drops[l] = d
	}
	for l, v := range drops {
		ch <- prometheus.MustNewConstMetric(c.dropCount, prometheus.CounterValue, float64(v.Packets), l.reason, l.direction)
		ch <- prometheus.MustNewConstMetric(c.dropBytes, prometheus.CounterValue, float64(v.Bytes), l.reason, l.direction)
	}
	for dir, v := range forwards {
		ch <- prometheus.MustNewConstMetric(c.forwardCount, prometheus.CounterValue, float64(v.Packets), dir)
		ch <- prometheus.MustNewConstMetric(c.forwardBytes, prometheus.CounterValue, float64(v.Bytes), dir)
	}
}

// DirectionLabel is the direction label of Cilium's drop and forward
// metrics: INGRESS, EGRESS (or UNKNOWN).
func DirectionLabel(d maps.TrafficDir) string {
	switch d {
	case maps.DirIngress:
		return "INGRESS"
	case maps.DirEgress:
		return "EGRESS"
	}
	return "UNKNOWN"
}
