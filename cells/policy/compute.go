package policy

import (
	"slices"

	"github.com/cellium/cellium/statedb/identity"
	statepolicy "github.com/cellium/cellium/statedb/policy"
)

// l4Key is the protocol and port part of a policy key.
type l4Key struct {
	proto uint8
	port  uint16
	plen  uint8
}

// anyL4 matches every protocol and port.
var anyL4 = []l4Key{{}}

// Compute returns the policy of an endpoint at the current revision.
func (e *Engine) Compute(ep Endpoint) *statepolicy.EndpointPolicy {
	e.mu.RLock()
	defer e.mu.RUnlock()
	return e.computeLocked(ep, e.selectingLocked(ep))
}

// SelectingRules returns the rules that select the endpoint, ordered by
// name.
func (e *Engine) SelectingRules(ep Endpoint) []*Rule {
	e.mu.RLock()
	defer e.mu.RUnlock()
	crs := e.selectingLocked(ep)
	out := make([]*Rule, len(crs))
	for i, cr := range crs {
		out[i] = cr.rule
	}
	return out
}

// selectingLocked returns the rules whose subject selects ep, sorted by
// name: through the subject index when the engine knows ep's identity,
// else by matching ep's labels against every rule.
func (e *Engine) selectingLocked(ep Endpoint) []*compiledRule {
	var out []*compiledRule
	if set, ok := e.bySubject[ep.Identity]; ok && ep.Identity != identity.InvalidIdentity {
		if len(set) == 0 {
			return nil
		}
		out = make([]*compiledRule, 0, len(set))
		for cr := range set {
			out = append(out, cr)
		}
	} else {
		for _, crs := range e.sources {
			for _, cr := range crs {
				if cr.subject != nil && cr.subject.m.Matches(ep.Identity, ep.Labels) {
					out = append(out, cr)
				}
			}
		}
	}
	slices.SortFunc(out, func(a, b *compiledRule) int {
		switch {
		case a.name < b.name:
			return -1
		case a.name > b.name:
			return 1
		}
		return 0
	})
	return out
}

// acc collects the verdicts for one key.
type acc struct {
	allow, deny []string // rule names
}

func (e *Engine) computeLocked(ep Endpoint, rules []*compiledRule) *statepolicy.EndpointPolicy {
	out := &statepolicy.EndpointPolicy{Revision: e.revision}
	for _, d := range []statepolicy.Direction{statepolicy.Ingress, statepolicy.Egress} {
		*out.Direction(d) = e.computeDirection(ep, rules, d)
	}
	return out
}

func (e *Engine) computeDirection(ep Endpoint, rules []*compiledRule, d statepolicy.Direction) statepolicy.DirectionPolicy {
	allowAll := statepolicy.Entry{Key: statepolicy.NewKey(0, d, 0, 0, 0)}
	if e.mode == ModeNever {
		return statepolicy.DirectionPolicy{Entries: []statepolicy.Entry{allowAll}}
	}
	selecting, defaultDeny := 0, false
	for _, cr := range rules {
		if len(cr.rule.entries(d)) > 0 {
			selecting++
			defaultDeny = defaultDeny || cr.rule.defaultDeny(d)
		}
	}
	if selecting == 0 {
		if e.mode == ModeAlways {
			return statepolicy.DirectionPolicy{Enforcing: true}
		}
		return statepolicy.DirectionPolicy{Entries: []statepolicy.Entry{allowAll}}
	}
	keys := map[statepolicy.Key]*acc{}
	add := func(k statepolicy.Key, deny bool, name string) {
		a := keys[k]
		if a == nil {
			a = &acc{}
			keys[k] = a
		}
		if deny {
			if len(a.deny) == 0 || a.deny[len(a.deny)-1] != name {
				a.deny = append(a.deny, name)
			}
		} else if len(a.allow) == 0 || a.allow[len(a.allow)-1] != name {
			a.allow = append(a.allow, name)
		}
	}
	if !defaultDeny {
		// Every selecting rule opted out of default deny: what no entry
		// denies passes.
		keys[allowAll.Key] = &acc{allow: []string{}}
	}
	var ids []identity.NumericIdentity
	for _, cr := range rules {
		for i, ent := range cr.rule.entries(d) {
			l4 := e.resolvePorts(ep, d, ent.Ports)
			if len(l4) == 0 {
				continue
			}
			ids = ids[:0]
			if ent.AnyPeer {
				ids = append(ids, 0)
			} else {
				for _, cs := range cr.peers[d][i] {
					ids = append(ids, cs.selections()...)
				}
			}
			for _, id := range ids {
				for _, k := range l4 {
					add(statepolicy.NewKey(id, d, k.proto, k.port, k.plen), ent.Deny, cr.name)
				}
			}
		}
	}
	return statepolicy.DirectionPolicy{Enforcing: true, Entries: finish(keys)}
}

