package monitor

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/cilium/ebpf/ringbuf"
	"golang.org/x/sys/unix"

	"github.com/cellium/cellium/datapath/maps"
	hub "github.com/cellium/cellium/statedb/monitor"
)

// record encodes a struct event as the programs write it (BPF-ABI.md).
func record(typ, reason, dir, verdict uint8, ep uint16, proto uint8, src, dst string, srcID, dstID uint32, sport, dport uint16) []byte {
	b := make([]byte, maps.EventSize)
	le := binary.LittleEndian
	b[0], b[1], b[2], b[3] = typ, reason, dir, verdict
	le.PutUint16(b[4:], ep)
	b[6], b[7] = proto, maps.FamilyIPv4
	le.PutUint32(b[8:], srcID)
	le.PutUint32(b[12:], dstID)
	s, d := netip.MustParseAddr(src).As4(), netip.MustParseAddr(dst).As4()
	copy(b[16:], s[:])
	copy(b[32:], d[:])
	binary.BigEndian.PutUint16(b[48:], sport)
	binary.BigEndian.PutUint16(b[50:], dport)
	le.PutUint32(b[52:], 7)
	le.PutUint32(b[56:], 74)
	le.PutUint64(b[64:], 123456789)
	return b
}

// fakeRecords hands out its records, then fails with end.
type fakeRecords struct {
	recs [][]byte
	end  error
}

func (f *fakeRecords) ReadInto(r *ringbuf.Record) error {
	if len(f.recs) == 0 {
		return f.end
	}
	r.RawSample, f.recs = f.recs[0], f.recs[1:]
	return nil
}

type collect []hub.Event

func (c *collect) Publish(ev hub.Event) { *c = append(*c, ev) }

var t0 = time.Date(2026, 12, 1, 6, 0, 0, 0, time.UTC)

func TestReaderPublishesDecodedEvents(t *testing.T) {
	recs := &fakeRecords{recs: [][]byte{
		record(1, 133, 1, 0, 1234, 6, "10.0.0.2", "10.0.0.3", 5678, 1234, 43210, 80),
		{1, 2, 3}, // too short: skipped
		record(5, 181, 2, 2, 1234, 17, "10.0.0.3", "10.0.0.9", 1234, 2, 5353, 53),
		record(4, 5, 2, 0, 1234, 1, "10.0.0.3", "10.0.0.9", 1234, 2, 77, 0),
		record(5, 0, 1, 1, 1234, 6, "10.0.0.2", "10.0.0.3", 5678, 1234, 43211, 80),
	}, end: fmt.Errorf("read: %w", ringbuf.ErrClosed)}
	var got collect
	r := NewReader(recs, &got)
	r.clock = func(k uint64) time.Time {
		if k != 123456789 {
			t.Errorf("clock got ktime %d", k)
		}
		return t0
	}
	if err := r.Run(); err != nil {
		t.Fatalf("Run = %v, want nil once the ring buffer is closed", err)
	}
	a, b := netip.MustParseAddr("10.0.0.2"), netip.MustParseAddr("10.0.0.3")
	c := netip.MustParseAddr("10.0.0.9")
	want := []hub.Event{
		{Type: hub.TypeDrop, Timestamp: t0, Reason: 133, ReasonName: "Policy denied", Direction: hub.DirectionIngress,
			EndpointID: 1234, SrcIdentity: 5678, DstIdentity: 1234, SrcIP: a, DstIP: b, SrcPort: 43210, DstPort: 80,
			Protocol: 6, Ifindex: 7, Length: 74},
		{Type: hub.TypePolicyVerdict, Timestamp: t0, Reason: 181, ReasonName: "Policy denied by denylist",
			Direction: hub.DirectionEgress, Verdict: hub.VerdictDeny, EndpointID: 1234, SrcIdentity: 1234, DstIdentity: 2,
			SrcIP: b, DstIP: c, SrcPort: 5353, DstPort: 53, Protocol: 17, Ifindex: 7, Length: 74},
		{Type: hub.TypeTrace, Timestamp: t0, Reason: 5, ReasonName: "from-endpoint", Direction: hub.DirectionEgress,
			EndpointID: 1234, SrcIdentity: 1234, DstIdentity: 2, SrcIP: b, DstIP: c, SrcPort: 77, Protocol: 1, Ifindex: 7, Length: 74},
		{Type: hub.TypePolicyVerdict, Timestamp: t0, Direction: hub.DirectionIngress, Verdict: hub.VerdictAllow,
			EndpointID: 1234, SrcIdentity: 5678, DstIdentity: 1234, SrcIP: a, DstIP: b, SrcPort: 43211, DstPort: 80,
			Protocol: 6, Ifindex: 7, Length: 74},
	}
	if len(got) != len(want) {
		t.Fatalf("published %d events, want %d: %+v", len(got), len(want), got)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("event %d:\n got %+v\nwant %+v", i, got[i], want[i])
		}
	}
	if r.Events() != 4 || r.DecodeErrors() != 1 {
		t.Errorf("Events %d, DecodeErrors %d; want 4 and 1", r.Events(), r.DecodeErrors())
	}
}

func TestReaderReturnsReadErrors(t *testing.T) {
	boom := errors.New("boom")
	var got collect
	err := NewReader(&fakeRecords{end: boom}, &got).Run()
	if !errors.Is(err, boom) || err.Error() != "read cellium_events: boom" {
		t.Errorf("Run = %v", err)
	}
}

func TestKtimeToWall(t *testing.T) {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		t.Fatal(err)
	}
	before := time.Now()
	// An event of one second ago is about one second before now (the
	// bounds allow for a slow machine; this is not a timing assertion).
	got := KtimeToWall(uint64(ts.Nano()) - uint64(time.Second))
	if d := before.Sub(got); d < 500*time.Millisecond || d > time.Minute {
		t.Errorf("KtimeToWall(now-1s) = %v, %v before now", got, d)
	}
}

// TestConvertNewFields: a version 2 record's TCP flags, ICMP type and
// code, reply direction and original destination reach the hub's event.
func TestConvertNewFields(t *testing.T) {
	b := record(4, 3, 2, 0, 1234, 6, "10.0.0.2", "10.0.0.3", 5678, 1234, 43210, 8080)
	b[60] = maps.EventVersion
	b[61] = 0x12        // SYN, ACK
	b[72] = 1<<0 | 1<<1 // reply, known
	b[72] |= 1 << 2     // with the original destination
	binary.BigEndian.PutUint16(b[74:], 80)
	copy(b[76:], []byte{10, 96, 0, 10})
	e, err := maps.DecodeEvent(b)
	if err != nil {
		t.Fatal(err)
	}
	got := Convert(e, t0)
	if got.TCPFlags != 0x12 || !got.IsReply || !got.ReplyKnown || got.OrigDstIP != netip.MustParseAddr("10.96.0.10") ||
		got.OrigDstPort != 80 || got.ReasonName != "to-stack" {
		t.Errorf("converted %+v", got)
	}

	b = record(1, 133, 1, 0, 1234, 1, "10.0.0.2", "10.0.0.3", 5678, 1234, 0, 0)
	b[60] = maps.EventVersion
	b[62], b[63] = 8, 0
	b[72] = 1 << 1 // known, not a reply
	if e, err = maps.DecodeEvent(b); err != nil {
		t.Fatal(err)
	}
	got = Convert(e, t0)
	if got.ICMPType != 8 || got.ICMPCode != 0 || got.IsReply || !got.ReplyKnown || got.OrigDstIP.IsValid() {
		t.Errorf("converted %+v", got)
	}
}
