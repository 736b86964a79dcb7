package hubble

import (
	"context"
	"log/slog"
	"time"

	flowpb "github.com/cilium/cilium/api/v1/flow"

	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/cells/hubble/parser"
	"github.com/cellium/cellium/statedb/monitor"
)

// producer reads the monitor hub, turns each event into a flow and hands
// it to every sink in order. Events the hub could not queue for it
// (source OBSERVER_EVENTS_QUEUE) and events the datapath could not put
// into its ring buffer (PERF_EVENT_RING_BUFFER, the hub's SourceLost) are
// counted and reported as LostEvents, at most one per source and
// lostInterval, as Hubble's --hubble-lost-event-send-interval.
type producer struct {
	hub          *monitor.Hub
	parser       *parser.Parser
	sinks        []Sink
	queue        int
	lostInterval time.Duration
	metrics      *metrics
	log          *slog.Logger
	sub          *monitor.Subscription // from Subscribe, else Run's own
	sourceLost0  uint64                // the hub's SourceLost at Subscribe
}

// newProducer returns a producer of flows from hub's events. queue is
// the subscription's buffer (monitor.DefaultBuffer when <= 0);
// lostInterval bounds how often a LostEvent is sent (0: at each loss
// noticed). m may be nil (no metrics).
func newProducer(hub *monitor.Hub, p *parser.Parser, sinks []Sink, queue int, lostInterval time.Duration, m *metrics, log *slog.Logger) *producer {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &producer{hub: hub, parser: p, sinks: sinks, queue: queue, lostInterval: lostInterval, metrics: m, log: log}
}

// lostTick is how often the producer looks for losses to report while no
// event arrives: half the send interval, from 10ms to 500ms.
func lostTick(interval time.Duration) time.Duration {
	return min(max(interval/2, 10*time.Millisecond), 500*time.Millisecond)
}

// Subscribe subscribes to the hub now, so that Run misses nothing
// published from this point on (the cell does it when the hive starts).
func (pr *producer) Subscribe() {
	if pr.sub == nil {
		pr.sourceLost0 = pr.hub.SourceLost()
		pr.sub = pr.hub.Subscribe(monitor.Filter{}, pr.queue)
	}
}

// Run produces flows until ctx ends or the hub closes; it subscribes
// first unless Subscribe did, and unsubscribes when it returns.
func (pr *producer) Run(ctx context.Context, h hive.Health) error {
	pr.Subscribe()
	sub := pr.sub
	defer sub.Close()
	if h != nil {
		h.OK("producing flows")
	}
	tick := time.NewTicker(lostTick(pr.lostInterval))
	defer tick.Stop()
	var counted uint64 // sub.Lost() already in lost
	sourceCounted := pr.sourceLost0
	lost := NewLostCounter(flowpb.LostEventSource_OBSERVER_EVENTS_QUEUE, pr.lostInterval)
	sourceLost := NewLostCounter(flowpb.LostEventSource_PERF_EVENT_RING_BUFFER, pr.lostInterval)
	send := func(c *LostCounter, now time.Time) {
		if !c.Due(now) {
			return
		}
		l := c.Take()
		for _, s := range pr.sinks {
			s.OnLost(l)
		}
	}
	// report counts the losses since the last call and sends them as one
	// LostEvent when the interval since the first of them has passed.
	report := func() {
		now := time.Now()
		if n := sub.Lost(); n > counted {
			pr.metrics.lost(n - counted)
			lost.Add(n-counted, now)
			counted = n
		}
		send(lost, now)
	}
	// reportSource does the same for the datapath's losses; they are
	// polled (the tick), so their LostEvent may come a tick late.
	reportSource := func() {
		now := time.Now()
		if n := pr.hub.SourceLost(); n > sourceCounted {
			pr.metrics.lostAtSource(n - sourceCounted)
			sourceLost.Add(n-sourceCounted, now)
			sourceCounted = n
		}
		send(sourceLost, now)
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
			report()
			reportSource()
		case ev, ok := <-sub.Events():
			if !ok {
				return nil
			}
			if lost.Pending() > 0 || sub.Lost() > counted {
				report()
			}
			pr.handle(&ev)
		}
	}
}

func (pr *producer) handle(ev *monitor.Event) {
	f, err := pr.parser.Parse(ev)
	if err != nil {
		pr.metrics.parseError()
		pr.log.Debug("datapath event not turned into a flow", "error", err)
		return
	}
	pr.metrics.flow(ev.Type)
	pr.emit(f)
}

func (pr *producer) emit(f *flowpb.Flow) {
	for _, s := range pr.sinks {
		s.OnFlow(f)
	}
}
