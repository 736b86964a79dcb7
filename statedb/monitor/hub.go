package monitor

import (
	"sync"
	"sync/atomic"
)

// DefaultBuffer is the buffer of a subscriber that asks for none: events
// a reader may fall behind by before the hub drops for it.
const DefaultBuffer = 1024

// Hub fans events out to subscribers. Its methods are safe for concurrent
// use. The zero Hub is not usable; call NewHub.
type Hub struct {
	mu     sync.RWMutex
	subs   map[*Subscription]struct{}
	closed bool

	published  atomic.Uint64
	lost       atomic.Uint64
	sourceLost atomic.Uint64
}

// NewHub returns a hub without subscribers.
func NewHub() *Hub {
	return &Hub{subs: map[*Subscription]struct{}{}}
}

// Publish hands ev to every subscriber whose filter selects it. It never
// blocks: a subscriber whose buffer is full loses the event, and the loss
// is counted on its Subscription and in Stats. After Close it does
// nothing.
func (h *Hub) Publish(ev Event) {
	h.mu.RLock()
	defer h.mu.RUnlock()
	if h.closed {
		return
	}
	h.published.Add(1)
	for s := range h.subs {
		if !s.filter.Match(&ev) {
			continue
		}
		select {
		case s.ch <- ev:
		default:
			s.lost.Add(1)
			h.lost.Add(1)
		}
	}
}

// PublishLost counts n events the source lost before it could publish
// them (the datapath's ring buffer was full); readers learn of them from
// SourceLost. It never blocks.
func (h *Hub) PublishLost(n uint64) { h.sourceLost.Add(n) }

// SourceLost returns how many events the source reported lost with
// PublishLost, since the hub was made.
func (h *Hub) SourceLost() uint64 { return h.sourceLost.Load() }

// Subscribe registers a reader of the events f selects, with room for
// buffer events (DefaultBuffer when buffer <= 0). The caller must read
// Events promptly and Close the subscription when done. On a closed hub
// the subscription's channel is already closed.
func (h *Hub) Subscribe(f Filter, buffer int) *Subscription {
	if buffer <= 0 {
		buffer = DefaultBuffer
	}
	s := &Subscription{hub: h, filter: f, ch: make(chan Event, buffer)}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		close(s.ch)
		s.done = true
		return s
	}
	h.subs[s] = struct{}{}
	return s
}

// Close ends every subscription (their channels close once drained) and
// makes Publish a no-op. The agent calls it when it stops, so that the
// API's streams end.
func (h *Hub) Close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return
	}
	h.closed = true
	for s := range h.subs {
		s.done = true
		close(s.ch)
	}
	clear(h.subs)
}

// Stats are the hub's counters.
type Stats struct {
	// Published counts the events handed to Publish (while open).
	Published uint64
	// Lost counts the events subscribers lost to full buffers, summed.
	Lost uint64
	// Subscribers is the number of open subscriptions.
	Subscribers int
	// SourceLost counts the events lost before they reached the hub
	// (PublishLost).
	SourceLost uint64
}

// Stats returns the hub's counters.
func (h *Hub) Stats() Stats {
	h.mu.RLock()
	n := len(h.subs)
	h.mu.RUnlock()
	return Stats{Published: h.published.Load(), Lost: h.lost.Load(), Subscribers: n, SourceLost: h.sourceLost.Load()}
}

// Subscription is one reader of a Hub.
type Subscription struct {
	hub    *Hub
	filter Filter
	ch     chan Event
	lost   atomic.Uint64
	done   bool // guarded by hub.mu
}

// Events returns the channel of selected events. It is closed after
// Close, or after the hub's Close once the buffered events are read.
func (s *Subscription) Events() <-chan Event { return s.ch }

// Lost returns how many selected events did not fit in the buffer.
func (s *Subscription) Lost() uint64 { return s.lost.Load() }

// Close unsubscribes; Events is closed. Closing twice is harmless.
func (s *Subscription) Close() {
	s.hub.mu.Lock()
	defer s.hub.mu.Unlock()
	if s.done {
		return
	}
	s.done = true
	delete(s.hub.subs, s)
	close(s.ch)
}

// Publisher is what a producer of events needs of the hub.
type Publisher interface {
	// Publish hands an event to the subscribers without blocking.
	Publish(Event)
}

// LostPublisher is what a producer of events needs of the hub to report
// events it lost before publishing them.
type LostPublisher interface {
	// PublishLost counts n events lost at the source.
	PublishLost(n uint64)
}

var (
	_ Publisher     = (*Hub)(nil)
	_ LostPublisher = (*Hub)(nil)
)
