package policy

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"sync"

	"github.com/cellium/cellium/statedb/identity"
	"github.com/cellium/cellium/statedb/labels"
	statepolicy "github.com/cellium/cellium/statedb/policy"
)

// Mode is the agent's policy enforcement mode (--enable-policy).
type Mode string

// The enforcement modes, as in Cilium.
const (
	// ModeDefault enforces a direction of an endpoint once a rule selects
	// the endpoint for it; without such a rule everything passes.
	ModeDefault Mode = "default"
	// ModeAlways enforces every direction of every endpoint: without a
	// rule nothing passes.
	ModeAlways Mode = "always"
	// ModeNever enforces nothing: everything passes.
	ModeNever Mode = "never"
)

// ParseMode reads an --enable-policy value.
//
// Possible errors: a value other than default, always and never.
func ParseMode(s string) (Mode, error) {
	switch m := Mode(s); m {
	case ModeDefault, ModeAlways, ModeNever:
		return m, nil
	}
	return "", fmt.Errorf("--enable-policy=%q: want default, always or never", s)
}

// NamedPort is a container port by name.
type NamedPort struct {
	Port  uint16
	Proto uint8 // 0: any
}

// Endpoint is what the engine needs to know about an endpoint to compute
// its policy.
type Endpoint struct {
	// Identity is the endpoint's identity. When the engine knows it, the
	// rules selecting it are found through the selector cache; otherwise
	// Labels are matched against every rule.
	Identity identity.NumericIdentity
	// Labels are the endpoint's identity labels; used when Identity is 0 or
	// unknown to the engine.
	Labels labels.Labels
	// NamedPorts are the endpoint's container ports by name; ingress rules
	// naming a port are resolved against them.
	NamedPorts map[string][]NamedPort
}

// Changes says which endpoints a change may have affected.
type Changes struct {
	// Revision is the engine's revision after the change.
	Revision uint64
	// All is set when any endpoint may be affected.
	All bool
	// Identities are the identities whose endpoints may be affected.
	Identities map[identity.NumericIdentity]struct{}
}

// Affects reports whether endpoints with identity id may be affected.
func (c *Changes) Affects(id identity.NumericIdentity) bool {
	if c.All {
		return true
	}
	_, ok := c.Identities[id]
	return ok
}

func (c *Changes) add(ids ...identity.NumericIdentity) {
	if c.Identities == nil {
		c.Identities = map[identity.NumericIdentity]struct{}{}
	}
	for _, id := range ids {
		c.Identities[id] = struct{}{}
	}
}

// compiledRule is a rule with its selectors registered in the cache.
type compiledRule struct {
	rule    *Rule
	name    string
	seq     uint64                 // unique per compilation: names the rule in policy cache keys
	subject *cachedSelector        // nil: selects nothing
	peers   [2][][]*cachedSelector // per direction, per entry
	// ports are the resolved ports per direction and entry, normalised and
	// unique; nil for an entry with a named port, which resolves per
	// computation.
	ports [2][][]l4Key
	// ingressNames are the named ports its ingress entries use, sorted and
	// unique: the part of an endpoint that shapes its ingress policy.
	ingressNames []string
}

// cidrIdentity is a local identity allocated for a prefix rules use.
type cidrIdentity struct {
	id   identity.NumericIdentity
	refs int
}

// Engine holds the rules (the repository), the selector cache and the
// local CIDR identities, and computes endpoint policies. Safe for
// concurrent use.
type Engine struct {
	mode Mode

	mu        sync.RWMutex
	revision  uint64
	sc        *SelectorCache
	sources   map[Source][]*compiledRule
	bySubject map[identity.NumericIdentity][]*compiledRule // every known identity, with the rules selecting it (unordered)
	cidrs     map[netip.Prefix]*cidrIdentity
	freeLocal []identity.NumericIdentity
	nextLocal identity.NumericIdentity
	egressNP  map[string][]NamedPort
	nextSeq   uint64

	// subjects indexes the rules by what their subject requires, for
	// endpoints known only by labels (see ruleindex.go).
	subjects ruleIndex
	// cache holds computed direction policies by what they depend on (see
	// policycache.go); every change that could alter one empties it.
	cache policyCache
}

// NewEngine returns an engine with no rules, the reserved identities, and
// enforcement mode mode (empty means ModeDefault).
func NewEngine(mode Mode) *Engine {
	if mode == "" {
		mode = ModeDefault
	}
	e := &Engine{
		mode:      mode,
		revision:  1,
		sc:        NewSelectorCache(),
		sources:   map[Source][]*compiledRule{},
		bySubject: map[identity.NumericIdentity][]*compiledRule{},
		cidrs:     map[netip.Prefix]*cidrIdentity{},
		nextLocal: identity.MinLocalIdentity,
		subjects:  newRuleIndex(),
	}
	for id := range e.sc.identities {
		e.bySubject[id] = nil
	}
	return e
}

