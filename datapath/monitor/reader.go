package monitor

import (
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/cilium/ebpf/ringbuf"
	"golang.org/x/sys/unix"

	"github.com/cellium/cellium/datapath/maps"
	hub "github.com/cellium/cellium/statedb/monitor"
)

// Records are what a Reader reads: *ringbuf.Reader of cellium_events.
type Records interface {
	// ReadInto waits for the next record; after Close it returns an
	// error wrapping ringbuf.ErrClosed (os.ErrClosed).
	ReadInto(*ringbuf.Record) error
}

// Reader publishes the events of the ring buffer into the hub.
type Reader struct {
	records Records
	publish hub.Publisher
	clock   func(ktimeNs uint64) time.Time

	events, decodeErrors atomic.Uint64
}

// NewReader returns a reader of records into publish. Timestamps are the
// records' CLOCK_MONOTONIC times converted to wall-clock time.
func NewReader(records Records, publish hub.Publisher) *Reader {
	return &Reader{records: records, publish: publish, clock: KtimeToWall}
}

// Run reads and publishes until the records are closed (it then returns
// nil). A record that does not decode is counted (DecodeErrors) and
// skipped.
//
// Errors: a read error other than the reader being closed, wrapped.
func (r *Reader) Run() error {
	var rec ringbuf.Record
	for {
		if err := r.records.ReadInto(&rec); err != nil {
			if errors.Is(err, ringbuf.ErrClosed) {
				return nil
			}
			return fmt.Errorf("read %s: %w", maps.EventsMapName, err)
		}
		ev, err := maps.DecodeEvent(rec.RawSample)
		if err != nil {
			r.decodeErrors.Add(1)
			continue
		}
		r.events.Add(1)
		r.publish.Publish(Convert(ev, r.clock(ev.KtimeNs)))
	}
}

// Events returns how many events Run has published.
func (r *Reader) Events() uint64 { return r.events.Load() }

// DecodeErrors returns how many records Run skipped as undecodable.
func (r *Reader) DecodeErrors() uint64 { return r.decodeErrors.Load() }

// Convert turns a decoded ring buffer event into the hub's event, with
// the reason in Cilium's words and timestamp ts.
func Convert(e maps.Event, ts time.Time) hub.Event {
	out := hub.Event{
		Type:        hub.Type(e.Type),
		Timestamp:   ts,
		Reason:      e.Reason,
		Direction:   hub.Direction(e.Dir),
		EndpointID:  e.EndpointID,
		SrcIdentity: uint32(e.SrcIdentity),
		DstIdentity: uint32(e.DstIdentity),
		SrcIP:       e.Src,
		DstIP:       e.Dst,
		SrcPort:     e.SrcPort,
		DstPort:     e.DstPort,
		Protocol:    e.Proto,
		Ifindex:     e.IfIndex,
		Length:      e.OrigLen,
		TCPFlags:    e.TCPFlags,
		ICMPType:    e.ICMPType,
		ICMPCode:    e.ICMPCode,
		IsReply:     e.IsReply,
		ReplyKnown:  e.ReplyKnown,
		OrigDstIP:   e.OrigDst,
		OrigDstPort: e.OrigDstPort,
	}
	switch e.Type {
	case maps.EventDrop:
		out.ReasonName = maps.DropReasonName(e.Reason)
	case maps.EventTrace:
		out.ReasonName = maps.TraceObsPointName(e.Reason)
	case maps.EventPolicyVerdict:
		if e.Reason != 0 {
			out.ReasonName = maps.DropReasonName(e.Reason)
		}
		switch e.Verdict {
		case maps.VerdictAllowed:
			out.Verdict = hub.VerdictAllow
		case maps.VerdictDenied:
			out.Verdict = hub.VerdictDeny
		case maps.VerdictAudit:
			out.Verdict = hub.VerdictAudit
		}
	}
	return out
}

// KtimeToWall converts a CLOCK_MONOTONIC time in nanoseconds (what BPF's
// bpf_ktime_get_ns returns) to wall-clock time.
func KtimeToWall(ktimeNs uint64) time.Time {
	var ts unix.Timespec
	now := time.Now()
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return now
	}
	return now.Add(-time.Duration(ts.Nano() - int64(ktimeNs)))
}
