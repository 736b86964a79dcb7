package maps

import (
	"encoding/binary"
	"fmt"
	"net/netip"

	"github.com/cellium/cellium/statedb/identity"
	hub "github.com/cellium/cellium/statedb/monitor"
)

// EventType is the kind of an event: Cilium's monitor message types.
type EventType uint8

// The event types the programs emit.
const (
	EventDrop          EventType = 1 // CILIUM_NOTIFY_DROP
	EventTrace         EventType = 4 // CILIUM_NOTIFY_TRACE
	EventPolicyVerdict EventType = 5 // CILIUM_NOTIFY_POLICY_VERDICT
)

// String returns "drop", "trace", "policy-verdict" or the number.
func (t EventType) String() string {
	switch t {
	case EventDrop:
		return "drop"
	case EventTrace:
		return "trace"
	case EventPolicyVerdict:
		return "policy-verdict"
	}
	return fmt.Sprintf("type-%d", uint8(t))
}

// Verdict is the outcome in a policy verdict event.
type Verdict uint8

// Policy verdicts.
const (
	VerdictAllowed Verdict = 1
	VerdictDenied  Verdict = 2
	// VerdictAudit: the policy would deny, audit mode passed the packet.
	VerdictAudit Verdict = 3
)

// String returns "allowed", "denied", "audit" or "".
func (v Verdict) String() string {
	switch v {
	case VerdictAllowed:
		return "allowed"
	case VerdictDenied:
		return "denied"
	case VerdictAudit:
		return "audit"
	}
	return ""
}

// EventSize is the size of one ring buffer record (struct event) of
// EventVersion; EventSizeV1 the size of a version 1 record, which
// DecodeEvent still reads (its programs may run while a newer agent
// reads the ring buffer, until they are reloaded).
const (
	EventSize   = 80
	EventSizeV1 = 72
)

// EventVersion is the record layout the programs write (EVENT_VERSION);
// a version 1 record has 0 in its place.
const EventVersion = 2

// struct event.flags (EVENT_F_*).
const (
	eventFlagReply      = 1 << 0
	eventFlagReplyKnown = 1 << 1
	eventFlagOrigDst    = 1 << 2
)

// Event is one datapath event (struct event), decoded.
type Event struct {
	Type EventType
	// Reason is the drop reason of drops (DropReasonName), the
	// observation point of traces (TraceObsPointName), and for policy
	// verdicts 0 (allowed) or the drop reason the policy gave.
	Reason uint8
	Dir    TrafficDir
	// Verdict is set in policy verdict events.
	Verdict    Verdict
	EndpointID uint16
	// Proto is the IP protocol; 0 when the packet was not parsed that far.
	Proto uint8
	// Src and Dst are invalid (zero Addr) when the packet was not IPv4/6.
	Src, Dst                 netip.Addr
	SrcIdentity, DstIdentity identity.NumericIdentity
	// SrcPort and DstPort are the conntrack ports: for ICMP echoes the
	// echo id as source port of a request and destination port of a reply.
	SrcPort, DstPort uint16
	// IfIndex is the endpoint's host-side veth.
	IfIndex uint32
	// OrigLen is the packet's length.
	OrigLen uint32
	// KtimeNs is the CLOCK_MONOTONIC time of the event.
	KtimeNs uint64
	// Version is the record's layout: 1 or EventVersion.
	Version uint8
	// TCPFlags are the TCP header's flags (0 for a later fragment,
	// whose header is in its first).
	TCPFlags uint8
	// ICMPType and ICMPCode are the ICMP header's (a later fragment: the
	// type its first fragment recorded, code 0).
	ICMPType, ICMPCode uint8
	// IsReply: conntrack found the packet to be a reply; ReplyKnown: it
	// was looked up (IsReply means something).
	IsReply, ReplyKnown bool
	// OrigDst is the destination before the socket load balancer
	// translated it (a ClusterIP and port); invalid when it did not.
	OrigDst     netip.Addr
	OrigDstPort uint16
}

