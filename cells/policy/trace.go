package policy

import (
	"fmt"
	"net/netip"
	"strings"

	"github.com/cellium/cellium/statedb/identity"
	"github.com/cellium/cellium/statedb/labels"
	statepolicy "github.com/cellium/cellium/statedb/policy"
)

// TraceEnd is one end of a traced connection: an identity the engine knows,
// a set of labels, or an address (resolved to the CIDR identity of the
// longest prefix rules use, else world). An identity with an address is an
// endpoint (a pod) at that address: as a peer, CIDR rules that hold the
// address count as well as rules on the identity, as in the datapath
// (a deny on either is final, an allow on either allows). Labels that
// belong to no known identity still select rules for their own side, but
// as a peer they match only rules that allow any peer.
type TraceEnd struct {
	Identity identity.NumericIdentity
	Labels   labels.Labels
	Addr     netip.Addr
}

// DirectionTrace is how one side decided.
type DirectionTrace struct {
	// Checked is false when the side is not an endpoint (world, host, a
	// CIDR), whose policy cellium does not enforce.
	Checked   bool               `json:"checked"`
	Direction string             `json:"direction"`
	Enforcing bool               `json:"enforcing"`
	Rules     []string           `json:"rules,omitempty"` // rules selecting the endpoint
	Allowed   bool               `json:"allowed"`
	Entry     *statepolicy.Entry `json:"entry,omitempty"` // the entry that decided, nil: none matched
}

// Trace is the result of tracing one connection.
type Trace struct {
	Source      string         `json:"source"`
	Destination string         `json:"destination"`
	Proto       uint8          `json:"proto"`
	Port        uint16         `json:"port"`
	Egress      DirectionTrace `json:"egress"`
	Ingress     DirectionTrace `json:"ingress"`
	Allowed     bool           `json:"allowed"`
}

// resolve fills in the identity and labels of an end.
func (e *Engine) resolveLocked(t TraceEnd) (identity.NumericIdentity, labels.Labels, bool) {
	switch {
	case t.Addr.IsValid() && t.Identity == identity.InvalidIdentity:
		best := e.cidrForLocked(t.Addr)
		if best == identity.InvalidIdentity {
			best = identity.ReservedIdentityWorld
		}
		l, _ := e.sc.Labels(best)
		return best, l, false
	case t.Identity != identity.InvalidIdentity:
		l, ok := e.sc.Labels(t.Identity)
		if !ok {
			l = t.Labels
		}
		isEndpoint := !t.Identity.IsReserved() && !t.Identity.HasLocalScope()
		return t.Identity, l, isEndpoint
	}
	if id, ok := identity.LookupReservedByLabels(t.Labels); ok {
		return id, t.Labels, false
	}
	// Peer entries are keyed by identity: find the identity of these labels.
	for id, l := range e.sc.identities {
		if l.Equal(t.Labels) {
			return id, l, !id.HasLocalScope()
		}
	}
	return identity.InvalidIdentity, t.Labels, true
}

// cidrForLocked is the CIDR identity of the longest prefix rules use that
// holds a, or InvalidIdentity.
func (e *Engine) cidrForLocked(a netip.Addr) identity.NumericIdentity {
	best, bits := identity.InvalidIdentity, -1
	for p, c := range e.cidrs {
		if p.Contains(a) && p.Bits() > bits {
			best, bits = c.id, p.Bits()
		}
	}
	return best
}

// peerCIDRLocked is the CIDR identity an endpoint end's address also has
// (InvalidIdentity: none, or not an endpoint with an address).
func (e *Engine) peerCIDRLocked(t TraceEnd, id identity.NumericIdentity) identity.NumericIdentity {
	if t.Identity == identity.InvalidIdentity || !t.Addr.IsValid() {
		return identity.InvalidIdentity
	}
	if c := e.cidrForLocked(t.Addr); c != id {
		return c
	}
	return identity.InvalidIdentity
}

