package hubble

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/cellium/cellium/statedb/monitor"
)

// metrics are the producer's own counters (Hubble's flow metrics are the
// hubble/metrics sink's).
type metrics struct {
	flows       *prometheus.CounterVec
	byType      map[monitor.Type]prometheus.Counter
	parseErrors prometheus.Counter
	lostEvents  prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		flows: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "cellium_hubble_flows_produced_total",
			Help: "Flows made from datapath events and handed to the Hubble sinks, by event type",
		}, []string{"type"}),
		parseErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "cellium_hubble_parse_errors_total",
			Help: "Datapath events that could not be turned into flows",
		}),
		lostEvents: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "cellium_hubble_lost_events_total",
			Help: "Datapath events lost before they became flows (the flow producer's queue overflowed)",
		}),
		byType: map[monitor.Type]prometheus.Counter{},
	}
	for _, t := range monitor.Types {
		m.byType[t] = m.flows.WithLabelValues(t.String())
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.flows, m.parseErrors, m.lostEvents} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register hubble producer metrics: %w", err)
		}
	}
	return m, nil
}

func (m *metrics) flow(t monitor.Type) {
	if m == nil {
		return
	}
	if c, ok := m.byType[t]; ok {
		c.Inc()
	}
}

func (m *metrics) parseError() {
	if m != nil {
		m.parseErrors.Inc()
	}
}

func (m *metrics) lost(n uint64) {
	if m != nil {
		m.lostEvents.Add(float64(n))
	}
}
