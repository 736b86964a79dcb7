package hubble

import (
	"time"

	flowpb "github.com/cilium/cilium/api/v1/flow"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// DefaultLostEventSendInterval is how often, at most, one LostEvent per
// source is sent (Cilium's --hubble-lost-event-send-interval default).
const DefaultLostEventSendInterval = time.Second

// LostCounter aggregates lost events of one source so that they are
// reported at most once per interval, as Hubble does: the losses of an
// interval become one LostEvent carrying their sum and the times of the
// first and last loss. The zero value reports at once (interval 0). It is
// not safe for concurrent use.
type LostCounter struct {
	source      flowpb.LostEventSource
	interval    time.Duration
	count       uint64
	first, last time.Time
}

// NewLostCounter returns a counter of source's losses reported at most
// once per interval.
func NewLostCounter(source flowpb.LostEventSource, interval time.Duration) *LostCounter {
	return &LostCounter{source: source, interval: interval}
}

// Add counts n events lost at now (n 0 is ignored).
func (c *LostCounter) Add(n uint64, now time.Time) {
	if n == 0 {
		return
	}
	if c.count == 0 || now.Before(c.first) {
		c.first = now
	}
	if c.count == 0 || now.After(c.last) {
		c.last = now
	}
	c.count += n
}

// Pending is how many lost events wait to be reported.
func (c *LostCounter) Pending() uint64 { return c.count }

// Due reports whether a LostEvent should be sent at now: there are losses
// and the first of them is at least one interval old.
func (c *LostCounter) Due(now time.Time) bool {
	return c.count > 0 && now.Sub(c.first) >= c.interval
}

// DueAt is when Due turns true, or the zero time when nothing is pending.
func (c *LostCounter) DueAt() time.Time {
	if c.count == 0 {
		return time.Time{}
	}
	return c.first.Add(c.interval)
}

// Take returns the pending losses as one LostEvent and clears the count;
// nil when nothing is pending.
func (c *LostCounter) Take() *flowpb.LostEvent {
	if c.count == 0 {
		return nil
	}
	l := &flowpb.LostEvent{
		Source:        c.source,
		NumEventsLost: c.count,
		First:         timestamppb.New(c.first),
		Last:          timestamppb.New(c.last),
	}
	c.count, c.first, c.last = 0, time.Time{}, time.Time{}
	return l
}
