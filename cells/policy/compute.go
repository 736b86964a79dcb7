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

// acc collects the verdicts for one key: the rules that allow and deny
// it, as ids of name sets (0: none).
type acc struct {
	allow, deny int
}

// nameSets interns the sets of rule names entries derive from, so that the
// thousands of entries of one endpoint share a handful of slices. Set 0 is
// empty; rules are added in sorted order, so a set is its names in order.
type nameSets struct {
	sets [][]string
	ext  map[[2]int]int // (set, rule) -> set with the rule appended
}

func newNameSets() *nameSets {
	return &nameSets{sets: [][]string{nil}, ext: map[[2]int]int{}}
}

// add returns the set of set's names plus rule i's name.
func (n *nameSets) add(set, i int, name string) int {
	if s := n.sets[set]; len(s) > 0 && s[len(s)-1] == name {
		return set
	}
	if next, ok := n.ext[[2]int{set, i}]; ok {
		return next
	}
	s := append(append(make([]string, 0, len(n.sets[set])+1), n.sets[set]...), name)
	n.sets = append(n.sets, s)
	n.ext[[2]int{set, i}] = len(n.sets) - 1
	return len(n.sets) - 1
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
	keys := make(map[statepolicy.Key]acc, 64)
	names := newNameSets()
	if !defaultDeny {
		// Every selecting rule opted out of default deny: what no entry
		// denies passes. The entry derives from no rule.
		keys[allowAll.Key] = acc{allow: -1}
	}
	var ids []identity.NumericIdentity
	for ri, cr := range rules {
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
					key := statepolicy.NewKey(id, d, k.proto, k.port, k.plen)
					a := keys[key]
					if ent.Deny {
						a.deny = names.add(a.deny, ri, cr.name)
					} else if a.allow >= 0 {
						a.allow = names.add(a.allow, ri, cr.name)
					}
					keys[key] = a
				}
			}
		}
	}
	return statepolicy.DirectionPolicy{Enforcing: true, Entries: finish(keys, names)}
}

// finish turns the collected keys into sorted entries: a key both allowed
// and denied is denied, and an allow covered by a deny of the same identity
// is dropped (the datapath's longest-prefix match would otherwise let the
// narrower allow win).
func finish(keys map[statepolicy.Key]acc, names *nameSets) []statepolicy.Entry {
	var denies map[identity.NumericIdentity][]statepolicy.Key
	for k, a := range keys {
		if a.deny > 0 {
			if denies == nil {
				denies = map[identity.NumericIdentity][]statepolicy.Key{}
			}
			denies[k.Identity] = append(denies[k.Identity], k)
		}
	}
	out := make([]statepolicy.Entry, 0, len(keys))
	for k, a := range keys {
		if a.deny > 0 {
			out = append(out, statepolicy.Entry{Key: k, Deny: true, DerivedFrom: names.sets[a.deny]})
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
			e := statepolicy.Entry{Key: k}
			if a.allow > 0 {
				e.DerivedFrom = names.sets[a.allow]
			}
			out = append(out, e)
		}
	}
	slices.SortFunc(out, func(a, b statepolicy.Entry) int { return a.Key.Compare(b.Key) })
	return out
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
