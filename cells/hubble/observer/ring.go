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

// Ring keeps the last Cap() events written to it. It has one writer
// (Write, WriteLost: the flow producer's goroutine) and any number of
// readers; writing takes no lock and never waits for a reader.
//
// The ring has Cap()+1 slots, a power of two: the extra slot is the one
// being overwritten, so every event a reader can reach is complete.
type Ring struct {
	mask  uint64
	slots []atomic.Pointer[event]
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
	return &Ring{mask: size - 1, slots: make([]atomic.Pointer[event], size)}, nil
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
	r.put(&event{flow: f})
}

// WriteLost appends a lost event. Only one goroutine may write.
func (r *Ring) WriteLost(l *flowpb.LostEvent) { r.put(&event{lost: l}) }

func (r *Ring) put(e *event) {
	seq := r.next.Load()
	e.seq = seq
	r.slots[seq&r.mask].Store(e)
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

// at returns the event with sequence number seq, or nil and the oldest
// sequence number still readable when seq was overwritten (or is not
// written yet: then nil and seq).
func (r *Ring) at(seq uint64) (*event, uint64) {
	if seq >= r.next.Load() {
		return nil, seq
	}
	e := r.slots[seq&r.mask].Load()
	if e != nil && e.seq == seq {
		return e, seq
	}
	return nil, max(r.oldest(), seq+1)
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
}

// NewReader returns a reader whose first event is the one with sequence
// number seq (clamped to what the ring holds).
func (r *Ring) NewReader(seq uint64) *Reader {
	return &Reader{ring: r, next: max(seq, r.oldest())}
}

// Next returns the next event and how many events the reader lost
// (overwritten before it read them) just before it. ok is false when
// there is no event yet.
func (rd *Reader) Next() (e *event, lost uint64, ok bool) {
	for {
		e, next := rd.ring.at(rd.next)
		if e != nil {
			rd.next++
			return e, lost, true
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
