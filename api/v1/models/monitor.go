package models

import "time"

// The event types of GET /v1/monitor: Cilium's names for its datapath
// message types, plus MonitorTypeLost.
const (
	MonitorTypeDrop          = "drop"
	MonitorTypeTrace         = "trace"
	MonitorTypePolicyVerdict = "policy-verdict"
	// MonitorTypeLost is not a datapath event: it tells the reader that
	// Lost events did not reach it because it read too slowly.
	MonitorTypeLost = "lost"
)

// MonitorEvent is one line of GET /v1/monitor (newline-delimited JSON)
// and of `cellium monitor -o json`.
type MonitorEvent struct {
	// Type is drop, trace, policy-verdict or lost.
	Type string `json:"type"`
	// Timestamp is when the datapath saw the packet.
	Timestamp time.Time `json:"timestamp"`
	// EndpointID is the local endpoint whose program saw the packet.
	EndpointID uint16 `json:"endpoint-id,omitempty"`
	// ReasonCode and Reason are a drop's reason, as Cilium numbers and
	// words it (133, "Policy denied"); a deny or audit policy verdict
	// carries the reason the policy gave.
	ReasonCode uint8  `json:"reason-code,omitempty"`
	Reason     string `json:"reason,omitempty"`
	// ObservationPointCode and ObservationPoint are where a trace saw the
	// packet, as Cilium numbers and names it (0, "to-endpoint").
	ObservationPointCode uint8  `json:"observation-point-code,omitempty"`
	ObservationPoint     string `json:"observation-point,omitempty"`
	// Verdict is a policy verdict's outcome: allow, deny or audit.
	Verdict string `json:"verdict,omitempty"`
	// Direction is ingress (to the endpoint) or egress (from it).
	Direction string `json:"direction,omitempty"`
	// SrcIdentity and DstIdentity are the security identities of the
	// packet's source and destination.
	SrcIdentity uint32 `json:"src-identity"`
	DstIdentity uint32 `json:"dst-identity"`
	// SrcIP, DstIP, SrcPort and DstPort are the packet's addresses.
	SrcIP   string `json:"src-ip,omitempty"`
	DstIP   string `json:"dst-ip,omitempty"`
	SrcPort uint16 `json:"src-port,omitempty"`
	DstPort uint16 `json:"dst-port,omitempty"`
	// Protocol is the IP protocol: tcp, udp, icmp, icmpv6, sctp or its
	// number.
	Protocol string `json:"protocol,omitempty"`
	// Ifindex is the interface the program is attached to.
	Ifindex uint32 `json:"ifindex,omitempty"`
	// Length is the packet's length in bytes.
	Length uint32 `json:"length,omitempty"`
	// TCPFlags are a TCP packet's flags, FIN first: "SYN, ACK".
	TCPFlags string `json:"tcp-flags,omitempty"`
	// ICMPType and ICMPCode are an ICMP packet's type and code.
	ICMPType *uint8 `json:"icmp-type,omitempty"`
	ICMPCode *uint8 `json:"icmp-code,omitempty"`
	// IsReply says whether conntrack saw the packet as a reply; absent
	// when the datapath did not look it up.
	IsReply *bool `json:"is-reply,omitempty"`
	// OrigDstIP and OrigDstPort are the destination before the socket
	// load balancer translated it: the Service's ClusterIP and port.
	OrigDstIP   string `json:"orig-dst-ip,omitempty"`
	OrigDstPort uint16 `json:"orig-dst-port,omitempty"`
	// Lost, for type lost, counts the events this reader missed since the
	// previous lost record.
	Lost uint64 `json:"lost,omitempty"`
}
