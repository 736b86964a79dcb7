package hubble

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	flowpb "github.com/cilium/cilium/api/v1/flow"

	"github.com/cellium/cellium/statedb/monitor"
)

func TestLostCounter(t *testing.T) {
	t0 := time.Unix(1000, 0)
	c := NewLostCounter(flowpb.LostEventSource_OBSERVER_EVENTS_QUEUE, time.Second)
	if c.Due(t0.Add(time.Hour)) || c.Take() != nil || !c.DueAt().IsZero() {
		t.Fatal("an empty counter is due or has something to take")
	}
	c.Add(0, t0) // ignored: does not start the interval
	c.Add(3, t0.Add(100*time.Millisecond))
	c.Add(4, t0.Add(700*time.Millisecond))
	c.Add(5, t0.Add(50*time.Millisecond)) // out of order: still the first
	if c.Pending() != 12 {
		t.Fatalf("pending %d, want 12", c.Pending())
	}
	if c.Due(t0.Add(1049 * time.Millisecond)) {
		t.Fatal("due before an interval since the first loss")
	}
	if !c.Due(t0.Add(1050*time.Millisecond)) || !c.DueAt().Equal(t0.Add(1050*time.Millisecond)) {
		t.Fatalf("not due an interval after the first loss (due at %s)", c.DueAt())
	}
	l := c.Take()
	if l.GetNumEventsLost() != 12 || l.GetSource() != flowpb.LostEventSource_OBSERVER_EVENTS_QUEUE ||
		!l.GetFirst().AsTime().Equal(t0.Add(50*time.Millisecond)) || !l.GetLast().AsTime().Equal(t0.Add(700*time.Millisecond)) {
		t.Fatalf("lost event %v", l)
	}
	if c.Pending() != 0 || c.Take() != nil {
		t.Fatal("Take did not clear the count")
	}
}

// gateSink counts flows; while the test holds stall, OnFlow waits, as a
// slow sink would.
type gateSink struct {
	stall sync.RWMutex
	flows atomic.Uint64
	lost  chan *flowpb.LostEvent
}

func (s *gateSink) OnFlow(*flowpb.Flow) {
	s.stall.RLock()
	s.stall.RUnlock() //nolint:staticcheck // an empty critical section: waits while the test stalls the sink
	s.flows.Add(1)
}

func (s *gateSink) OnLost(l *flowpb.LostEvent) { s.lost <- l }

// A flood into a queue of 4 events while the sink stalls, several times
// within one send interval: every event is either a flow or counted in a
// LostEvent (their sum is the hub's lost count), and the losses of the
// interval come as one LostEvent, not one per gap.
func TestCellLostEventsRateLimited(t *testing.T) {
	const interval = 2 * time.Second
	sink := &gateSink{lost: make(chan *flowpb.LostEvent, 100)}
	a := startAgent(t, []string{"--hubble-event-queue-size=4", "--hubble-lost-event-send-interval=" + interval.String()}, sink)
	ev := monitor.Event{Type: monitor.TypeDrop, Reason: 133, Timestamp: time.Now(), SrcIP: addr("10.1.0.11"), DstIP: addr("10.1.0.10"), Protocol: 6}
	const rounds, perRound = 5, 500
	start := time.Now()
	for range rounds {
		sink.stall.Lock()
		for range perRound {
			a.hub.Publish(ev)
		}
		sink.stall.Unlock()
		// The producer drains what was queued before the next round.
		deadline := time.Now().Add(10 * time.Second)
		for sink.flows.Load()+a.hub.Stats().Lost < a.hub.Stats().Published {
			if time.Now().After(deadline) {
				t.Fatalf("flows %d + lost %d < published %d after 10s", sink.flows.Load(), a.hub.Stats().Lost, a.hub.Stats().Published)
			}
			time.Sleep(time.Millisecond)
		}
	}
	flooded := time.Since(start)
	dropped := a.hub.Stats().Lost
	if dropped == 0 {
		t.Fatal("nothing was lost: the queue did not overflow")
	}
	var reported uint64
	var events int
	timeout := time.After(10 * time.Second)
	for reported < dropped {
		select {
		case l := <-sink.lost:
			if l.GetSource() != flowpb.LostEventSource_OBSERVER_EVENTS_QUEUE || l.GetNumEventsLost() == 0 {
				t.Fatalf("lost event %v", l)
			}
			reported += l.GetNumEventsLost()
			events++
		case <-timeout:
			t.Fatalf("LostEvents report %d of the %d events lost after 10s", reported, dropped)
		}
	}
	if reported != dropped || sink.flows.Load()+reported != rounds*perRound {
		t.Fatalf("LostEvents report %d, the hub lost %d; flows %d; published %d", reported, dropped, sink.flows.Load(), rounds*perRound)
	}
	// At most one LostEvent per interval (plus the one started last).
	if most := int(flooded/interval) + 1; events > most {
		t.Fatalf("%d LostEvents for losses over %s, want at most %d (one per %s)", events, flooded, most, interval)
	}
	t.Logf("%d rounds of %d events in %s: %d flows, %d lost in %d LostEvent(s)", rounds, perRound, flooded.Round(time.Millisecond),
		sink.flows.Load(), reported, events)
}

