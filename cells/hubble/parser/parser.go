package parser

import (
	"bufio"
	"crypto/rand"
	"errors"
	"fmt"
	"sync"
	"time"

	flowpb "github.com/cilium/cilium/api/v1/flow"
	"github.com/google/uuid"
	"google.golang.org/protobuf/types/known/timestamppb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/cellium/cellium/statedb/endpoints"
	"github.com/cellium/cellium/statedb/identity"
	"github.com/cellium/cellium/statedb/monitor"
)

// EmitterName is the emitter every flow names (Flow.Emitter.Name), the
// name Hubble's own agent gives.
const EmitterName = "Hubble"

// Cilium's numbers the flows carry.
const (
	// DropPolicyDenied is the drop reason of a packet no policy entry
	// allowed (Cilium's DROP_POLICY, "Policy denied").
	DropPolicyDenied = 133
	// DropPolicyDeny is the drop reason of a packet a deny entry matched
	// (Cilium's DROP_POLICY_DENY, "Policy denied by denylist").
	DropPolicyDeny = 181
)

// ErrUnknownEventType is returned for an event whose type is not a drop,
// a trace or a policy verdict.
var ErrUnknownEventType = errors.New("unknown event type")

// Parser converts monitor events into flows. It is safe for concurrent
// use. The zero Parser is not usable; call New.
type Parser struct {
	src      Sources
	nodeName string
	now      func() time.Time

	uuidMu  sync.Mutex
	uuidRnd *bufio.Reader

	nodes    nodeExtensions
	policies policyCache
	reserved map[identity.NumericIdentity][]string // labels of the reserved identities
}

// emitter is shared by every flow: flows are immutable once made.
var emitter = &flowpb.Emitter{Name: EmitterName}

// New returns a parser naming nodeName as the node flows are captured on
// and enriching from src.
func New(nodeName string, src Sources) *Parser {
	p := &Parser{src: src, nodeName: nodeName, now: time.Now,
		// 16 bytes per UUID: one read of crypto/rand per 256 flows.
		uuidRnd:  bufio.NewReaderSize(rand.Reader, 16*256),
		reserved: map[identity.NumericIdentity][]string{}}
	for _, r := range identity.AllReserved() {
		p.reserved[r.ID] = SortedLabels(r.Labels)
	}
	return p
}

// NodeName returns the node the parser names in flows.
func (p *Parser) NodeName() string { return p.nodeName }

// Parse converts ev into a new flow.
//
// Errors: ErrUnknownEventType (wrapped, naming the type) for an event
// that is not a drop, trace or policy verdict.
func (p *Parser) Parse(ev *monitor.Event) (*flowpb.Flow, error) {
	switch ev.Type {
	case monitor.TypeDrop, monitor.TypeTrace, monitor.TypePolicyVerdict:
	default:
		return nil, fmt.Errorf("event of type %d: %w", uint8(ev.Type), ErrUnknownEventType)
	}
	ts := ev.Timestamp
	if ts.IsZero() {
		ts = p.now()
	}
	f := &flowpb.Flow{
		Time:      timestamppb.New(ts),
		Uuid:      p.newUUID(),
		Emitter:   emitter,
		Type:      flowpb.FlowType_L3_L4,
		NodeName:  p.nodeName,
		EventType: &flowpb.CiliumEventType{Type: int32(ev.Type)},
	}
	src, dst := ev.SrcIP.Unmap(), ev.DstIP.Unmap()
	if src.IsValid() && dst.IsValid() {
		f.IP = &flowpb.IP{Source: src.String(), Destination: dst.String(), IpVersion: flowpb.IPVersion_IPv4}
		if src.Is6() {
			f.IP.IpVersion = flowpb.IPVersion_IPv6
		}
	}
	f.L4 = layer4(ev)
	f.Summary = summary(ev) //nolint:staticcheck // deprecated in the proto, still what the hubble CLI's compact output prints
	if p.src.NodeLabels != nil {
		f.NodeLabels = p.src.NodeLabels.NodeLabels(p.nodeName)
	}

	switch ev.Type {
	case monitor.TypeDrop:
		f.Verdict = flowpb.Verdict_DROPPED
		f.DropReason = uint32(ev.Reason)
		f.DropReasonDesc = flowpb.DropReason(ev.Reason)
		f.EventType.SubType = int32(ev.Reason)
	case monitor.TypeTrace:
		f.Verdict = flowpb.Verdict_FORWARDED
		f.EventType.SubType = int32(ev.Reason)
		f.TraceObservationPoint = ObservationPoint(ev.Reason)
	case monitor.TypePolicyVerdict:
		switch ev.Verdict {
		case monitor.VerdictAllow:
			f.Verdict = flowpb.Verdict_FORWARDED
		case monitor.VerdictDeny:
			f.Verdict = flowpb.Verdict_DROPPED
			reason := uint32(ev.Reason)
			if reason == 0 {
				reason = DropPolicyDenied
			}
			f.DropReason = reason
			f.DropReasonDesc = flowpb.DropReason(reason)
		case monitor.VerdictAudit:
			f.Verdict = flowpb.Verdict_AUDIT
		}
	}
	f.IsReply = isReply(ev)
	f.Reply = f.IsReply.GetValue() //nolint:staticcheck // the deprecated field older clients read
	f.TrafficDirection = trafficDirection(ev)

	srcEnd := p.endpoint(src, ev.SrcIdentity)
	dstEnd := p.endpoint(dst, ev.DstIdentity)
	f.Source, f.Destination = srcEnd.flow, dstEnd.flow
	f.Extensions = p.nodes.get(srcEnd.node, dstEnd.node)
	if ev.Type == monitor.TypeTrace && ev.Ifindex != 0 {
		f.Interface = iface(ev.Ifindex, srcEnd.local, dstEnd.local)
	}
	p.services(f, ev, src, dst)
	if ev.Type == monitor.TypePolicyVerdict || ev.Type == monitor.TypeDrop && isPolicyDrop(ev.Reason) {
		p.provenance(f, ev)
	}
	return f, nil
}

