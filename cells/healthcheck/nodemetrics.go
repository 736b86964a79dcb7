package healthcheck

import (
	"fmt"

	"github.com/cilium/statedb"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/cellium/cellium/statedb/health"
)

// nodeMetrics are Cilium's node health metrics: the latency histogram is
// observed by each successful probe, the status gauges are read from the
// node-health table at scrape time.
type nodeMetrics struct {
	cluster, node string
	latency       *prometheus.HistogramVec
	status        *prometheus.Desc
	unreachable   *prometheus.Desc
	unreachableEP *prometheus.Desc
	db            *statedb.DB
	paths         statedb.Table[*health.NodePath]
}

// registerNodeMetrics registers cilium_node_health_connectivity_status,
// cilium_node_health_connectivity_latency_seconds,
// cilium_unreachable_nodes and cilium_unreachable_health_endpoints.
func registerNodeMetrics(reg prometheus.Registerer, cluster, node string, db *statedb.DB, paths statedb.Table[*health.NodePath]) (*nodeMetrics, error) {
	m := &nodeMetrics{cluster: cluster, node: node, db: db, paths: paths,
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "cilium_node_health_connectivity_latency_seconds",
			Help:    "Latency of the last successful probes of other nodes and their health endpoints, in seconds",
			Buckets: []float64{.0001, .0005, .001, .005, .01, .05, .1, .5, 1, 2, 5},
		}, []string{"source_cluster", "source_node_name", "type", "address_type", "protocol"}),
		status: prometheus.NewDesc("cilium_node_health_connectivity_status",
			"Number of other nodes (type node: ICMP to the node) and health endpoints (type endpoint: ICMP and HTTP) by the status of their last probes",
			[]string{"source_cluster", "source_node_name", "type", "status"}, nil),
		unreachable: prometheus.NewDesc("cilium_unreachable_nodes",
			"Number of other nodes that do not answer ICMP", nil, nil),
		unreachableEP: prometheus.NewDesc("cilium_unreachable_health_endpoints",
			"Number of health endpoints of other nodes that do not answer ICMP or HTTP", nil, nil),
	}
	if reg == nil {
		return m, nil
	}
	if err := reg.Register(m.latency); err != nil {
		return nil, fmt.Errorf("register node health metrics: %w", err)
	}
	if err := reg.Register(m); err != nil {
		return nil, fmt.Errorf("register node health metrics: %w", err)
	}
	return m, nil
}

// Describe implements prometheus.Collector.
func (m *nodeMetrics) Describe(ch chan<- *prometheus.Desc) {
	ch <- m.status
	ch <- m.unreachable
	ch <- m.unreachableEP
}

// Collect implements prometheus.Collector.
func (m *nodeMetrics) Collect(ch chan<- prometheus.Metric) {
	counts := StatusCounts(statedb.Collect(m.paths.All(m.db.ReadTxn())))
	for _, typ := range []string{health.PathNode, health.PathEndpoint} {
		for _, st := range []string{StatusReachable, StatusUnreachable, StatusUnknown} {
			ch <- prometheus.MustNewConstMetric(m.status, prometheus.GaugeValue, float64(counts[typ][st]), m.cluster, m.node, typ, st)
		}
	}
	ch <- prometheus.MustNewConstMetric(m.unreachable, prometheus.GaugeValue, float64(counts[health.PathNode][StatusUnreachable]))
	ch <- prometheus.MustNewConstMetric(m.unreachableEP, prometheus.GaugeValue, float64(counts[health.PathEndpoint][StatusUnreachable]))
}

// Values of the status label.
const (
	StatusReachable   = "reachable"
	StatusUnreachable = "unreachable"
	StatusUnknown     = "unknown"
)

// StatusCounts counts, per path type (node, endpoint), the nodes by the
// status of their paths of that type: reachable when every one answered
// its last probe, unreachable when one did not, unknown while one is not
// probed yet.
func StatusCounts(rows []*health.NodePath) map[string]map[string]int {
	type key struct{ node, typ string }
	st := map[key]string{}
	for _, r := range rows {
		k := key{r.Node, r.Type}
		cur, seen := st[k]
		switch {
		case r.Probed && !r.Reachable:
			st[k] = StatusUnreachable
		case !r.Probed && cur != StatusUnreachable:
			st[k] = StatusUnknown
		case !seen:
			st[k] = StatusReachable
		}
	}
	out := map[string]map[string]int{health.PathNode: {}, health.PathEndpoint: {}}
	for k, s := range st {
		if out[k.typ] == nil {
			out[k.typ] = map[string]int{}
		}
		out[k.typ][s]++
	}
	return out
}