// Trace decides a connection from src to dst on proto/port: the source's
// egress policy (when the source is an endpoint), then the destination's
// ingress policy (when it is an endpoint). Both must allow.
func (e *Engine) Trace(src, dst TraceEnd, proto uint8, port uint16) Trace {
	e.mu.RLock()
	defer e.mu.RUnlock()
	sid, slbls, sEP := e.resolveLocked(src)
	did, dlbls, dEP := e.resolveLocked(dst)
	tr := Trace{Source: describe(sid, slbls), Destination: describe(did, dlbls), Proto: proto, Port: port}
	side := func(ep Endpoint, checked bool, d statepolicy.Direction, peer, peerCIDR identity.NumericIdentity) DirectionTrace {
		dt := DirectionTrace{Checked: checked, Direction: d.String(), Allowed: true}
		if !checked {
			return dt
		}
		rules := e.selectingLocked(ep)
		for _, cr := range rules {
			if len(cr.rule.entries(d)) > 0 {
				dt.Rules = append(dt.Rules, cr.name)
			}
		}
		pol := e.computeLocked(ep, rules)
		dp := pol.Direction(d)
		dt.Enforcing = dp.Enforcing
		ok, ent, matched := dp.Decide(peer, proto, port)
		if peerCIDR != identity.InvalidIdentity {
			// The datapath's second verdict, on the CIDR identity of the
			// peer's address: a deny there is final, an allow there
			// allows.
			cok, cent, cmatched := dp.Decide(peerCIDR, proto, port)
			if (cmatched && cent.Deny) || (!ok && cok) {
				ok, ent, matched = cok, cent, cmatched
			}
		}
		dt.Allowed = ok
		if matched {
			dt.Entry = &ent
		}
		return dt
	}
	tr.Egress = side(Endpoint{Identity: sid, Labels: slbls}, sEP, statepolicy.Egress, did, e.peerCIDRLocked(dst, did))
	tr.Ingress = side(Endpoint{Identity: did, Labels: dlbls}, dEP, statepolicy.Ingress, sid, e.peerCIDRLocked(src, sid))
	tr.Allowed = tr.Egress.Allowed && tr.Ingress.Allowed
	return tr
}

func describe(id identity.NumericIdentity, l labels.Labels) string {
	return fmt.Sprintf("identity %s %s", id, l)
}

// Format prints the trace for people, ending with Cilium's
// "Final verdict: ALLOWED" or "Final verdict: DENIED" line.
func (t *Trace) Format() string {
	var b strings.Builder
	port := statepolicy.ProtoName(t.Proto)
	if t.Port != 0 {
		port = fmt.Sprintf("%d/%s", t.Port, strings.ToUpper(port))
	}
	fmt.Fprintf(&b, "Tracing From: %s\n          To: %s\n       Ports: %s\n", t.Source, t.Destination, port)
	b.WriteString(strings.Repeat("-", 64) + "\n")
	for _, d := range []struct {
		who string
		dt  DirectionTrace
	}{{"source", t.Egress}, {"destination", t.Ingress}} {
		fmt.Fprintf(&b, "%s of the %s: ", capitalize(d.dt.Direction), d.who)
		if !d.dt.Checked {
			b.WriteString("not an endpoint, no policy applies\n")
			continue
		}
		if !d.dt.Enforcing {
			b.WriteString("not enforcing (no rule selects it in this direction): allowed\n")
			continue
		}
		fmt.Fprintf(&b, "enforcing, %d rule(s) select it\n", len(d.dt.Rules))
		for _, r := range d.dt.Rules {
			fmt.Fprintf(&b, "    %s\n", r)
		}
		verdict := "DENIED"
		if d.dt.Allowed {
			verdict = "ALLOWED"
		}
		if d.dt.Entry == nil {
			fmt.Fprintf(&b, "  no entry matches: %s\n", verdict)
		} else {
			fmt.Fprintf(&b, "  decided by: %s: %s\n", d.dt.Entry, verdict)
		}
	}
	verdict := "DENIED"
	if t.Allowed {
		verdict = "ALLOWED"
	}
	fmt.Fprintf(&b, "\nFinal verdict: %s\n", verdict)
	return b.String()
}

func capitalize(s string) string {
	if s == "" {
		return s
	}
	return strings.ToUpper(s[:1]) + s[1:]
}