// LostEvent returns the LostEvent of n events lost by the flow
// producer's subscription to the monitor hub (Hubble's events queue
// overflowing), between first and last.
func LostEvent(n uint64, first, last time.Time) *flowpb.LostEvent {
	l := &flowpb.LostEvent{Source: flowpb.LostEventSource_OBSERVER_EVENTS_QUEUE, NumEventsLost: n}
	if !first.IsZero() {
		l.First = timestamppb.New(first)
	}
	if !last.IsZero() {
		l.Last = timestamppb.New(last)
	}
	return l
}

func (p *Parser) newUUID() string {
	p.uuidMu.Lock()
	id, err := uuid.NewRandomFromReader(p.uuidRnd)
	p.uuidMu.Unlock()
	if err != nil {
		// crypto/rand does not fail on Linux; a flow without a UUID is
		// still a flow.
		return ""
	}
	return id.String()
}

// ObservationPoint maps a trace's observation point (Cilium's TRACE_*
// number) to Hubble's enum: the numbers are the same except 0
// (to-endpoint), which Hubble names TO_ENDPOINT.
func ObservationPoint(obs uint8) flowpb.TraceObservationPoint {
	if obs == 0 {
		return flowpb.TraceObservationPoint_TO_ENDPOINT
	}
	return flowpb.TraceObservationPoint(obs)
}

func isPolicyDrop(reason uint8) bool { return reason == DropPolicyDenied || reason == DropPolicyDeny }

// layer4 returns the flow's L4 part, nil for protocols Hubble has none
// for.
func layer4(ev *monitor.Event) *flowpb.Layer4 {
	switch ev.Protocol {
	case 6:
		tcp := &flowpb.TCP{SourcePort: uint32(ev.SrcPort), DestinationPort: uint32(ev.DstPort)}
		if ev.TCPFlags != 0 {
			tcp.Flags = TCPFlags(ev.TCPFlags)
		}
		return &flowpb.Layer4{Protocol: &flowpb.Layer4_TCP{TCP: tcp}}
	case 17:
		return &flowpb.Layer4{Protocol: &flowpb.Layer4_UDP{UDP: &flowpb.UDP{SourcePort: uint32(ev.SrcPort), DestinationPort: uint32(ev.DstPort)}}}
	case 1:
		return &flowpb.Layer4{Protocol: &flowpb.Layer4_ICMPv4{ICMPv4: &flowpb.ICMPv4{Type: uint32(ev.ICMPType), Code: uint32(ev.ICMPCode)}}}
	case 58:
		return &flowpb.Layer4{Protocol: &flowpb.Layer4_ICMPv6{ICMPv6: &flowpb.ICMPv6{Type: uint32(ev.ICMPType), Code: uint32(ev.ICMPCode)}}}
	case 132:
		return &flowpb.Layer4{Protocol: &flowpb.Layer4_SCTP{SCTP: &flowpb.SCTP{SourcePort: uint32(ev.SrcPort), DestinationPort: uint32(ev.DstPort)}}}
	}
	return nil
}