// Revision returns the repository revision: it grows with every change of
// rules.
func (e *Engine) Revision() uint64 {
	e.mu.RLock()
	defer e.mu.RUnlock()
	return e.revision
}

// UpsertRules replaces every rule of src with rules (all of which must have
// Source src) and returns the affected endpoints.
func (e *Engine) UpsertRules(src Source, rules []*Rule) Changes {
	e.mu.Lock()
	defer e.mu.Unlock()
	var ch Changes
	e.removeLocked(src, &ch)
	var crs []*compiledRule
	for _, r := range rules {
		crs = append(crs, e.compileLocked(r, &ch))
	}
	if len(crs) > 0 {
		e.sources[src] = crs
	}
	e.cache.flush()
	e.revision++
	ch.Revision = e.revision
	return ch
}

// DeleteRules removes every rule of src and returns the affected endpoints.
func (e *Engine) DeleteRules(src Source) Changes {
	e.mu.Lock()
	defer e.mu.Unlock()
	var ch Changes
	if _, ok := e.sources[src]; !ok {
		ch.Revision = e.revision
		return ch
	}
	e.removeLocked(src, &ch)
	e.cache.flush()
	e.revision++
	ch.Revision = e.revision
	return ch
}

// Rules returns every rule, ordered by source and index.
func (e *Engine) Rules() []*Rule {
	e.mu.RLock()
	defer e.mu.RUnlock()
	var out []*Rule
	for _, crs := range e.sources {
		for _, cr := range crs {
			out = append(out, cr.rule)
		}
	}
	slices.SortFunc(out, func(a, b *Rule) int {
		if a.Source != b.Source {
			if a.Source.String() < b.Source.String() {
				return -1
			}
			return 1
		}
		return a.Index - b.Index
	})
	return out
}

func (e *Engine) compileLocked(r *Rule, ch *Changes) *compiledRule {
	e.nextSeq++
	cr := &compiledRule{rule: r, name: r.Name(), seq: e.nextSeq}
	for _, ent := range r.Ingress {
		for _, p := range ent.Ports {
			if isNamed(p) {
				cr.ingressNames = append(cr.ingressNames, p.Name)
			}
		}
	}
	cr.ingressNames = slices.Compact(slices.Sorted(slices.Values(cr.ingressNames)))
	if r.Subject != nil {
		e.subjects.add(cr, r.Subject)
		cr.subject = e.sc.add(r.Subject)
		cr.subject.subjectOf[cr] = struct{}{}
		for id := range cr.subject.ids {
			e.addSubject(id, cr)
			ch.add(id)
		}
	}
	for _, d := range []statepolicy.Direction{statepolicy.Ingress, statepolicy.Egress} {
		for _, ent := range r.entries(d) {
			var css []*cachedSelector
			for _, m := range ent.Peers {
				if c, ok := m.(*CIDRSelector); ok {
					e.retainCIDRLocked(c.Prefix, ch)
					for _, x := range c.Except {
						e.retainCIDRLocked(x, ch)
					}
				}
				cs := e.sc.add(m)
				cs.peerOf[cr]++
				css = append(css, cs)
			}
			cr.peers[d] = append(cr.peers[d], css)
			cr.ports[d] = append(cr.ports[d], staticPorts(ent.Ports))
		}
	}
	return cr
}

func (e *Engine) removeLocked(src Source, ch *Changes) {
	for _, cr := range e.sources[src] {
		if cr.subject != nil {
			e.subjects.remove(cr, cr.rule.Subject)
			delete(cr.subject.subjectOf, cr)
			for id := range cr.subject.ids {
				e.removeSubject(id, cr)
				ch.add(id)
			}
			e.sc.release(cr.subject)
		}
		for d := range cr.peers {
			for i, css := range cr.peers[d] {
				for j, cs := range css {
					if cs.peerOf[cr]--; cs.peerOf[cr] <= 0 {
						delete(cs.peerOf, cr)
					}
					e.sc.release(cs)
					if c, ok := cr.rule.entries(statepolicy.Direction(d))[i].Peers[j].(*CIDRSelector); ok {
						e.releaseCIDRLocked(c.Prefix, ch)
						for _, x := range c.Except {
							e.releaseCIDRLocked(x, ch)
						}
					}
				}
			}
		}
	}
	delete(e.sources, src)
}

// retainCIDRLocked takes a reference on the local identity of prefix,
// allocating it (and adding it to the selector cache) on first use. A /0
// prefix needs none: the world identities stand for it.
func (e *Engine) retainCIDRLocked(p netip.Prefix, ch *Changes) {
	if p.Bits() == 0 {
		return
	}
	if c, ok := e.cidrs[p]; ok {
		c.refs++
		return
	}
	var id identity.NumericIdentity
	if n := len(e.freeLocal); n > 0 {
		id, e.freeLocal = e.freeLocal[n-1], e.freeLocal[:n-1]
	} else {
		id = e.nextLocal
		e.nextLocal++
	}
	e.cidrs[p] = &cidrIdentity{id: id, refs: 1}
	e.updateIdentitiesLocked(map[identity.NumericIdentity]labels.Labels{id: CIDRIdentityLabels(p)}, nil, ch)
}

