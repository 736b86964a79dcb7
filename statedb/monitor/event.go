package monitor

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"
)

// Type is the kind of an event, numbered as Cilium's datapath message
// types.
type Type uint8

// The event types the datapath emits.
const (
	// TypeDrop is a dropped packet (Cilium's CILIUM_NOTIFY_DROP).
	TypeDrop Type = 1
	// TypeTrace is a packet seen at an observation point.
	TypeTrace Type = 4
	// TypePolicyVerdict is the policy decision on the first packet of a
	// connection.
	TypePolicyVerdict Type = 5
)

// Types lists every event type, in the order `cellium monitor --help`
// names them.
var Types = []Type{TypeDrop, TypeTrace, TypePolicyVerdict}

// String returns Cilium's name of the type: drop, trace, policy-verdict.
func (t Type) String() string {
	switch t {
	case TypeDrop:
		return "drop"
	case TypeTrace:
		return "trace"
	case TypePolicyVerdict:
		return "policy-verdict"
	}
	return fmt.Sprintf("type-%d", uint8(t))
}

// ParseType parses a type name as String prints it.
//
// Errors: an error naming the valid types when s is none of them.
func ParseType(s string) (Type, error) {
	for _, t := range Types {
		if t.String() == s {
			return t, nil
		}
	}
	names := make([]string, len(Types))
	for i, t := range Types {
		names[i] = t.String()
	}
	return 0, fmt.Errorf("unknown event type %q: use one of %s", s, strings.Join(names, ", "))
}

// Direction is the direction of traffic relative to the endpoint,
// numbered as Cilium's METRIC_INGRESS / METRIC_EGRESS.
type Direction uint8

// The directions.
const (
	DirectionUnknown Direction = 0
	// DirectionIngress is traffic going to the endpoint.
	DirectionIngress Direction = 1
	// DirectionEgress is traffic leaving the endpoint.
	DirectionEgress Direction = 2
)

// String returns "ingress", "egress" or "unknown".
func (d Direction) String() string {
	switch d {
	case DirectionIngress:
		return "ingress"
	case DirectionEgress:
		return "egress"
	}
	return "unknown"
}

// Verdict is the outcome of a policy verdict event.
type Verdict uint8

// The verdicts, numbered as the datapath reports them.
const (
	VerdictNone Verdict = 0
	// VerdictAllow: the policy allows the connection.
	VerdictAllow Verdict = 1
	// VerdictDeny: the policy denies it; the packet is dropped.
	VerdictDeny Verdict = 2
	// VerdictAudit: the policy would deny it, audit mode let it pass.
	VerdictAudit Verdict = 3
)

// String returns Cilium's word for the verdict: allow, deny, audit (or
// "none").
func (v Verdict) String() string {
	switch v {
	case VerdictAllow:
		return "allow"
	case VerdictDeny:
		return "deny"
	case VerdictAudit:
		return "audit"
	}
	return "none"
}

// Event is one datapath event. It is a plain value: the hub copies it to
// each subscriber.
type Event struct {
	// Type says which of the fields below are meaningful.
	Type Type
	// Timestamp is when the datapath saw the packet.
	Timestamp time.Time
	// Reason is, for a drop, Cilium's drop reason code (133 = Policy
	// denied); for a trace, Cilium's observation point (0 = to-endpoint,
	// 5 = from-endpoint).
	Reason uint8
	// ReasonName is Reason in Cilium's words ("Policy denied",
	// "to-endpoint"), filled by the publisher.
	ReasonName string
	// Direction is relative to EndpointID.
	Direction Direction
	// Verdict is set for policy verdicts only.
	Verdict Verdict
	// EndpointID is the local endpoint whose program saw the packet.
	EndpointID uint16
	// SrcIdentity and DstIdentity are the security identities of the
	// packet's source and destination.
	SrcIdentity, DstIdentity uint32
	// SrcIP, DstIP, SrcPort and DstPort are the packet's addresses; ports
	// are zero for protocols without them.
	SrcIP, DstIP     netip.Addr
	SrcPort, DstPort uint16
	// Protocol is the IP protocol number (6 TCP, 17 UDP, 1 ICMP).
	Protocol uint8
	// Ifindex is the interface the program is attached to.
	Ifindex uint32
	// Length is the packet's length in bytes.
	Length uint32
	// TCPFlags are the TCP header's flags (FIN 0x01, SYN 0x02, RST 0x04,
	// PSH 0x08, ACK 0x10, URG 0x20, ECE 0x40, CWR 0x80) when Protocol is 6;
	// 0 for an IP fragment after the first (it has no TCP header).
	TCPFlags uint8
	// ICMPType and ICMPCode are the ICMP header's type and code when
	// Protocol is 1 (a fragment after the first: its first fragment's
	// type, code 0).
	ICMPType, ICMPCode uint8
	// IsReply is true when conntrack saw the packet as a reply of a
	// connection the other side opened; ReplyKnown says whether IsReply
	// is meaningful (the datapath looked the packet up in conntrack: not
	// for drops before conntrack, ICMP errors passed as related, nor the
	// tunnel device's programs).
	IsReply, ReplyKnown bool
	// OrigDstIP and OrigDstPort are the destination before a service
	// translation (a ClusterIP and its port) when the socket load
	// balancer translated it: on the events of the connection's own
	// direction that the client's veth programs send
	// (Documentation/concepts/service-flows.md); zero otherwise.
	OrigDstIP   netip.Addr
	OrigDstPort uint16
}

// Filter selects events for a subscriber. The zero Filter selects all.
type Filter struct {
	// Types, when not empty, are the only types selected.
	Types []Type
	// EndpointIDs, when not empty, select only these endpoints' events.
	EndpointIDs []uint16
}

// Match reports whether the filter selects ev.
func (f Filter) Match(ev *Event) bool {
	if len(f.Types) > 0 && !slices.Contains(f.Types, ev.Type) {
		return false
	}
	return len(f.EndpointIDs) == 0 || slices.Contains(f.EndpointIDs, ev.EndpointID)
}

// tcpFlagNames are the TCP flags from bit 0 up, as Hubble names them.
var tcpFlagNames = [8]string{"FIN", "SYN", "RST", "PSH", "ACK", "URG", "ECE", "CWR"}

// TCPFlagsString returns the flags set in a TCP header's flags byte, FIN
// first: "SYN, ACK"; "" for none.
func TCPFlagsString(f uint8) string {
	var b strings.Builder
	for i, name := range tcpFlagNames {
		if f&(1<<i) == 0 {
			continue
		}
		if b.Len() > 0 {
			b.WriteString(", ")
		}
		b.WriteString(name)
	}
	return b.String()
}
