package observer

import (
	"context"
	"fmt"
	"math/bits"
	"sync"
	"sync/atomic"
	"time"

	flowpb "github.com/cilium/cilium/api/v1/flow"
)

// MaxCapacity is the largest ring capacity, as in Cilium (2^16-1).
const MaxCapacity = 1<<16 - 1

// event is one entry of the ring: a flow or a lost event, with its
// sequence number (the count of events written before it).
type event struct {
	seq  uint64
	flow *flowpb.Flow
	lost *flowpb.LostEvent
}

// time returns when the event happened, or the zero time if unknown.
func (e *event) time() time.Time {
	switch {
	case e.flow != nil && e.flow.GetTime() != nil:
		return e.flow.GetTime().AsTime()
	case e.lost != nil && e.lost.GetLast() != nil:
		return e.lost.GetLast().AsTime()
	}
	return time.Time{}
}

// slot holds one event of the ring. The writer fills it in place, so
// that keeping a flow allocates nothing: tag is 0 while the slot is being
// written and seq+1 of the event it holds after, and a reader trusts the
// pointers it loaded only when it sees the same tag before and after
// loading them (a sequence lock on atomics).
type slot struct {
	tag  atomic.Uint64
	flow atomic.Pointer[flowpb.Flow]
	lost atomic.Pointer[flowpb.LostEvent]
}

// Ring keeps the last Cap() events written to it. It has one writer
// (Write, WriteLost: the flow producer's goroutine) and any number of
// readers; writing takes no lock, allocates nothing and never waits for a
// reader.
//
// The ring has Cap()+1 slots, a power of two: the extra slot is the one
// being overwritten, so every event a reader can reach is complete.
type Ring struct {
	mask  uint64
	slots []slot
	// next is the sequence number the next write gets; events
	// [next-Cap(), next) are readable.
	next atomic.Uint64
	// flows counts the flows written (lost events are not flows).
	flows atomic.Uint64
	// wake is closed by the writer after a write when a reader waits.
	wake atomic.Pointer[chan struct{}]
	mu   sync.Mutex // serializes readers installing wake
}

// CheckCapacity returns nil when n is a valid ring capacity: one less than
// a power of two, from 1 to MaxCapacity, as Cilium requires of
// --hubble-event-buffer-capacity.
func CheckCapacity(n int) error {
	switch {
	case n > MaxCapacity:
		return fmt.Errorf("%d is too large: the largest capacity is %d", n, MaxCapacity)
	case n < 1 || n&(n+1) != 0:
		return fmt.Errorf("%d is not one less than a power of two: use 1, 3, 7, ..., 2047, 4095, ..., %d", n, MaxCapacity)
	}
	return nil
}

// NewRing makes a ring that keeps the last capacity events.
//
// Errors: capacity is not valid (see CheckCapacity).
func NewRing(capacity int) (*Ring, error) {
	if err := CheckCapacity(capacity); err != nil {
		return nil, fmt.Errorf("ring capacity: %w", err)
	}
	size := uint64(1) << bits.Len(uint(capacity)) // capacity+1
	return &Ring{mask: size - 1, slots: make([]slot, size)}, nil
}

// Cap is how many events the ring keeps.
func (r *Ring) Cap() uint64 { return r.mask }

// Len is how many events the ring holds now.
func (r *Ring) Len() uint64 { return min(r.next.Load(), r.mask) }

// Written is how many events were ever written.
func (r *Ring) Written() uint64 { return r.next.Load() }

// SeenFlows is how many flows were ever written.
func (r *Ring) SeenFlows() uint64 { return r.flows.Load() }

// Write appends a flow. Only one goroutine may write.
func (r *Ring) Write(f *flowpb.Flow) {
	r.flows.Add(1)
	r.put(f, nil)
}

// WriteLost appends a lost event. Only one goroutine may write.
func (r *Ring) WriteLost(l *flowpb.LostEvent) { r.put(nil, l) }

func (r *Ring) put(f *flowpb.Flow, l *flowpb.LostEvent) {
	seq := r.next.Load()
	sl := &r.slots[seq&r.mask]
	sl.tag.Store(0) // readers of the event it held see it go
	// A store is a locked instruction, a load is not: skip the stores
	// that change nothing (lost is nil in nearly every slot).
	if sl.flow.Load() != f {
		sl.flow.Store(f)
	}
	if sl.lost.Load() != l {
		sl.lost.Store(l)
	}
	sl.tag.Store(seq + 1)
	r.next.Store(seq + 1)
	if ch := r.wake.Swap(nil); ch != nil {
		close(*ch)
	}
}

// OnFlow implements hubble.Sink.
func (r *Ring) OnFlow(f *flowpb.Flow) { r.Write(f) }

// OnLost implements hubble.Sink.
func (r *Ring) OnLost(l *flowpb.LostEvent) { r.WriteLost(l) }

// oldest is the sequence number of the oldest readable event.
func (r *Ring) oldest() uint64 {
	n := r.next.Load()
	if n <= r.mask {
		return 0
	}
	return n - r.mask
}

// at returns the event with sequence number seq and true; or false and
// the oldest sequence number still readable when seq was overwritten (or
// is not written yet: then false and seq).
func (r *Ring) at(seq uint64) (event, bool, uint64) {
	if seq >= r.next.Load() {
		return event{}, false, seq
	}
	sl := &r.slots[seq&r.mask]
	if sl.tag.Load() == seq+1 {
		e := event{seq: seq, flow: sl.flow.Load(), lost: sl.lost.Load()}
		if sl.tag.Load() == seq+1 {
			return e, true, seq
		}
	}
	return event{}, false, max(r.oldest(), seq+1)
}

// waitCh returns a channel closed by the next write.
func (r *Ring) waitCh() chan struct{} {
	if ch := r.wake.Load(); ch != nil {
		return *ch
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for {
		if ch := r.wake.Load(); ch != nil {
			return *ch
		}
		ch := make(chan struct{})
		if r.wake.CompareAndSwap(nil, &ch) {
			return ch
		}
	}
}

// Reader reads a ring from a position onwards. One goroutine uses it.
type Reader struct {
	ring *Ring
	next uint64
	cur  event // what Next returned last
}

// NewReader returns a reader whose first event is the one with sequence
// number seq (clamped to what the ring holds).
func (r *Ring) NewReader(seq uint64) *Reader {
	return &Reader{ring: r, next: max(seq, r.oldest())}
}

// Next returns the next event and how many events the reader lost
// (overwritten before it read them) just before it. ok is false when
// there is no event yet. The event is valid until the next call.
func (rd *Reader) Next() (e *event, lost uint64, ok bool) {
	for {
		ev, ok, next := rd.ring.at(rd.next)
		if ok {
			rd.next++
			rd.cur = ev
			return &rd.cur, lost, true
		}
		if next == rd.next { // nothing written yet
			return nil, lost, false
		}
		lost += next - rd.next
		rd.next = next
	}
}

// NextWait is Next, waiting for a write when there is no event yet.
//
// Errors: ctx's error when it ends first.
func (rd *Reader) NextWait(ctx context.Context) (*event, uint64, error) {
	var lostTotal uint64
	for {
		e, lost, ok := rd.Next()
		lostTotal += lost
		if ok {
			return e, lostTotal, nil
		}
		ch := rd.ring.waitCh()
		if rd.ring.next.Load() > rd.next {
			continue // written between Next and waitCh
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, lostTotal, ctx.Err()
		}
	}
}