// Events the datapath lost before they reached the hub (PublishLost)
// become LostEvents of source PERF_EVENT_RING_BUFFER summing them, at most
// one per interval; losses counted before the producer subscribed (an
// earlier agent's) are not reported.
func TestCellDatapathLostEvents(t *testing.T) {
	sink := &gateSink{lost: make(chan *flowpb.LostEvent, 100)}
	// The hub is the hive's: losses before start are simulated by the
	// first PublishLost right after start, which the producer may or may
	// not have subscribed before; only later ones are asserted exactly.
	a := startAgent(t, []string{"--hubble-lost-event-send-interval=300ms"}, sink)
	before := a.hub.SourceLost()
	start := time.Now()
	for range 10 {
		a.hub.PublishLost(7)
	}
	var got uint64
	var events int
	timeout := time.After(10 * time.Second)
	for got < 70 {
		select {
		case l := <-sink.lost:
			if l.GetSource() != flowpb.LostEventSource_PERF_EVENT_RING_BUFFER {
				t.Fatalf("lost event %v, want source PERF_EVENT_RING_BUFFER", l)
			}
			got += l.GetNumEventsLost()
			events++
		case <-timeout:
			t.Fatalf("LostEvents report %d of the 70 events lost after 10s", got)
		}
	}
	if got != 70 || a.hub.SourceLost()-before != 70 {
		t.Fatalf("LostEvents report %d, the hub counted %d: want 70", got, a.hub.SourceLost()-before)
	}
	if most := int(time.Since(start)/(300*time.Millisecond)) + 1; events > most {
		t.Fatalf("%d LostEvents, want at most %d (one per 300ms)", events, most)
	}
}

// A producer subscribed after the hub counted losses does not report them.
func TestProducerIgnoresEarlierSourceLosses(t *testing.T) {
	hub := monitor.NewHub()
	hub.PublishLost(5)
	sink := &gateSink{lost: make(chan *flowpb.LostEvent, 10)}
	pr := newProducer(hub, nil, []Sink{sink}, 4, 10*time.Millisecond, nil, nil)
	pr.Subscribe()
	hub.PublishLost(3)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = pr.Run(ctx, nil) }()
	defer func() { cancel(); <-done }()
	select {
	case l := <-sink.lost:
		if l.GetNumEventsLost() != 3 || l.GetSource() != flowpb.LostEventSource_PERF_EVENT_RING_BUFFER {
			t.Fatalf("lost event %v, want 3 from PERF_EVENT_RING_BUFFER", l)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no LostEvent within 10s")
	}
}
