package bpf_test

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/cellium/cellium/datapath/bpf"
	"github.com/cellium/cellium/datapath/maps"
	"github.com/cellium/cellium/statedb/identity"
	"github.com/cellium/cellium/statedb/policy"
	"github.com/cellium/cellium/test/privileged"
)

// eventsRange holds the pods of the event tests; the root namespace
// blackholes it while they run (their traffic stays in the test's own
// namespaces anyway).
var eventsRange = netip.MustParsePrefix("10.76.0.0/16")

// eventPair is two pods a and b on one test node with programs that
// trace at aggregation level agg; b allows ingress from a's identity
// only (so the first packet of a connection to b has a policy verdict).
type eventPair struct {
	m      *maps.Maps
	events *eventReader
	a, b   *testPod
}

const (
	evIDA, evIDB identity.NumericIdentity = 1501, 1502
	evEpA, evEpB uint16                   = 51, 52
)

func newEventPair(t *testing.T, agg bpf.Aggregation) *eventPair {
	t.Helper()
	blackholeRange(t, eventsRange)
	m, dir := openMaps(t)
	x := &eventPair{m: m, events: newEventReader(t, m)}
	node := newTestNode(t)
	x.a = node.addPod(t, "ea", netip.MustParseAddr("10.76.0.10"))
	x.b = node.addPod(t, "eb", netip.MustParseAddr("10.76.0.11"))
	registerPod(t, m, x.a, evIDA, evEpA)
	registerPod(t, m, x.b, evIDB, evEpB)
	polA, polB := openPolicy(t, dir, evEpA), openPolicy(t, dir, evEpB)
	if err := polA.BatchUpdate([]policy.Entry{allowAllIngress, allowAllEgress}); err != nil {
		t.Fatal(err)
	}
	if err := polB.BatchUpdate([]policy.Entry{allowAllEgress,
		{Key: policy.NewKey(evIDA, policy.Ingress, policy.ProtoAny, 0, 0)}}); err != nil {
		t.Fatal(err)
	}
	node.attach(t, x.a, loadEndpoint(t, m, polA, endpointConfig{ID: evEpA, Identity: evIDA,
		IfIndex: uint32(x.a.res.HostIfIndex), MAC: x.a.res.PodMAC, IPv4: x.a.ip, Trace: true, Aggregation: agg}))
	node.attach(t, x.b, loadEndpoint(t, m, polB, endpointConfig{ID: evEpB, Identity: evIDB,
		IfIndex: uint32(x.b.res.HostIfIndex), MAC: x.b.res.PodMAC, IPv4: x.b.ip, Trace: true, Aggregation: agg}))
	return x
}

// settle drains the ring buffer until it stays empty for a moment, so
// late events of the previous step are not counted in the next.
func (x *eventPair) settle(t *testing.T) []maps.Event {
	t.Helper()
	var out []maps.Event
	for {
		time.Sleep(200 * time.Millisecond)
		evs := x.events.drain(t)
		if len(evs) == 0 {
			return out
		}
		out = append(out, evs...)
	}
}

func findEvent(evs []maps.Event, match func(maps.Event) bool) (maps.Event, bool) {
	for _, e := range evs {
		if match(e) {
			return e, true
		}
	}
	return maps.Event{}, false
}

// TestPrivilegedEventsTCPFlagsAndReply: a TCP connection from pod a to pod
// b through the programs (aggregation none, every packet traced). The SYN
// is traced leaving a (from-endpoint, then to-stack) and arriving at b
// (to-endpoint) with flags SYN and conntrack's word "not a reply"; the
// SYN-ACK leaving b and arriving at a with flags SYN, ACK and "reply".
// Every event is of the current layout version.
func TestPrivilegedEventsTCPFlagsAndReply(t *testing.T) {
	privileged.Require(t)
	x := newEventPair(t, bpf.AggregationNone)
	x.b.serveEcho(t, 8080)
	dst := netip.AddrPortFrom(x.b.ip, 8080)
	if err := x.a.tcpEcho(dst); err != nil {
		t.Fatal(err)
	}
	evs := x.settle(t)
	const syn, synAck = bpf.TCPFlagSYN, bpf.TCPFlagSYN | bpf.TCPFlagACK
	for _, c := range []struct {
		ep     uint16
		obs    uint8
		flags  uint8
		reply  bool
		src    netip.Addr
		what   string
		traced bool
	}{
		{evEpA, maps.TraceFromLxc, syn, false, x.a.ip, "SYN leaving a (from-endpoint)", true},
		{evEpA, maps.TraceToStack, syn, false, x.a.ip, "SYN leaving a (to-stack)", true},
		{evEpB, maps.TraceToLxc, syn, false, x.a.ip, "SYN arriving at b (to-endpoint)", true},
		{evEpB, maps.TraceFromLxc, synAck, true, x.b.ip, "SYN-ACK leaving b (from-endpoint)", true},
		{evEpB, maps.TraceToStack, synAck, true, x.b.ip, "SYN-ACK leaving b (to-stack)", true},
		{evEpA, maps.TraceToLxc, synAck, true, x.b.ip, "SYN-ACK arriving at a (to-endpoint)", true},
	} {
		e, ok := findEvent(evs, func(e maps.Event) bool {
			return e.Type == maps.EventTrace && e.EndpointID == c.ep && e.Reason == c.obs && e.Proto == 6 &&
				e.Src == c.src && e.TCPFlags == c.flags
		})
		if !ok {
			t.Errorf("%s: no trace event with flags %s; saw:\n%s", c.what, maps.TCPFlagsString(c.flags), eventList(evs))
			continue
		}
		if !e.ReplyKnown || e.IsReply != c.reply {
			t.Errorf("%s: reply known %v, is reply %v; want known, reply %v", c.what, e.ReplyKnown, e.IsReply, c.reply)
		}
	}
	// b's policy verdict on the SYN carries it too.
	if e, ok := findEvent(evs, func(e maps.Event) bool {
		return e.Type == maps.EventPolicyVerdict && e.EndpointID == evEpB && e.Proto == 6
	}); !ok || e.TCPFlags != syn || !e.ReplyKnown || e.IsReply || e.Verdict != maps.VerdictAllowed {
		t.Errorf("policy verdict of b on the SYN: %v (found %v), want allowed, flags SYN, not a reply", e, ok)
	}
	for _, e := range evs {
		if e.Version != maps.EventVersion {
			t.Errorf("event of version %d, want %d: %v", e.Version, maps.EventVersion, e)
		}
	}
}

