package policy

import (
	"strconv"

	statepolicy "github.com/cellium/cellium/statedb/policy"
)

// Kinds of policy objects rules come from.
const (
	KindNetworkPolicy = "NetworkPolicy"
	KindCNP           = "CiliumNetworkPolicy"
	KindCCNP          = "CiliumClusterwideNetworkPolicy"
)

// Source identifies the object a set of rules came from.
type Source struct {
	// Kind is KindNetworkPolicy, KindCNP or KindCCNP.
	Kind string `json:"kind"`
	// Namespace is empty for clusterwide policies.
	Namespace string `json:"namespace,omitempty"`
	// Name of the object.
	Name string `json:"name"`
	// UID of the object.
	UID string `json:"uid,omitempty"`
}

// String prints "Kind/namespace/name" or "Kind/name".
func (s Source) String() string {
	if s.Namespace == "" {
		return s.Kind + "/" + s.Name
	}
	return s.Kind + "/" + s.Namespace + "/" + s.Name
}

// Rule is one parsed rule: which endpoints it selects and, per direction,
// its entries. Rules are immutable once parsed.
type Rule struct {
	// Source is the object the rule came from.
	Source Source `json:"source"`
	// Index is the rule's position among its object's rules (spec is 0,
	// specs follow).
	Index int `json:"index"`
	// Subject selects the endpoints the rule applies to; nil selects none
	// (for example a host policy, which cellium does not enforce).
	Subject *Selector `json:"-"`
	// Ingress and Egress are the entries per direction, in rule order.
	Ingress []*Entry `json:"-"`
	Egress  []*Entry `json:"-"`
	// IngressDefaultDeny and EgressDefaultDeny say whether selecting an
	// endpoint switches that direction to deny-by-default.
	IngressDefaultDeny bool `json:"ingress-default-deny"`
	EgressDefaultDeny  bool `json:"egress-default-deny"`
	// Warnings name the parts of the rule that are parsed but not enforced
	// (L7 rules, FQDNs, services, ...), each with its field path.
	Warnings []string `json:"warnings,omitempty"`
}

// Name identifies the rule in entries and traces: the source, with
// "[i]" appended for rules after the first of an object with several.
func (r *Rule) Name() string {
	if r.Index == 0 {
		return r.Source.String()
	}
	return r.Source.String() + "[" + strconv.Itoa(r.Index) + "]"
}

// entries returns the entries of one direction.
func (r *Rule) entries(d statepolicy.Direction) []*Entry {
	if d == statepolicy.Egress {
		return r.Egress
	}
	return r.Ingress
}

// defaultDeny returns whether the rule switches direction d to
// deny-by-default.
func (r *Rule) defaultDeny(d statepolicy.Direction) bool {
	if d == statepolicy.Egress {
		return r.EgressDefaultDeny
	}
	return r.IngressDefaultDeny
}

// Entry is one allow or deny statement of a rule in one direction: traffic
// with any of its peers (or any peer at all), on any of its ports (or any
// port at all).
type Entry struct {
	// Deny makes the entry deny what it matches.
	Deny bool
	// AnyPeer matches every peer (identity 0 in the policy map).
	AnyPeer bool
	// Peers are OR-ed; ignored when AnyPeer is set. Empty with AnyPeer
	// unset selects nothing.
	Peers []Matcher
	// Ports are OR-ed; nil means every protocol and port (an L3-only
	// entry). A non-nil empty list matches nothing.
	Ports []PortSpec
}

// PortSpec is one port (or port range, or named port) of an entry.
type PortSpec struct {
	// Proto is the IP protocol number; 0 means TCP, UDP and SCTP when a
	// port is given and every protocol when not.
	Proto uint8
	// Port is the first port; 0 means every port.
	Port uint16
	// EndPort is the last port of a range; 0 or equal to Port for one port.
	EndPort uint16
	// Name is a named port, resolved per endpoint; Port is then 0.
	Name string
	// ICMP marks an ICMP type match: Proto is ICMP or ICMPv6 and Port the
	// type.
	ICMP bool
}
