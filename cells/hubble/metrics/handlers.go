package metrics

import (
	"slices"
	"strconv"
	"strings"

	flowpb "github.com/cilium/cilium/api/v1/flow"
	"github.com/prometheus/client_golang/prometheus"
)

// Namespace prefixes every Hubble metric, as in Cilium.
const Namespace = "hubble"

// Cilium's monitor message types, as flows carry them in EventType.Type.
const (
	eventDrop          = 1
	eventCapture       = 3
	eventTrace         = 4
	eventPolicyVerdict = 5
	eventAccessLog     = 129
)

// hostIdentity is the reserved identity of the node itself.
const hostIdentity = 1

// traceObservationPoints names EventType.SubType of trace events.
var traceObservationPoints = map[int32]string{
	0: "to-endpoint", 1: "to-proxy", 2: "to-host", 3: "to-stack", 4: "to-overlay",
	5: "from-endpoint", 6: "from-proxy", 7: "from-host", 8: "from-stack", 9: "from-overlay",
	10: "from-network", 11: "to-network", 12: "from-crypto", 13: "to-crypto",
}

// policyMatchTypes names Flow.PolicyMatchType, lower-cased.
var policyMatchTypes = []string{"none", "l3-only", "l3-l4", "l4-only", "all", "l3-proto", "proto-only"}

// lowerVerdicts and lowerDirections are the enums' names, lower-cased once.
var (
	lowerVerdicts   = lowerEnum(flowpb.Verdict_name)
	lowerDirections = lowerEnum(flowpb.TrafficDirection_name)
)

func lowerEnum(names map[int32]string) map[int32]string {
	out := make(map[int32]string, len(names))
	for k, v := range names {
		out[k] = strings.ToLower(v)
	}
	return out
}

func lowerDirection(d flowpb.TrafficDirection) string {
	if s, ok := lowerDirections[int32(d)]; ok {
		return s
	}
	return strings.ToLower(d.String())
}

func lowerVerdict(v flowpb.Verdict) string {
	if s, ok := lowerVerdicts[int32(v)]; ok {
		return s
	}
	return strings.ToLower(v.String())
}

// handler counts flows into one metric.
type handler interface {
	process(f *flowpb.Flow)
	collector() prometheus.Collector
	forgetPod(namespace, name string) int
}

// base is what every handler has: its counter, its context and a buffer of
// label values reused for every flow.
type base struct {
	vec  *prometheus.CounterVec
	ctx  *labeler
	vals []string
	// ctxAt is where the context's labels start in vals.
	ctxAt int
}

func newBase(name, help string, spec Spec, before, after []string) base {
	ctx := newLabeler(spec.Context)
	names := append(append(append([]string{}, before...), ctx.opts.LabelNames()...), after...)
	return base{
		vec:   prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Name: name, Help: help}, names),
		ctx:   ctx,
		vals:  make([]string, len(names)),
		ctxAt: len(before),
	}
}

func (b *base) collector() prometheus.Collector { return b.vec }

func (b *base) fillContext(f *flowpb.Flow) {
	b.ctx.fill(b.vals[b.ctxAt:b.ctxAt+b.ctx.n], f)
}

// inc counts the flow in the series of vals. A label value Prometheus
// refuses (not UTF-8) skips the count instead of panicking, as
// WithLabelValues would.
func (b *base) inc() {
	if c, err := b.vec.GetMetricWithLabelValues(b.vals...); err == nil {
		c.Inc()
	}
}

// flowProtocol is Hubble's protocol label of a flow.
func flowProtocol(f *flowpb.Flow) string {
	switch f.GetEventType().GetType() {
	case eventAccessLog:
		switch l7 := f.GetL7(); {
		case l7.GetDns() != nil:
			return "DNS"
		case l7.GetHttp() != nil:
			return "HTTP"
		}
		return "Unknown L7"
	case eventDrop, eventTrace, eventPolicyVerdict, eventCapture:
		switch l4 := f.GetL4(); {
		case l4.GetTCP() != nil:
			return "TCP"
		case l4.GetUDP() != nil:
			return "UDP"
		case l4.GetICMPv4() != nil:
			return "ICMPv4"
		case l4.GetICMPv6() != nil:
			return "ICMPv6"
		case l4.GetSCTP() != nil:
			return "SCTP"
		case l4.GetVRRP() != nil:
			return "VRRP"
		case l4.GetIGMP() != nil:
			return "IGMP"
		}
		return "Unknown L4"
	}
	return "Unknown flow"
}

