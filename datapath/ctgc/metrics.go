package ctgc

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the collector's Prometheus metrics, with Cilium's names
// under cellium's prefix:
//
//	cellium_datapath_conntrack_gc_runs_total{family,status}        passes, completed or uncompleted
//	cellium_datapath_conntrack_gc_entries{family,status}           entries alive and deleted by the last pass
//	cellium_datapath_conntrack_gc_duration_seconds{family,status}  how long passes take
//	cellium_bpf_map_pressure{map_name}                             the map's fill ratio after the last pass
//
// Create them with NewMetrics; a nil *Metrics records nothing.
type Metrics struct {
	runs     *prometheus.CounterVec
	entries  *prometheus.GaugeVec
	duration *prometheus.HistogramVec
	pressure *prometheus.GaugeVec
}

// NewMetrics creates the metrics and registers them in reg.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		runs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "cellium", Subsystem: "datapath", Name: "conntrack_gc_runs_total",
			Help: "Conntrack garbage collection passes, by address family and status (completed, uncompleted)",
		}, []string{"family", "status"}),
		entries: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "cellium", Subsystem: "datapath", Name: "conntrack_gc_entries",
			Help: "Conntrack entries the last garbage collection pass left (alive) and deleted (deleted), by address family",
		}, []string{"family", "status"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "cellium", Subsystem: "datapath", Name: "conntrack_gc_duration_seconds",
			Help:    "Duration of conntrack garbage collection passes, by address family and status",
			Buckets: prometheus.ExponentialBuckets(0.001, 4, 8),
		}, []string{"family", "status"}),
		pressure: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "cellium", Subsystem: "bpf", Name: "map_pressure",
			Help: "Fill ratio of a BPF map (entries / max entries, 0 to 1), for the conntrack map measured by its garbage collection",
		}, []string{"map_name"}),
	}
	for _, c := range []prometheus.Collector{m.runs, m.entries, m.duration, m.pressure} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register conntrack GC metrics: %w", err)
		}
	}
	return m, nil
}

// record records one pass over the map called name (conntrack: the
// conntrack map, else only its pressure).
func (m *Metrics) record(name string, capacity int, conntrack bool, res Result, err error) {
	if m == nil {
		return
	}
	if !conntrack {
		if err == nil {
			m.pressure.WithLabelValues(name).Set(res.Pressure(capacity))
		}
		return
	}
	status := "completed"
	if err != nil {
		status = "uncompleted"
	}
	m.runs.WithLabelValues(Family, status).Inc()
	m.duration.WithLabelValues(Family, status).Observe(res.Duration.Seconds())
	if err != nil {
		return
	}
	m.entries.WithLabelValues(Family, "alive").Set(float64(res.Alive))
	m.entries.WithLabelValues(Family, "deleted").Set(float64(res.Deleted))
	m.pressure.WithLabelValues(name).Set(res.Pressure(capacity))
}