// TCPFlags converts the TCP header's flags byte.
func TCPFlags(b uint8) *flowpb.TCPFlags {
	return &flowpb.TCPFlags{
		FIN: b&0x01 != 0, SYN: b&0x02 != 0, RST: b&0x04 != 0, PSH: b&0x08 != 0,
		ACK: b&0x10 != 0, URG: b&0x20 != 0, ECE: b&0x40 != 0, CWR: b&0x80 != 0,
	}
}

// isReply is known when the datapath looked the packet up in conntrack.
// A policy verdict that let the packet pass is on the first packet of a
// connection, so not a reply (as Hubble assumes); a drop is unknown.
func isReply(ev *monitor.Event) *wrapperspb.BoolValue {
	switch {
	case ev.ReplyKnown:
		return wrapperspb.Bool(ev.IsReply)
	case ev.Type == monitor.TypePolicyVerdict && ev.Verdict != monitor.VerdictDeny:
		return wrapperspb.Bool(false)
	}
	return nil
}

// trafficDirection is the direction of the connection relative to the
// endpoint that saw the packet. Drops and policy verdicts are on the
// packet's direction. A trace of a reply is in the connection's opposite
// direction; a trace whose reply flag is unknown, or that no endpoint
// saw, has no direction (as in Hubble).
func trafficDirection(ev *monitor.Event) flowpb.TrafficDirection {
	d := ev.Direction
	if ev.Type == monitor.TypeTrace {
		if !ev.ReplyKnown || ev.EndpointID == 0 {
			return flowpb.TrafficDirection_TRAFFIC_DIRECTION_UNKNOWN
		}
		if ev.IsReply {
			switch d {
			case monitor.DirectionIngress:
				d = monitor.DirectionEgress
			case monitor.DirectionEgress:
				d = monitor.DirectionIngress
			}
		}
	}
	switch d {
	case monitor.DirectionIngress:
		return flowpb.TrafficDirection_INGRESS
	case monitor.DirectionEgress:
		return flowpb.TrafficDirection_EGRESS
	}
	return flowpb.TrafficDirection_TRAFFIC_DIRECTION_UNKNOWN
}

// iface is the interface a trace was seen on, named when it is a local
// endpoint's host-side veth.
func iface(ifindex uint32, eps ...*endpoints.Endpoint) *flowpb.NetworkInterface {
	ni := &flowpb.NetworkInterface{Index: ifindex}
	for _, ep := range eps {
		if ep != nil && ep.HostIfIndex == int(ifindex) {
			ni.Name = ep.HostIfName
			break
		}
	}
	return ni
}

// icmpTypeNames are the ICMPv4 types a summary names.
var icmpTypeNames = map[uint8]string{
	0: "EchoReply", 3: "DestinationUnreachable", 5: "Redirect", 8: "EchoRequest", 11: "TimeExceeded",
}

// summary is the flow's one-line description, which the hubble CLI's
// compact output prints at the end of a line: "TCP Flags: SYN, ACK",
// "UDP", "ICMPv4 EchoRequest".
func summary(ev *monitor.Event) string {
	switch ev.Protocol {
	case 6:
		if ev.TCPFlags == 0 {
			return "TCP"
		}
		return "TCP Flags: " + monitor.TCPFlagsString(ev.TCPFlags)
	case 17:
		return "UDP"
	case 1:
		if name, ok := icmpTypeNames[ev.ICMPType]; ok {
			return "ICMPv4 " + name
		}
		return fmt.Sprintf("ICMPv4 type %d code %d", ev.ICMPType, ev.ICMPCode)
	}
	if ev.SrcIP.Is6() {
		return "IPv6"
	}
	return "IPv4"
}