// flowHandler is hubble_flows_processed_total{protocol,type,subtype,verdict,...}.
type flowHandler struct{ base }

func newFlowHandler(spec Spec) *flowHandler {
	return &flowHandler{newBase("flows_processed_total", "Total number of flows processed", spec,
		[]string{"protocol", "type", "subtype", "verdict"}, nil)}
}

func (h *flowHandler) process(f *flowpb.Flow) {
	typ, sub := "", ""
	switch t := f.GetEventType().GetType(); t {
	case eventAccessLog:
		typ = "L7"
		switch l7 := f.GetL7(); {
		case l7.GetDns() != nil:
			sub = "DNS"
		case l7.GetHttp() != nil:
			sub = "HTTP"
		}
	case eventDrop:
		typ = "Drop"
	case eventCapture:
		typ = "Capture"
	case eventTrace:
		typ = "Trace"
		sub = traceObservationPoints[f.GetEventType().GetSubType()]
	case eventPolicyVerdict:
		typ = "PolicyVerdict"
	default:
		typ = "Unknown"
		sub = strconv.Itoa(int(t))
	}
	h.vals[0], h.vals[1], h.vals[2], h.vals[3] = flowProtocol(f), typ, sub, f.GetVerdict().String()
	h.fillContext(f)
	h.inc()
}

// dropHandler is hubble_drop_total{...,reason,protocol}.
type dropHandler struct{ base }

func newDropHandler(spec Spec) *dropHandler {
	return &dropHandler{newBase("drop_total", "Number of drops", spec, nil, []string{"reason", "protocol"})}
}

func (h *dropHandler) process(f *flowpb.Flow) {
	if f.GetVerdict() != flowpb.Verdict_DROPPED {
		return
	}
	h.fillContext(f)
	n := len(h.vals)
	h.vals[n-2], h.vals[n-1] = f.GetDropReasonDesc().String(), flowProtocol(f)
	h.inc()
}

// policyHandler is hubble_policy_verdicts_total{direction,match,action,...}.
type policyHandler struct{ base }

func newPolicyHandler(spec Spec) *policyHandler {
	return &policyHandler{newBase("policy_verdicts_total", "Total number of Cilium network policy verdicts", spec,
		[]string{"direction", "match", "action"}, nil)}
}

func (h *policyHandler) process(f *flowpb.Flow) {
	var match string
	switch f.GetEventType().GetType() {
	case eventPolicyVerdict:
		// The node may reach its own endpoints whatever the policy says.
		if f.GetSource().GetIdentity() == hostIdentity {
			return
		}
		match = "unknown"
		if m := f.GetPolicyMatchType(); int(m) < len(policyMatchTypes) {
			match = policyMatchTypes[m]
		}
	case eventAccessLog:
		switch l7 := f.GetL7(); {
		case l7.GetDns() != nil:
			match = "l7/dns"
		case l7.GetHttp() != nil:
			match = "l7/http"
		default:
			match = "l7/"
		}
	default:
		return
	}
	h.vals[0], h.vals[1], h.vals[2] = lowerDirection(f.GetTrafficDirection()), match, lowerVerdict(f.GetVerdict())
	h.fillContext(f)
	h.inc()
}

// tcpHandler is hubble_tcp_flags_total{flag,family,...}.
type tcpHandler struct{ base }

func newTCPHandler(spec Spec) *tcpHandler {
	return &tcpHandler{newBase("tcp_flags_total", "TCP flag occurrences", spec, []string{"flag", "family"}, nil)}
}

func (h *tcpHandler) process(f *flowpb.Flow) {
	if v := f.GetVerdict(); v != flowpb.Verdict_FORWARDED && v != flowpb.Verdict_REDIRECTED {
		return
	}
	ip, flags := f.GetIP(), f.GetL4().GetTCP().GetFlags()
	if ip == nil || flags == nil {
		return
	}
	h.vals[1] = ip.GetIpVersion().String()
	h.fillContext(f)
	if flags.GetFIN() {
		h.vals[0] = "FIN"
		h.inc()
	}
	if flags.GetSYN() {
		h.vals[0] = "SYN"
		if flags.GetACK() {
			h.vals[0] = "SYN-ACK"
		}
		h.inc()
	}
	if flags.GetRST() {
		h.vals[0] = "RST"
		h.inc()
	}
}

