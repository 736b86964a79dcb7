package policy

import (
	"cmp"
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
// else by matching ep's labels against the rules the rule index names.
func (e *Engine) selectingLocked(ep Endpoint) []*compiledRule {
	var out []*compiledRule
	if set, ok := e.bySubject[ep.Identity]; ok && ep.Identity != identity.InvalidIdentity {
		if len(set) == 0 {
			return nil
		}
		out = slices.Clone(set)
	} else {
		e.subjects.candidates(ep.Labels, func(cr *compiledRule) {
			if cr.subject != nil && cr.subject.m.Matches(ep.Identity, ep.Labels) {
				out = append(out, cr)
			}
		})
	}
	slices.SortFunc(out, func(a, b *compiledRule) int {
		switch {
		case a.name < b.name:
			return -1
		case a.name > b.name:
			return 1
		}
		return cmp.Compare(a.seq, b.seq)
	})
	return out
}

func (e *Engine) computeLocked(ep Endpoint, rules []*compiledRule) *statepolicy.EndpointPolicy {
	out := &statepolicy.EndpointPolicy{Revision: e.revision}
	for _, d := range []statepolicy.Direction{statepolicy.Ingress, statepolicy.Egress} {
		*out.Direction(d) = e.computeDirection(ep, rules, d)
	}
	return out
}

func (e *Engine) computeDirection(ep Endpoint, rules []*compiledRule, d statepolicy.Direction) statepolicy.DirectionPolicy {
	allowAll := func() []statepolicy.Entry {
		return []statepolicy.Entry{{Key: statepolicy.NewKey(0, d, 0, 0, 0)}}
	}
	if e.mode == ModeNever {
		return statepolicy.DirectionPolicy{Entries: allowAll()}
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
		return statepolicy.DirectionPolicy{Entries: allowAll()}
	}
	key := policyCacheKey(ep, rules, d)
	if dp, ok := e.cache.get(key); ok {
		return dp
	}
	dp := statepolicy.DirectionPolicy{Enforcing: true, Entries: e.computeEntries(ep, rules, d, defaultDeny),
		EnforcedBy: enforcedBy(rules, d)}
	e.cache.put(key, dp)
	return dp
}

// enforcedBy returns the names of the rules that take part in direction d
// and switch it to default deny, sorted and unique: the rules a packet no
// entry matches is denied by.
func enforcedBy(rules []*compiledRule, d statepolicy.Direction) []string {
	var out []string
	for _, cr := range rules {
		if len(cr.rule.entries(d)) > 0 && cr.rule.defaultDeny(d) {
			out = append(out, cr.name)
		}
	}
	slices.Sort(out)
	return slices.Clip(slices.Compact(out))
}

// The computation of a direction's entries works in three steps, to do
// per (peer identity, port) only what must be done per pair:
//
//  1. Every entry of every selecting rule contributes, for each of its
//     peer selectors and each of its resolved ports, the rule to the allow
//     or deny rule set of the group (peer selector, port). Rules sharing a
//     peer selector and a port (common: many rules allowing the same
//     clients on the same port) share a group.
//  2. Each group is spread over the identities its selector selects: the
//     rule sets of groups meeting on one (identity, port) key are united.
//  3. The keys are sorted, and per identity, denies win over allows and an
//     allow covered by a deny of the same identity is dropped (the
//     datapath's longest-prefix match would otherwise let the narrower
//     allow win).

// group is the peers of one selector (or any peer) on one port.
type group struct {
	ids         []identity.NumericIdentity // the selector's selections, shared
	l4          l4Key
	allow, deny int32 // rule sets
}

type groupKey struct {
	cs *cachedSelector // nil: any peer
	l4 l4Key
}

// slot is the verdict on one key: the packed key and its rule sets.
type slot struct {
	key         uint64
	allow, deny int32 // rule sets; allow -1: allowed by no rule (default allow)
}

// packKey packs an identity and normalised protocol and port prefix into
// a number that sorts like Key.Compare within one direction.
func packKey(id identity.NumericIdentity, k l4Key) uint64 {
	return uint64(id)<<32 | uint64(k.proto)<<24 | uint64(k.port)<<8 | uint64(k.plen)
}

func unpackKey(p uint64, d statepolicy.Direction) statepolicy.Key {
	return statepolicy.Key{Identity: identity.NumericIdentity(p >> 32), Direction: d,
		Proto: uint8(p >> 24), Port: uint16(p >> 8), PortPrefixLen: uint8(p)}
}

// normalL4 normalises k as NewKey does.
func normalL4(k l4Key) l4Key {
	n := statepolicy.NewKey(0, 0, k.proto, k.port, k.plen)
	return l4Key{proto: n.Proto, port: n.Port, plen: n.PortPrefixLen}
}

// anyPeerIDs are the peers of an entry that matches any peer: identity 0
// of the policy map. Read only.
var anyPeerIDs = []identity.NumericIdentity{0}

func (e *Engine) computeEntries(ep Endpoint, rules []*compiledRule, d statepolicy.Direction, defaultDeny bool) []statepolicy.Entry {
	sets := newRuleSets(rules)

	// 1. Groups.
	var groups []group
	groupOf := make(map[groupKey]int32, 16)
	for ri, cr := range rules {
		for i, ent := range cr.rule.entries(d) {
			l4 := cr.ports[d][i]
			if l4 == nil {
				l4 = e.resolvePorts(ep, d, ent.Ports)
			}
			if len(l4) == 0 {
				continue
			}
			npeers := len(cr.peers[d][i])
			if ent.AnyPeer {
				npeers = 1
			}
			for p := range npeers {
				var cs *cachedSelector
				ids := anyPeerIDs
				if !ent.AnyPeer {
					cs = cr.peers[d][i][p]
					ids = cs.selections()
				}
				if len(ids) == 0 {
					continue
				}
				for _, k := range l4 {
					k = normalL4(k)
					gk := groupKey{cs: cs, l4: k}
					gi, ok := groupOf[gk]
					if !ok {
						gi = int32(len(groups))
						groups = append(groups, group{ids: ids, l4: k})
						groupOf[gk] = gi
					}
					g := &groups[gi]
					if ent.Deny {
						g.deny = sets.add(g.deny, int32(ri))
					} else {
						g.allow = sets.add(g.allow, int32(ri))
					}
				}
			}
		}
	}

	// 2. Keys: one slot per (group, identity), sorted by key, then the
	// slots of one key folded into one.
	n := 1
	for _, g := range groups {
		n += len(g.ids)
	}
	slots := make([]slot, 0, n)
	if !defaultDeny {
		// Every selecting rule opted out of default deny: what no entry
		// denies passes. The entry derives from no rule.
		slots = append(slots, slot{key: 0, allow: -1})
	}
	for _, g := range groups {
		for _, id := range g.ids {
			slots = append(slots, slot{key: packKey(id, g.l4), allow: g.allow, deny: g.deny})
		}
	}
	slices.SortFunc(slots, func(a, b slot) int { return cmp.Compare(a.key, b.key) })
	w := 0
	for r := 0; r < len(slots); r++ {
		if w > 0 && slots[w-1].key == slots[r].key {
			s := &slots[w-1]
			if s.allow < 0 || slots[r].allow < 0 {
				s.allow = -1
			} else {
				s.allow = sets.union(s.allow, slots[r].allow)
			}
			s.deny = sets.union(s.deny, slots[r].deny)
			continue
		}
		slots[w] = slots[r]
		w++
	}
	slots = slots[:w]

	// 3. Entries.
	out := make([]statepolicy.Entry, 0, len(slots))
	var denies []statepolicy.Key
	for i := 0; i < len(slots); {
		id := slots[i].key >> 32
		j := i
		denies = denies[:0]
		for ; j < len(slots) && slots[j].key>>32 == id; j++ {
			if slots[j].deny > 0 {
				denies = append(denies, unpackKey(slots[j].key, d))
			}
		}
		for _, s := range slots[i:j] {
			k := unpackKey(s.key, d)
			if s.deny > 0 {
				out = append(out, statepolicy.Entry{Key: k, Deny: true, DerivedFrom: sets.names(s.deny)})
				continue
			}
			if slices.ContainsFunc(denies, func(dk statepolicy.Key) bool { return dk.Covers(k) }) {
				continue
			}
			en := statepolicy.Entry{Key: k}
			if s.allow > 0 {
				en.DerivedFrom = sets.names(s.allow)
			}
			out = append(out, en)
		}
		i = j
	}
	return out
}

// ruleSets interns sets of rules (by index into the sorted selecting
// rules) so that the thousands of keys of one endpoint share a handful of
// sets and of name slices. A set is a node of a trie: its largest rule and
// the set without it (its parent). Sets are only ever built by adding
// rules in ascending order from the empty set 0, so equal sets are the
// same node. A node's children form a list (first child, next sibling):
// there are few sets, and few children per set.
type ruleSets struct {
	rules   []*compiledRule
	nodes   []ruleSetNode
	unions  map[uint64]int32 // (set, set) -> their union
	named   [][]string       // names of each set, built on demand
	scratch [2][]int32
}

type ruleSetNode struct {
	last, parent, depth int32 // last -1: the empty set
	child, sibling      int32 // 0: none
}

func newRuleSets(rules []*compiledRule) *ruleSets {
	s := &ruleSets{rules: rules, nodes: make([]ruleSetNode, 1, 16)}
	s.nodes[0].last = -1
	return s
}

// add returns set with rule ri added; ri must not be below set's largest
// rule.
func (s *ruleSets) add(set, ri int32) int32 {
	if s.nodes[set].last == ri {
		return set
	}
	for c := s.nodes[set].child; c != 0; c = s.nodes[c].sibling {
		if s.nodes[c].last == ri {
			return c
		}
	}
	next := int32(len(s.nodes))
	s.nodes = append(s.nodes, ruleSetNode{last: ri, parent: set, depth: s.nodes[set].depth + 1, sibling: s.nodes[set].child})
	s.nodes[set].child = next
	return next
}

// members appends the rules of set, ascending, to buf.
func (s *ruleSets) members(set int32, buf []int32) []int32 {
	d := int(s.nodes[set].depth)
	buf = slices.Grow(buf[:0], d)[:d]
	for i := d - 1; i >= 0; i-- {
		buf[i] = s.nodes[set].last
		set = s.nodes[set].parent
	}
	return buf
}

// union returns the set of the rules of a and b.
func (s *ruleSets) union(a, b int32) int32 {
	if a == b || b == 0 {
		return a
	}
	if a == 0 {
		return b
	}
	if a > b {
		a, b = b, a
	}
	k := uint64(a)<<32 | uint64(b)
	if u, ok := s.unions[k]; ok {
		return u
	}
	s.scratch[0] = s.members(a, s.scratch[0])
	s.scratch[1] = s.members(b, s.scratch[1])
	ma, mb := s.scratch[0], s.scratch[1]
	u := int32(0)
	for len(ma) > 0 || len(mb) > 0 {
		var next int32
		switch {
		case len(mb) == 0 || (len(ma) > 0 && ma[0] < mb[0]):
			next, ma = ma[0], ma[1:]
		case len(ma) == 0 || mb[0] < ma[0]:
			next, mb = mb[0], mb[1:]
		default:
			next, ma, mb = ma[0], ma[1:], mb[1:]
		}
		u = s.add(u, next)
	}
	if s.unions == nil {
		s.unions = map[uint64]int32{}
	}
	s.unions[k] = u
	return u
}

// names returns the names of the rules of set, in order, each once.
func (s *ruleSets) names(set int32) []string {
	if len(s.named) <= int(set) {
		s.named = slices.Grow(s.named, len(s.nodes)-len(s.named))[:len(s.nodes)]
	}
	if s.named[set] == nil {
		m := s.members(set, s.scratch[0])
		s.scratch[0] = m
		out := make([]string, 0, len(m))
		for _, ri := range m {
			if name := s.rules[ri].name; len(out) == 0 || out[len(out)-1] != name {
				out = append(out, name)
			}
		}
		s.named[set] = slices.Clip(out)
	}
	return s.named[set]
}

// staticPorts resolves an entry's ports once, when they name no port:
// normalised, sorted and unique. It returns nil when a port is named
// (those resolve per computation) and an empty list when nothing matches.
func staticPorts(ports []PortSpec) []l4Key {
	if ports == nil {
		return anyL4
	}
	out := make([]l4Key, 0, len(ports))
	for _, p := range ports {
		if isNamed(p) {
			return nil
		}
		out = appendPort(out, p)
	}
	for i := range out {
		out[i] = normalL4(out[i])
	}
	slices.SortFunc(out, func(a, b l4Key) int { return cmp.Compare(packKey(0, a), packKey(0, b)) })
	return slices.Clip(slices.Compact(out))
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
		if !isNamed(p) {
			out = appendPort(out, p)
			continue
		}
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
	}
	return out
}

// isNamed reports whether p is a named port (an ICMP type never is).
func isNamed(p PortSpec) bool { return !p.ICMP && p.Name != "" }

// appendPort appends the keys of a port that is not named.
func appendPort(out []l4Key, p PortSpec) []l4Key {
	switch {
	case p.ICMP:
		return append(out, l4Key{proto: p.Proto, port: p.Port, plen: 16})
	case p.Port == 0:
		return append(out, l4Key{proto: p.Proto})
	}
	return appendPortRange(out, p.Proto, p.Port, max(p.EndPort, p.Port))
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
