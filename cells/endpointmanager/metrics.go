package endpointmanager

import (
	"fmt"

	"github.com/cilium/statedb"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/statedb/endpoints"
)

// metricsParams are registerMetrics' inputs.
type metricsParams struct {
	hive.In

	Registerer prometheus.Registerer `optional:"true"`
	DB         *statedb.DB
	Table      statedb.RWTable[*endpoints.Endpoint]
}

// registerMetrics registers cellium_endpoint_state (Cilium's
// cilium_endpoint_state): the endpoints in each state, counted from the
// table at scrape time. `not-ready` endpoints drop their traffic because
// the datapath refused their policy.
func registerMetrics(p metricsParams) error {
	if p.Registerer == nil {
		return nil
	}
	c := &stateCollector{db: p.DB, table: p.Table, desc: prometheus.NewDesc("cellium_endpoint_state",
		"Local endpoints in each state", []string{"endpoint_state"}, nil)}
	if err := p.Registerer.Register(c); err != nil {
		return fmt.Errorf("register endpoint metrics: %w", err)
	}
	return nil
}

type stateCollector struct {
	db    *statedb.DB
	table statedb.Table[*endpoints.Endpoint]
	desc  *prometheus.Desc
}

func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	counts := map[string]int{}
	for ep := range c.table.All(c.db.ReadTxn()) {
		counts[string(ep.State)]++
	}
	for state, n := range counts {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(n), state)
	}
}