// TestPrivilegedEventsICMP: an ICMP echo from a to b and its reply carry
// the ICMP type and code (8/0 request, 0/0 reply) and the reply
// direction.
func TestPrivilegedEventsICMP(t *testing.T) {
	privileged.Require(t)
	x := newEventPair(t, bpf.AggregationNone)
	if err := x.a.rawPing(x.b.ip); err != nil {
		t.Fatal(err)
	}
	evs := x.settle(t)
	for _, c := range []struct {
		ep    uint16
		obs   uint8
		typ   uint8
		reply bool
		what  string
	}{
		{evEpA, maps.TraceFromLxc, 8, false, "echo request leaving a"},
		{evEpB, maps.TraceToLxc, 8, false, "echo request arriving at b"},
		{evEpB, maps.TraceFromLxc, 0, true, "echo reply leaving b"},
		{evEpA, maps.TraceToLxc, 0, true, "echo reply arriving at a"},
	} {
		e, ok := findEvent(evs, func(e maps.Event) bool {
			return e.Type == maps.EventTrace && e.EndpointID == c.ep && e.Reason == c.obs && e.Proto == 1 && e.ICMPType == c.typ
		})
		if !ok {
			t.Errorf("%s: no trace with ICMP type %d; saw:\n%s", c.what, c.typ, eventList(evs))
			continue
		}
		if e.ICMPCode != 0 || !e.ReplyKnown || e.IsReply != c.reply || e.TCPFlags != 0 {
			t.Errorf("%s: %v: code %d, reply known %v, is reply %v, tcp flags %d; want code 0, known, reply %v, no flags",
				c.what, e, e.ICMPCode, e.ReplyKnown, e.IsReply, e.TCPFlags, c.reply)
		}
	}
}

// TestPrivilegedEventsAggregation counts the trace events of one TCP
// connection carrying N request/response round trips: with aggregation
// none every packet is traced at every observation point (at least 6 per
// round trip); with medium only the connection's news is (SYN, the first
// reply, FINs: a handful, whatever N), never at from-endpoint, while
// policy verdicts stay one per connection.
func TestPrivilegedEventsAggregation(t *testing.T) {
	privileged.Require(t)
	const n = 30
	count := func(t *testing.T, agg bpf.Aggregation) (traces, fromLxc, verdicts int) {
		x := newEventPair(t, agg)
		x.b.serveEcho(t, 8080)
		x.settle(t)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		c, err := x.a.dial(ctx, netip.AddrPortFrom(x.b.ip, 8080))
		if err != nil {
			t.Fatal(err)
		}
		for i := range n {
			if err := roundTrip(c, fmt.Sprintf("message %d", i)); err != nil {
				c.Close()
				t.Fatal(err)
			}
		}
		c.Close()
		for _, e := range x.settle(t) {
			if e.Proto != 6 {
				continue
			}
			switch e.Type {
			case maps.EventTrace:
				traces++
				if e.Reason == maps.TraceFromLxc {
					fromLxc++
				}
			case maps.EventPolicyVerdict:
				verdicts++
			}
		}
		t.Logf("aggregation %s: %d round trips, %d TCP trace events (%d from-endpoint), %d policy verdicts",
			agg, n, traces, fromLxc, verdicts)
		return traces, fromLxc, verdicts
	}
	var none, medium int
	t.Run("none", func(t *testing.T) {
		traces, fromLxc, verdicts := count(t, bpf.AggregationNone)
		none = traces
		if traces < 6*n || fromLxc == 0 || verdicts != 1 {
			t.Errorf("none: %d traces (%d from-endpoint), %d verdicts; want >= %d traces, some from-endpoint, 1 verdict",
				traces, fromLxc, verdicts, 6*n)
		}
	})
	t.Run("medium", func(t *testing.T) {
		traces, fromLxc, verdicts := count(t, bpf.AggregationMedium)
		medium = traces
		// SYN (a to-stack, b to-endpoint), first reply (b to-stack, a
		// to-endpoint), a FIN each way (2 each): 8; a few more if two
		// CPUs race on an entry.
		if traces < 4 || traces > 12 || fromLxc != 0 || verdicts != 1 {
			t.Errorf("medium: %d traces (%d from-endpoint), %d verdicts; want 4 to 12, none from-endpoint, 1 verdict",
				traces, fromLxc, verdicts)
		}
	})
	t.Logf("trace events for %d round trips: none %d, medium %d", n, none, medium)
}

func eventList(evs []maps.Event) string {
	var out string
	for _, e := range evs {
		out += "  " + e.String() + "\n"
	}
	return out
}
