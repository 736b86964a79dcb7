package metrics

import (
	"fmt"
	"net/http"
	"strings"
	"sync"

	flowpb "github.com/cilium/cilium/api/v1/flow"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/cellium/cellium/cells/hubble"
)

// Metrics counts flows into Hubble's metrics, in a registry of its own. It
// is a hubble.Sink.
type Metrics struct {
	reg *prometheus.Registry

	// mu serialises OnFlow and OnLost: the handlers reuse their buffers of
	// label values. The producer calls from one goroutine, so it is never
	// contended.
	mu       sync.Mutex
	handlers []handler

	lost     *prometheus.CounterVec
	lostBy   map[flowpb.LostEventSource]prometheus.Counter
	requests *prometheus.CounterVec
	duration *prometheus.HistogramVec
}

var _ hubble.Sink = (*Metrics)(nil)

// New creates the metrics of specs (see ParseSpecs) and
// hubble_lost_events_total, registered in a new registry.
//
// Errors: a spec names a metric cellium does not count (ErrUnknownMetric),
// or a metric is given twice.
func New(specs []Spec) (*Metrics, error) {
	m := &Metrics{
		reg: prometheus.NewPedanticRegistry(),
		lost: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace, Name: "lost_events_total", Help: "Number of lost events",
		}, []string{"source"}),
		lostBy: map[flowpb.LostEventSource]prometheus.Counter{},
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace, Name: "metrics_http_handler_requests_total",
			Help: "A counter for requests to Hubble metrics handler.",
		}, []string{"code"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: Namespace, Name: "metrics_http_handler_request_duration_seconds",
			Help: "A histogram of latencies of Hubble metrics handler.",
		}, []string{"code"}),
	}
	for v := range flowpb.LostEventSource_name {
		src := flowpb.LostEventSource(v)
		m.lostBy[src] = m.lost.WithLabelValues(strings.ToLower(src.String()))
	}
	for _, c := range []prometheus.Collector{m.lost, m.requests, m.duration} {
		if err := m.reg.Register(c); err != nil {
			return nil, fmt.Errorf("register hubble metrics: %w", err)
		}
	}
	for _, spec := range specs {
		h := newHandler(spec)
		if h == nil {
			return nil, fmt.Errorf("%w %q: the metrics cellium counts are %s", ErrUnknownMetric, spec.Name, knownNamesList())
		}
		if err := m.reg.Register(h.collector()); err != nil {
			return nil, fmt.Errorf("register hubble metric %q (given twice?): %w", spec.Name, err)
		}
		m.handlers = append(m.handlers, h)
	}
	return m, nil
}

// OnFlow implements hubble.Sink: it counts f in every enabled metric.
func (m *Metrics) OnFlow(f *flowpb.Flow) {
	m.mu.Lock()
	for _, h := range m.handlers {
		h.process(f)
	}
	m.mu.Unlock()
}

// OnLost implements hubble.Sink: it adds the lost events to
// hubble_lost_events_total{source}.
func (m *Metrics) OnLost(l *flowpb.LostEvent) {
	if l == nil || l.GetNumEventsLost() == 0 {
		return
	}
	c, ok := m.lostBy[l.GetSource()]
	if !ok {
		c = m.lost.WithLabelValues(strings.ToLower(l.GetSource().String()))
	}
	c.Add(float64(l.GetNumEventsLost()))
}

// ForgetPod deletes the series that name the pod namespace/name (through
// the pod context or labelsContext's source_pod/destination_pod with their
// namespace) from every metric, and returns how many went. The series of
// other contexts (ip, identity, pod-name, ...) are kept.
func (m *Metrics) ForgetPod(namespace, name string) int {
	n := 0
	for _, h := range m.handlers {
		n += h.forgetPod(namespace, name)
	}
	return n
}

// Registry is the registry the metrics are in.
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// Handler serves the registry on GET /metrics, instrumented with
// hubble_metrics_http_handler_*; openMetrics offers the OpenMetrics format
// to scrapers that ask for it.
func (m *Metrics) Handler(openMetrics bool) http.Handler {
	var h http.Handler = promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{EnableOpenMetrics: openMetrics})
	h = promhttp.InstrumentHandlerCounter(m.requests, h)
	h = promhttp.InstrumentHandlerDuration(m.duration, h)
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", h)
	return mux
}

// nopSink is the sink of an agent that serves no Hubble metrics.
type nopSink struct{}

func (nopSink) OnFlow(*flowpb.Flow)      {}
func (nopSink) OnLost(*flowpb.LostEvent) {}
