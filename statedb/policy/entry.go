package policy

import (
	"fmt"
	"slices"
	"strings"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	"github.com/cellium/cellium/statedb/identity"
)

// Entry is one desired policy map entry: a key, its verdict, and the rules
// it came from.
type Entry struct {
	Key
	// Deny marks a deny entry; otherwise the entry allows.
	Deny bool `json:"deny,omitempty"`
	// DerivedFrom names the rules that produced the entry, sorted (for
	// example "CiliumNetworkPolicy/default/allow-web"). Empty for entries
	// the engine adds by itself (the allow-all of a direction without
	// enforcement).
	DerivedFrom []string `json:"derived-from,omitempty"`
}

// String prints the entry as "<key> allow|deny [rules]".
func (e Entry) String() string {
	v := "allow"
	if e.Deny {
		v = "deny"
	}
	s := e.Key.String() + " " + v
	if len(e.DerivedFrom) > 0 {
		s += " " + strings.Join(e.DerivedFrom, ",")
	}
	return s
}

// DirectionPolicy is an endpoint's policy in one direction.
type DirectionPolicy struct {
	// Enforcing is true when traffic not allowed by an entry is dropped.
	// A direction without enforcement holds a single allow-all entry.
	Enforcing bool `json:"enforcing"`
	// Entries are sorted by Key (Key.Compare) and unique per key.
	Entries []Entry `json:"entries,omitempty"`
	// EnforcedBy names the rules that make the direction deny by default:
	// those that select the endpoint, take part in this direction and
	// switch it to default deny, sorted and unique (as Entry.DerivedFrom
	// names them). A packet no entry matches is dropped because of them,
	// so they are the policies that denied it. Empty when the direction
	// does not enforce, or enforces by the agent's
	// --policy-enforcement=always alone.
	EnforcedBy []string `json:"enforced-by,omitempty"`
}

// EndpointPolicy is the computed policy of one endpoint: its entries per
// direction and the repository revision it was computed at. Treat it as
// immutable.
type EndpointPolicy struct {
	Revision uint64          `json:"revision"`
	Ingress  DirectionPolicy `json:"ingress"`
	Egress   DirectionPolicy `json:"egress"`
}

// Direction returns the policy of one direction.
func (p *EndpointPolicy) Direction(d Direction) *DirectionPolicy {
	if d == Egress {
		return &p.Egress
	}
	return &p.Ingress
}

// Equal reports whether two policies hold the same entries and enforcement,
// ignoring the revision.
func (p *EndpointPolicy) Equal(o *EndpointPolicy) bool {
	return p.Ingress.equal(&o.Ingress) && p.Egress.equal(&o.Egress)
}

func (d *DirectionPolicy) equal(o *DirectionPolicy) bool {
	return d.Enforcing == o.Enforcing && slices.Equal(d.EnforcedBy, o.EnforcedBy) && slices.EqualFunc(d.Entries, o.Entries, func(a, b Entry) bool {
		return a.Key == b.Key && a.Deny == b.Deny && slices.Equal(a.DerivedFrom, b.DerivedFrom)
	})
}

// Get returns the entry with exactly this key.
func (d *DirectionPolicy) Get(k Key) (Entry, bool) {
	i, ok := slices.BinarySearchFunc(d.Entries, k, func(e Entry, k Key) int { return e.Key.Compare(k) })
	if !ok {
		return Entry{}, false
	}
	return d.Entries[i], true
}

// Verdict decides a packet from (or to) remote identity id with protocol
// proto and destination port port the way the datapath does with these
// entries as its policy map:
//
//  1. the longest-prefix entry for the exact identity; a deny there is final;
//  2. the longest-prefix entry for identity 0 (any identity);
//  3. of the two, a deny beats an allow, and between two allows the longer
//     protocol/port prefix wins (which makes no difference to the verdict);
//  4. no entry: dropped.
//
// It returns whether the packet passes and the entry that decided it (zero
// when none matched).
func (d *DirectionPolicy) Verdict(id identity.NumericIdentity, proto uint8, port uint16) (bool, Entry) {
	ok, e, _ := d.Decide(id, proto, port)
	return ok, e
}

// Decide is Verdict that also reports whether an entry matched at all.
func (d *DirectionPolicy) Decide(id identity.NumericIdentity, proto uint8, port uint16) (allowed bool, decided Entry, matched bool) {
	l3, okL3 := d.longest(id, proto, port)
	if okL3 && l3.Deny {
		return false, l3, true
	}
	l4, okL4 := d.longest(0, proto, port)
	switch {
	case !okL3 && !okL4:
		return false, Entry{}, false
	case !okL3, okL4 && l4.Deny, okL4 && l4.LPMPrefixLen() > l3.LPMPrefixLen():
		return !l4.Deny, l4, true
	default:
		return true, l3, true
	}
}

// longest returns the matching entry of identity id with the longest
// protocol/port prefix.
func (d *DirectionPolicy) longest(id identity.NumericIdentity, proto uint8, port uint16) (Entry, bool) {
	lo, _ := slices.BinarySearchFunc(d.Entries, id, func(e Entry, id identity.NumericIdentity) int {
		if e.Identity < id {
			return -1
		}
		if e.Identity > id {
			return 1
		}
		return 0
	})
	var best Entry
	found := false
	for _, e := range d.Entries[lo:] {
		if e.Identity != id {
			break
		}
		if e.MatchesL4(proto, port) && (!found || e.LPMPrefixLen() > best.LPMPrefixLen()) {
			best, found = e, true
		}
	}
	return best, found
}

// Format prints the policy as text, one line per entry, for golden files
// and the CLI:
//
//	ingress enforcing
//	  ingress 1234 tcp/80 allow CiliumNetworkPolicy/default/web
//	egress non-enforcing
//	  egress 0 any allow
func (p *EndpointPolicy) Format() string {
	var b strings.Builder
	for _, d := range []Direction{Ingress, Egress} {
		dp := p.Direction(d)
		state := "non-enforcing"
		if dp.Enforcing {
			state = "enforcing"
		}
		fmt.Fprintf(&b, "%s %s\n", d, state)
		for _, e := range dp.Entries {
			fmt.Fprintf(&b, "  %s\n", e)
		}
	}
	return b.String()
}

// CEPStatus returns the policy in the form of a CiliumEndpoint's
// status.policy: per direction the enforcement state and the allowed and
// denied (identity, port, protocol) tuples. A port range is shown by its
// first port. labelsOf, when not nil, supplies each identity's labels.
func (p *EndpointPolicy) CEPStatus(labelsOf func(identity.NumericIdentity) map[string]string) *ciliumv2.EndpointPolicy {
	conv := func(d *DirectionPolicy) *ciliumv2.EndpointPolicyDirection {
		out := &ciliumv2.EndpointPolicyDirection{Enforcing: d.Enforcing, State: ciliumv2.EndpointPolicyStateNonEnforcing}
		if d.Enforcing {
			out.State = ciliumv2.EndpointPolicyStateEnforcing
		}
		for _, e := range d.Entries {
			t := ciliumv2.IdentityTuple{Identity: uint64(e.Identity), DestPort: e.Port, Protocol: e.Proto}
			if labelsOf != nil && e.Identity != 0 {
				t.IdentityLabels = labelsOf(e.Identity)
			}
			if e.Deny {
				out.Denied = append(out.Denied, t)
			} else {
				out.Allowed = append(out.Allowed, t)
			}
		}
		return out
	}
	return &ciliumv2.EndpointPolicy{Ingress: conv(&p.Ingress), Egress: conv(&p.Egress)}
}
