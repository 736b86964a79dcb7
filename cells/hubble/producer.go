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

// LostCheckInterval is how often the producer reports events lost while
// no new event arrives (Cilium's hubble-lost-event-send-interval).
const LostCheckInterval = time.Second

// producer reads the monitor hub, turns each event into a flow and hands
// it to every sink in order. Lost events become one LostEvent per gap.
type producer struct {
	hub     *monitor.Hub
	parser  *parser.Parser
	sinks   []Sink
	queue   int
	metrics *metrics
	log     *slog.Logger
	sub     *monitor.Subscription // from Subscribe, else Run's own
}

// newProducer returns a producer of flows from hub's events. queue is
// the subscription's buffer (monitor.DefaultBuffer when <= 0). m may be
// nil (no metrics).
func newProducer(hub *monitor.Hub, p *parser.Parser, sinks []Sink, queue int, m *metrics, log *slog.Logger) *producer {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &producer{hub: hub, parser: p, sinks: sinks, queue: queue, metrics: m, log: log}
}

// Subscribe subscribes to the hub now, so that Run misses nothing
// published from this point on (the cell does it when the hive starts).
func (pr *producer) Subscribe() {
	if pr.sub == nil {
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
	tick := time.NewTicker(LostCheckInterval)
	defer tick.Stop()
	var (
		reported uint64
		lastSeen time.Time // timestamp of the last event received: lost ones came after it
	)
	report := func() {
		if lost := sub.Lost(); lost > reported {
			l := parser.LostEvent(lost-reported, lastSeen, time.Now())
			reported = lost
			pr.metrics.lost(l.NumEventsLost)
			for _, s := range pr.sinks {
				s.OnLost(l)
			}
		}
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
			report()
		case ev, ok := <-sub.Events():
			if !ok {
				return nil
			}
			report()
			lastSeen = ev.Timestamp
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