// portHandler is hubble_port_distribution_total{protocol,port,...}.
type portHandler struct {
	base
	// ports keeps the decimal strings of the ports seen.
	ports map[uint32]string
}

func newPortHandler(spec Spec) *portHandler {
	return &portHandler{
		base:  newBase("port_distribution_total", "Numbers of packets distributed by destination port", spec, []string{"protocol", "port"}, nil),
		ports: map[uint32]string{},
	}
}

func (h *portHandler) port(p uint32) string {
	if s, ok := h.ports[p]; ok {
		return s
	}
	s := strconv.FormatUint(uint64(p), 10)
	if len(h.ports) < internLimit {
		h.ports[p] = s
	}
	return s
}

func (h *portHandler) process(f *flowpb.Flow) {
	// A flow not known to be a request says nothing of the service's port.
	reply := f.GetIsReply()
	if v := f.GetVerdict(); (v != flowpb.Verdict_FORWARDED && v != flowpb.Verdict_REDIRECTED) || reply == nil || reply.GetValue() {
		return
	}
	l4 := f.GetL4()
	if l4 == nil {
		return
	}
	switch {
	case l4.GetTCP() != nil:
		h.vals[0], h.vals[1] = "TCP", h.port(l4.GetTCP().GetDestinationPort())
	case l4.GetUDP() != nil:
		h.vals[0], h.vals[1] = "UDP", h.port(l4.GetUDP().GetDestinationPort())
	case l4.GetSCTP() != nil:
		h.vals[0], h.vals[1] = "SCTP", h.port(l4.GetSCTP().GetDestinationPort())
	case l4.GetICMPv4() != nil:
		h.vals[0], h.vals[1] = "ICMPv4", "0"
	case l4.GetICMPv6() != nil:
		h.vals[0], h.vals[1] = "ICMPv6", "0"
	case l4.GetVRRP() != nil:
		h.vals[0], h.vals[1] = "VRRP", "0"
	case l4.GetIGMP() != nil:
		h.vals[0], h.vals[1] = "IGMP", "0"
	default:
		return
	}
	h.fillContext(f)
	h.inc()
}

func newHandler(spec Spec) handler {
	switch spec.Name {
	case MetricFlow:
		return newFlowHandler(spec)
	case MetricDrop:
		return newDropHandler(spec)
	case MetricPolicy:
		return newPolicyHandler(spec)
	case MetricTCP:
		return newTCPHandler(spec)
	case MetricPortDistribution:
		return newPortHandler(spec)
	}
	return nil
}

// forgetPod deletes the series whose context labels name the pod
// namespace/name, as Hubble does when a pod goes: the source or destination
// label of the pod context, and labelsContext's pod and namespace pairs.
// It returns how many series went.
func (b *base) forgetPod(namespace, name string) int {
	o := &b.ctx.opts
	n := 0
	pod := namespace + "/" + name
	if slices.Contains(o.Source, ContextPod) || slices.Contains(o.SourceEgress, ContextPod) || slices.Contains(o.SourceIngress, ContextPod) {
		n += b.vec.DeletePartialMatch(prometheus.Labels{"source": pod})
	}
	if slices.Contains(o.Destination, ContextPod) || slices.Contains(o.DestinationEgress, ContextPod) || slices.Contains(o.DestinationIngress, ContextPod) {
		n += b.vec.DeletePartialMatch(prometheus.Labels{"destination": pod})
	}
	if slices.Contains(o.Labels, "source_pod") && slices.Contains(o.Labels, "source_namespace") {
		n += b.vec.DeletePartialMatch(prometheus.Labels{"source_namespace": namespace, "source_pod": name})
	}
	if slices.Contains(o.Labels, "destination_pod") && slices.Contains(o.Labels, "destination_namespace") {
		n += b.vec.DeletePartialMatch(prometheus.Labels{"destination_namespace": namespace, "destination_pod": name})
	}
	return n
}
