package policy

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	"github.com/cellium/cellium/statedb/identity"
	"github.com/cellium/cellium/statedb/labels"
	statepolicy "github.com/cellium/cellium/statedb/policy"
)

// RuleInfo is a rule as the API shows it.
type RuleInfo struct {
	Name               string   `json:"name"`
	Source             Source   `json:"source"`
	Subject            string   `json:"subject"`
	Ingress            []string `json:"ingress,omitempty"`
	Egress             []string `json:"egress,omitempty"`
	IngressDefaultDeny bool     `json:"ingress-default-deny"`
	EgressDefaultDeny  bool     `json:"egress-default-deny"`
	Warnings           []string `json:"warnings,omitempty"`
}

// PolicyInfo is the answer of GET /v1/policy.
type PolicyInfo struct {
	Revision uint64     `json:"revision"`
	Rules    []RuleInfo `json:"rules"`
	// Rejected are the CNPs and CCNPs the agent refused because a rule
	// failed to parse (the rules of an earlier version may still be in
	// Rules), sorted by source.
	Rejected []RejectedPolicy `json:"rejected,omitempty"`
}

// RejectedPolicy is a policy object the agent refused, and why.
type RejectedPolicy struct {
	Source Source `json:"source"`
	Error  string `json:"error"`
}

// String describes an entry: "allow from {k8s:app=web} on tcp/80".
func (e *Entry) String() string {
	var b strings.Builder
	if e.Deny {
		b.WriteString("deny ")
	} else {
		b.WriteString("allow ")
	}
	switch {
	case e.AnyPeer:
		b.WriteString("any peer")
	case len(e.Peers) == 0:
		b.WriteString("no peer")
	default:
		parts := make([]string, len(e.Peers))
		for i, p := range e.Peers {
			parts[i] = p.String()
		}
		b.WriteString(strings.Join(parts, " | "))
	}
	if e.Ports == nil {
		return b.String()
	}
	parts := make([]string, 0, len(e.Ports))
	for _, p := range e.Ports {
		parts = append(parts, p.String())
	}
	return b.String() + " on " + strings.Join(parts, ", ")
}

// String prints a port spec: "tcp/80", "udp/1000-1999", "any/http",
// "icmp type 8", "sctp".
func (p PortSpec) String() string {
	proto := statepolicy.ProtoName(p.Proto)
	switch {
	case p.ICMP:
		return fmt.Sprintf("%s type %d", proto, p.Port)
	case p.Name != "":
		return proto + "/" + p.Name
	case p.Port == 0:
		return proto
	case p.EndPort > p.Port:
		return fmt.Sprintf("%s/%d-%d", proto, p.Port, p.EndPort)
	}
	return fmt.Sprintf("%s/%d", proto, p.Port)
}

func ruleInfo(r *Rule) RuleInfo {
	ri := RuleInfo{Name: r.Name(), Source: r.Source, IngressDefaultDeny: r.IngressDefaultDeny,
		EgressDefaultDeny: r.EgressDefaultDeny, Warnings: r.Warnings, Subject: "(none)"}
	if r.Subject != nil {
		ri.Subject = r.Subject.String()
	}
	for _, e := range r.Ingress {
		ri.Ingress = append(ri.Ingress, e.String())
	}
	for _, e := range r.Egress {
		ri.Egress = append(ri.Egress, e.String())
	}
	return ri
}

// Info returns the engine's rules and revision as GET /v1/policy shows
// them.
func (e *Engine) Info() PolicyInfo {
	out := PolicyInfo{Revision: e.Revision(), Rules: []RuleInfo{}}
	for _, rule := range e.Rules() {
		out.Rules = append(out.Rules, ruleInfo(rule))
	}
	return out
}

// ParseTraceEnd reads one end of a trace from the query parameters
// <side>-identity (a number or reserved name), <side>-labels (comma
// separated) or <side>-cidr (an address). An identity may come with the
// address of the endpoint that has it (a pod): CIDR rules that name the
// address then count too, as in the datapath.
//
// Possible errors: none or several of the three given (other than an
// identity with its address), or a malformed one.
func ParseTraceEnd(side, idStr, lblStr, addrStr string) (TraceEnd, error) {
	set := 0
	for _, s := range []string{idStr, lblStr, addrStr} {
		if s != "" {
			set++
		}
	}
	if set != 1 && (set != 2 || idStr == "" || addrStr == "") {
		return TraceEnd{}, fmt.Errorf("give exactly one of --%[1]s-identity, --%[1]s-labels, --%[1]s-cidr (or --%[1]s-k8s-pod)", side)
	}
	var end TraceEnd
	if addrStr != "" {
		a, err := netip.ParseAddr(strings.TrimSuffix(strings.TrimSuffix(addrStr, "/32"), "/128"))
		if err != nil {
			return TraceEnd{}, fmt.Errorf("--%s-cidr %q: want an address such as 192.0.2.1", side, addrStr)
		}
		end.Addr = a
	}
	switch {
	case idStr != "":
		id, err := identity.ParseNumericIdentity(idStr)
		if err != nil {
			r, ok := identity.LookupReservedByName(idStr)
			if !ok {
				return TraceEnd{}, fmt.Errorf("--%s-identity %q: want a number or a reserved name such as world", side, idStr)
			}
			id = r
		}
		end.Identity = id
	case lblStr != "":
		end.Labels = labels.ParseLabels(strings.Split(lblStr, ",")...)
	}
	return end, nil
}

// ParseDPort reads "PORT[/PROTO]" (protocol TCP by default). For ICMP the
// number is the ICMP type ("8/ICMP" is an echo request, "0/ICMP" an echo
// reply), which the datapath looks the policy up with in place of a port.
// ANY is not a packet's protocol.
func ParseDPort(s string) (uint8, uint16, error) {
	if s == "" {
		return statepolicy.ProtoTCP, 0, nil
	}
	portStr, protoStr, _ := strings.Cut(s, "/")
	n, err := strconv.ParseUint(portStr, 10, 16)
	if err != nil {
		return 0, 0, fmt.Errorf("--dport %q: want PORT[/PROTO] such as 80/TCP, or TYPE/ICMP such as 8/ICMP", s)
	}
	proto := statepolicy.ProtoTCP
	switch strings.ToUpper(protoStr) {
	case "", "TCP":
	case "UDP":
		proto = statepolicy.ProtoUDP
	case "SCTP":
		proto = statepolicy.ProtoSCTP
	case "ICMP":
		if n > 255 {
			return 0, 0, fmt.Errorf("--dport %q: an ICMP type is 0 to 255 (8/ICMP for an echo request)", s)
		}
		proto = statepolicy.ProtoICMP
	default:
		return 0, 0, fmt.Errorf("--dport %q: protocol must be TCP, UDP, SCTP or ICMP (TYPE/ICMP)", s)
	}
	return proto, uint16(n), nil
}