func (e *Engine) releaseCIDRLocked(p netip.Prefix, ch *Changes) {
	c, ok := e.cidrs[p]
	if !ok {
		return
	}
	if c.refs--; c.refs > 0 {
		return
	}
	delete(e.cidrs, p)
	e.freeLocal = append(e.freeLocal, c.id)
	e.updateIdentitiesLocked(nil, []identity.NumericIdentity{c.id}, ch)
}

// CIDRIdentities returns the local identity of every prefix rules use: the
// ipcache entries (prefix -> identity) the datapath needs for CIDR rules.
func (e *Engine) CIDRIdentities() map[netip.Prefix]identity.NumericIdentity {
	e.mu.RLock()
	defer e.mu.RUnlock()
	out := make(map[netip.Prefix]identity.NumericIdentity, len(e.cidrs))
	for p, c := range e.cidrs {
		out[p] = c.id
	}
	return out
}

// UpdateIdentities adds or replaces the identities in upserts and removes
// those in deletes (the identity table's changes), and returns the affected
// endpoints. Reserved identities can be relabelled but are usually fixed.
func (e *Engine) UpdateIdentities(upserts map[identity.NumericIdentity]labels.Labels, deletes []identity.NumericIdentity) Changes {
	e.mu.Lock()
	defer e.mu.Unlock()
	var ch Changes
	e.updateIdentitiesLocked(upserts, deletes, &ch)
	ch.Revision = e.revision
	return ch
}

func (e *Engine) updateIdentitiesLocked(upserts map[identity.NumericIdentity]labels.Labels, deletes []identity.NumericIdentity, ch *Changes) {
	for _, id := range deletes {
		ch.add(id)
	}
	for id := range upserts {
		ch.add(id)
	}
	changed := e.sc.update(upserts, deletes)
	if len(changed) > 0 {
		// Computed policies read only the rules, the selections of their
		// peer selectors and the named ports: an identity change that
		// moves no selection leaves every cached policy valid.
		e.cache.flush()
	}
	for _, cs := range changed {
		for cr := range cs.peerOf {
			if cr.subject != nil {
				ch.add(slices.Collect(maps.Keys(cr.subject.ids))...)
			}
		}
		if len(cs.subjectOf) == 0 {
			continue
		}
		for id := range upserts {
			_, sel := cs.ids[id]
			for cr := range cs.subjectOf {
				if sel {
					e.addSubject(id, cr)
				} else {
					e.removeSubject(id, cr)
				}
			}
		}
		for _, id := range deletes {
			if _, sel := cs.ids[id]; !sel {
				for cr := range cs.subjectOf {
					e.removeSubject(id, cr)
				}
			}
		}
	}
	for _, id := range deletes {
		if _, ok := e.sc.identities[id]; !ok {
			delete(e.bySubject, id)
		}
	}
	for id := range upserts {
		if _, ok := e.bySubject[id]; !ok {
			e.bySubject[id] = nil
		}
	}
}

// addSubject records that cr selects identity id. The rules selecting one
// identity are few, so a slice serves better than a map.
func (e *Engine) addSubject(id identity.NumericIdentity, cr *compiledRule) {
	crs := e.bySubject[id]
	if !slices.Contains(crs, cr) {
		e.bySubject[id] = append(crs, cr)
	}
}

// removeSubject records that cr does not select identity id.
func (e *Engine) removeSubject(id identity.NumericIdentity, cr *compiledRule) {
	crs, ok := e.bySubject[id]
	if !ok {
		return
	}
	if i := slices.Index(crs, cr); i >= 0 {
		crs[i] = crs[len(crs)-1]
		crs[len(crs)-1] = nil
		e.bySubject[id] = crs[:len(crs)-1]
	}
}

// SetEgressNamedPorts sets the named ports egress rules are resolved
// against: the container ports of the pods the agent knows, by name. Every
// endpoint may be affected, unless the ports are the same as before.
func (e *Engine) SetEgressNamedPorts(ports map[string][]NamedPort) Changes {
	e.mu.Lock()
	defer e.mu.Unlock()
	if maps.EqualFunc(e.egressNP, ports, slices.Equal) {
		return Changes{Revision: e.revision}
	}
	e.egressNP = ports
	e.cache.flush()
	e.revision++
	return Changes{Revision: e.revision, All: true}
}

// Selectors returns every selector in use and the identities it selects.
func (e *Engine) Selectors() []SelectorInfo {
	e.mu.RLock()
	defer e.mu.RUnlock()
	return e.sc.All()
}

// IdentityLabels returns the labels of an identity the engine knows.
func (e *Engine) IdentityLabels(id identity.NumericIdentity) (labels.Labels, bool) {
	e.mu.RLock()
	defer e.mu.RUnlock()
	return e.sc.Labels(id)
}
