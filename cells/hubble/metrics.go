package hubble

import (
	"fmt"
	"strings"

	flowpb "github.com/cilium/cilium/api/v1/flow"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/cellium/cellium/statedb/monitor"
)

// metrics are the producer's own counters (Hubble's flow metrics are the
// hubble/metrics sink's).
type metrics struct {
	flows       *prometheus.CounterVec
	byType      map[monitor.Type]prometheus.Counter
	parseErrors prometheus.Counter
	lostEvents  *prometheus.CounterVec
	lostQueue   prometheus.Counter
	lostSource  prometheus.Counter
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
		lostEvents: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "cellium_hubble_lost_events_total",
			Help: "Datapath events lost before they became flows, by where (Hubble's LostEvent source, lower case): the flow producer's queue or the datapath's ring buffer",
		}, []string{"source"}),
		byType: map[monitor.Type]prometheus.Counter{},
	}
	m.lostQueue = m.lostEvents.WithLabelValues(strings.ToLower(flowpb.LostEventSource_OBSERVER_EVENTS_QUEUE.String()))
	m.lostSource = m.lostEvents.WithLabelValues(strings.ToLower(flowpb.LostEventSource_PERF_EVENT_RING_BUFFER.String()))
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

// lost counts n events lost in the producer's queue.
func (m *metrics) lost(n uint64) {
	if m != nil {
		m.lostQueue.Add(float64(n))
	}
}

// lostAtSource counts n events lost in the datapath's ring buffer.
func (m *metrics) lostAtSource(n uint64) {
	if m != nil {
		m.lostSource.Add(float64(n))
	}
}