// finish turns the collected keys into sorted entries: a key both allowed
// and denied is denied, and an allow covered by a deny of the same identity
// is dropped (the datapath's longest-prefix match would otherwise let the
// narrower allow win).
func finish(keys map[statepolicy.Key]*acc) []statepolicy.Entry {
	denies := map[identity.NumericIdentity][]statepolicy.Key{}
	for k, a := range keys {
		if len(a.deny) > 0 {
			denies[k.Identity] = append(denies[k.Identity], k)
		}
	}
	out := make([]statepolicy.Entry, 0, len(keys))
	for k, a := range keys {
		if len(a.deny) > 0 {
			out = append(out, statepolicy.Entry{Key: k, Deny: true, DerivedFrom: sortedNames(a.deny)})
			continue
		}
		covered := false
		for _, dk := range denies[k.Identity] {
			if dk.Covers(k) {
				covered = true
				break
			}
		}
		if !covered {
			out = append(out, statepolicy.Entry{Key: k, DerivedFrom: sortedNames(a.allow)})
		}
	}
	slices.SortFunc(out, func(a, b statepolicy.Entry) int { return a.Key.Compare(b.Key) })
	return out
}

func sortedNames(ns []string) []string {
	if len(ns) == 0 {
		return nil
	}
	return slices.Compact(slices.Sorted(slices.Values(ns)))
}

// resolvePorts turns an entry's ports into key parts; nil ports mean every
// protocol and port. Named ports resolve against the endpoint's own ports
// for ingress and the cluster's for egress; unknown names give nothing.
func (e *Engine) resolvePorts(ep Endpoint, d statepolicy.Direction, ports []PortSpec) []l4Key {
	if ports == nil {
		return anyL4
	}
	var out []l4Key
	for _, p := range ports {
		switch {
		case p.ICMP:
			out = append(out, l4Key{proto: p.Proto, port: p.Port, plen: 16})
		case p.Name != "":
			named := ep.NamedPorts
			if d == statepolicy.Egress {
				named = e.egressNP
			}
			for _, np := range named[p.Name] {
				if p.Proto != 0 && np.Proto != 0 && np.Proto != p.Proto {
					continue
				}
				proto := p.Proto
				if proto == 0 {
					proto = np.Proto
				}
				out = appendPortRange(out, proto, np.Port, np.Port)
			}
		case p.Port == 0:
			out = append(out, l4Key{proto: p.Proto})
		default:
			out = appendPortRange(out, p.Proto, p.Port, max(p.EndPort, p.Port))
		}
	}
	return out
}

// appendPortRange appends the keys of lo..hi for proto; proto 0 with a port
// stands for TCP, UDP and SCTP (the datapath cannot wildcard the protocol
// of a port).
func appendPortRange(out []l4Key, proto uint8, lo, hi uint16) []l4Key {
	protos := []uint8{proto}
	if proto == 0 {
		protos = []uint8{statepolicy.ProtoTCP, statepolicy.ProtoUDP, statepolicy.ProtoSCTP}
	}
	for _, pr := range protos {
		for _, pp := range statepolicy.PortRangePrefixes(lo, hi) {
			out = append(out, l4Key{proto: pr, port: pp.Port, plen: pp.PrefixLen})
		}
	}
	return out
}
