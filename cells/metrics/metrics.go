package metrics

import (
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/cilium/statedb"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/cells/hive/httpserve"
	"github.com/cellium/cellium/statedb/reconciler"
)

// Namespace prefixes every cellium metric.
const Namespace = "cellium"

// NewRegistry creates the registry with the Go runtime and process
// collectors.
func NewRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

func registerer(r *prometheus.Registry) prometheus.Registerer { return r }

// ReconcilerMetrics implements reconciler.Metrics with Prometheus.
type ReconcilerMetrics struct {
	ops       *prometheus.CounterVec
	durations *prometheus.HistogramVec
	errors    *prometheus.GaugeVec
}

// NewReconcilerMetrics creates and registers the reconciler metrics.
func NewReconcilerMetrics(reg prometheus.Registerer) (reconciler.Metrics, error) {
	m := &ReconcilerMetrics{
		ops: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace, Subsystem: "reconciler", Name: "operations_total",
			Help: "Reconciler operations by reconciler, operation and outcome (success or error)",
		}, []string{"reconciler", "op", "outcome"}),
		durations: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: Namespace, Subsystem: "reconciler", Name: "operation_duration_seconds",
			Help:    "Duration of reconciler operations",
			Buckets: prometheus.ExponentialBuckets(0.00001, 4, 10),
		}, []string{"reconciler", "op"}),
		errors: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: Namespace, Subsystem: "reconciler", Name: "errors_current",
			Help: "Objects whose reconciliation is currently failing",
		}, []string{"reconciler"}),
	}
	for _, c := range []prometheus.Collector{m.ops, m.durations, m.errors} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register reconciler metrics: %w", err)
		}
	}
	return m, nil
}

// Operation implements reconciler.Metrics.
func (m *ReconcilerMetrics) Operation(name, op string, d time.Duration, err error) {
	outcome := "success"
	if err != nil {
		outcome = "error"
	}
	m.ops.WithLabelValues(name, op, outcome).Inc()
	m.durations.WithLabelValues(name, op).Observe(d.Seconds())
}

// Errors implements reconciler.Metrics.
func (m *ReconcilerMetrics) Errors(name string, n int) {
	m.errors.WithLabelValues(name).Set(float64(n))
}

// hiveCollector reports hook durations, statedb table sizes and module
// health at scrape time.
type hiveCollector struct {
	hooks  hive.HookStats
	db     *statedb.DB
	health hive.HealthReporter

	hookDesc, tableDesc, healthDesc *prometheus.Desc
}

func registerHiveCollectors(reg prometheus.Registerer, hooks hive.HookStats, db *statedb.DB, health hive.HealthReporter) error {
	return reg.Register(&hiveCollector{
		hooks: hooks, db: db, health: health,
		hookDesc: prometheus.NewDesc(Namespace+"_hive_hook_duration_seconds",
			"How long each lifecycle hook took to start or stop", []string{"module", "hook", "phase"}, nil),
		tableDesc: prometheus.NewDesc(Namespace+"_statedb_table_objects",
			"Objects in each statedb table", []string{"table"}, nil),
		healthDesc: prometheus.NewDesc(Namespace+"_module_health",
			"Health of each module: 1 for the level it is at", []string{"module", "level"}, nil),
	})
}

func (c *hiveCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.hookDesc
	ch <- c.tableDesc
	ch <- c.healthDesc
}

func (c *hiveCollector) Collect(ch chan<- prometheus.Metric) {
	for _, h := range c.hooks.Hooks() {
		module := h.Module
		if module == "" {
			module = "hive"
		}
		if h.HasStart {
			ch <- prometheus.MustNewConstMetric(c.hookDesc, prometheus.GaugeValue, h.StartDuration.Seconds(), module, h.Name, "start")
		}
		if h.HasStop && h.StopDuration > 0 {
			ch <- prometheus.MustNewConstMetric(c.hookDesc, prometheus.GaugeValue, h.StopDuration.Seconds(), module, h.Name, "stop")
		}
	}
	txn := c.db.ReadTxn()
	for _, t := range c.db.GetTables(txn) {
		ch <- prometheus.MustNewConstMetric(c.tableDesc, prometheus.GaugeValue, float64(t.NumObjects(txn)), t.Name())
	}
	for _, m := range c.health.Modules() {
		module := m.Module
		if module == "" {
			module = "hive"
		}
		ch <- prometheus.MustNewConstMetric(c.healthDesc, prometheus.GaugeValue, 1, module, string(m.Level))
	}
}

func registerServer(cfg Config, lc hive.Lifecycle, reg *prometheus.Registry, log *slog.Logger) {
	if cfg.PrometheusServeAddr == "" {
		return
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	lc.Append(httpserve.Hook("metrics", func() (net.Listener, error) {
		ln, err := net.Listen("tcp", cfg.PrometheusServeAddr)
		if err != nil {
			return nil, fmt.Errorf("listen on --prometheus-serve-addr=%s: %w", cfg.PrometheusServeAddr, err)
		}
		return ln, nil
	}, mux, log, nil))
}