// DecodeEvent decodes one record read from the event ring buffer, of
// version 1 (72 bytes) or EventVersion (80 bytes).
//
// Errors: ErrShortEvent when b is shorter than its version's layout;
// ErrEventVersion when the version is one this build does not know (a
// newer datapath: upgrade the agent).
func DecodeEvent(b []byte) (Event, error) {
	if len(b) < EventSizeV1 {
		return Event{}, fmt.Errorf("%w: %d bytes, want at least %d", ErrShortEvent, len(b), EventSizeV1)
	}
	version := b[60]
	switch version {
	case 0:
		version = 1
	case EventVersion:
		if len(b) < EventSize {
			return Event{}, fmt.Errorf("%w: %d bytes, want %d for version %d", ErrShortEvent, len(b), EventSize, version)
		}
	default:
		return Event{}, fmt.Errorf("%w: version %d, this agent reads 1 and %d", ErrEventVersion, version, EventVersion)
	}
	le := binary.LittleEndian
	e := Event{
		Type:        EventType(b[0]),
		Reason:      b[1],
		Dir:         TrafficDir(b[2]),
		Verdict:     Verdict(b[3]),
		EndpointID:  le.Uint16(b[4:]),
		Proto:       b[6],
		SrcIdentity: identity.NumericIdentity(le.Uint32(b[8:])),
		DstIdentity: identity.NumericIdentity(le.Uint32(b[12:])),
		SrcPort:     binary.BigEndian.Uint16(b[48:]),
		DstPort:     binary.BigEndian.Uint16(b[50:]),
		IfIndex:     le.Uint32(b[52:]),
		OrigLen:     le.Uint32(b[56:]),
		KtimeNs:     le.Uint64(b[64:]),
		Version:     version,
	}
	if version >= 2 {
		e.TCPFlags, e.ICMPType, e.ICMPCode = b[61], b[62], b[63]
		flags := b[72]
		e.IsReply = flags&eventFlagReply != 0
		e.ReplyKnown = flags&eventFlagReplyKnown != 0
		if flags&eventFlagOrigDst != 0 {
			e.OrigDst = netip.AddrFrom4([4]byte(b[76:80]))
			e.OrigDstPort = binary.BigEndian.Uint16(b[74:])
		}
	}
	switch b[7] {
	case FamilyIPv4:
		e.Src = netip.AddrFrom4([4]byte(b[16:20]))
		e.Dst = netip.AddrFrom4([4]byte(b[32:36]))
	case FamilyIPv6:
		e.Src = netip.AddrFrom16([16]byte(b[16:32]))
		e.Dst = netip.AddrFrom16([16]byte(b[32:48]))
	}
	return e, nil
}

// String prints the event on one line, roughly as `cilium monitor` does:
//
//	drop (Policy denied) flow egress ep 42 10.0.0.1:1234 (1000) -> 10.0.0.2:80 (2000) tcp
func (e Event) String() string {
	var what string
	switch e.Type {
	case EventDrop:
		what = fmt.Sprintf("drop (%s)", DropReasonName(e.Reason))
	case EventTrace:
		what = "trace " + TraceObsPointName(e.Reason)
	case EventPolicyVerdict:
		what = "policy-verdict " + e.Verdict.String()
		if e.Reason != 0 {
			what += fmt.Sprintf(" (%s)", DropReasonName(e.Reason))
		}
	default:
		what = e.Type.String()
	}
	out := fmt.Sprintf("%s %s ep %d %s (%d) -> %s (%d) %s", what, e.Dir, e.EndpointID,
		hostPort(e.Src, e.SrcPort), e.SrcIdentity, hostPort(e.Dst, e.DstPort), e.DstIdentity, protoName(e.Proto))
	switch {
	case e.Proto == 6 && e.TCPFlags != 0:
		out += " " + TCPFlagsString(e.TCPFlags)
	case e.Proto == 1 && e.Version >= 2:
		out += fmt.Sprintf(" type %d code %d", e.ICMPType, e.ICMPCode)
	}
	if e.ReplyKnown && e.IsReply {
		out += " reply"
	}
	if e.OrigDst.IsValid() {
		out += " service " + netip.AddrPortFrom(e.OrigDst, e.OrigDstPort).String()
	}
	return out
}

// TCPFlagsString returns the set flags of a TCP header's flags byte,
// "SYN, ACK" (Hubble's order: FIN first), or "" for none.
func TCPFlagsString(f uint8) string { return hub.TCPFlagsString(f) }

func hostPort(a netip.Addr, port uint16) string {
	if !a.IsValid() {
		return "?"
	}
	return netip.AddrPortFrom(a, port).String()
}

func protoName(p uint8) string {
	switch p {
	case 1:
		return "icmp"
	case 6:
		return "tcp"
	case 17:
		return "udp"
	case 58:
		return "icmpv6"
	case 132:
		return "sctp"
	}
	return fmt.Sprintf("proto-%d", p)
}
