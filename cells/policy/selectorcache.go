package policy

import (
	"maps"
	"net/netip"
	"slices"

	"github.com/cellium/cellium/statedb/identity"
	"github.com/cellium/cellium/statedb/labels"
)

// SelectorCache knows every identity (number and labels) and, for every
// selector in use, the set of identities it selects. Identity changes
// update the sets incrementally. It starts with the reserved identities.
//
// A SelectorCache is not safe for concurrent use; the Engine guards its own.
type SelectorCache struct {
	identities map[identity.NumericIdentity]labels.Labels
	selectors  map[string]*cachedSelector

	// Indexes that keep updates from scanning everything: identities by
	// label (key, value) and CIDR identities by prefix; selectors by the
	// label an "In" requirement demands, CIDR selectors, and the rest.
	idsByLabel map[kv]map[identity.NumericIdentity]struct{}
	cidrIDs    []cidrID // sorted by cidrID.compare
	selByLabel map[kv]map[*cachedSelector]struct{}
	cidrSels   map[netip.Prefix]map[*cachedSelector]struct{} // by the selector's prefix
	otherSels  map[*cachedSelector]struct{}
}

// kv is a label key and value (of any source).
type kv struct{ key, value string }

// cidrID is a CIDR identity and its prefix.
type cidrID struct {
	p  netip.Prefix
	id identity.NumericIdentity
}

// compare orders by address, then prefix length, then identity: the
// prefixes inside a prefix P are then a run starting at P's address.
func (c cidrID) compare(o cidrID) int {
	if r := comparePrefix(c.p, o.p); r != 0 {
		return r
	}
	return int(c.id) - int(o.id)
}

// cidrIDsIn calls f for every CIDR identity whose prefix lies inside p
// (and possibly a few more, of the same address but a shorter prefix).
func (sc *SelectorCache) cidrIDsIn(p netip.Prefix, f func(identity.NumericIdentity, labels.Labels)) {
	i, _ := slices.BinarySearchFunc(sc.cidrIDs, p.Addr(), func(c cidrID, a netip.Addr) int { return c.p.Addr().Compare(a) })
	for ; i < len(sc.cidrIDs) && p.Contains(sc.cidrIDs[i].p.Addr()); i++ {
		f(sc.cidrIDs[i].id, sc.identities[sc.cidrIDs[i].id])
	}
}

// indexLabels returns the (key, value) pairs an "In" requirement of a
// Selector demands, preferring keys other than the namespace and cluster
// (which select many identities); nil when the selector has none.
func indexLabels(m Matcher) []kv {
	sel, ok := m.(*Selector)
	if !ok {
		return nil
	}
	var best *Requirement
	for i := range sel.reqs {
		r := &sel.reqs[i]
		if r.Op != OpIn {
			continue
		}
		if best == nil || (best.Key == labels.PodNamespaceLabel || best.Key == labels.PolicyLabelCluster) {
			best = r
		}
	}
	if best == nil {
		return nil
	}
	out := make([]kv, len(best.Values))
	for i, v := range best.Values {
		out[i] = kv{best.Key, v}
	}
	return out
}

func (sc *SelectorCache) indexIdentity(id identity.NumericIdentity, lbls labels.Labels, add bool) {
	for l := range lbls.All() {
		k := kv{l.Key, l.Value}
		if add {
			if sc.idsByLabel[k] == nil {
				sc.idsByLabel[k] = map[identity.NumericIdentity]struct{}{}
			}
			sc.idsByLabel[k][id] = struct{}{}
		} else if set := sc.idsByLabel[k]; set != nil {
			delete(set, id)
			if len(set) == 0 {
				delete(sc.idsByLabel, k)
			}
		}
	}
	// Only identities whose prefix reads can be selected by a CIDR
	// selector (see CIDRSelector.Matches).
	if p, ok := CIDRIdentityPrefix(lbls); ok {
		c := cidrID{p: p, id: id}
		i, found := slices.BinarySearchFunc(sc.cidrIDs, c, cidrID.compare)
		switch {
		case add && !found:
			sc.cidrIDs = slices.Insert(sc.cidrIDs, i, c)
		case !add && found:
			sc.cidrIDs = slices.Delete(sc.cidrIDs, i, i+1)
		}
	}
}

func (sc *SelectorCache) indexSelector(cs *cachedSelector, add bool) {
	if c, ok := cs.m.(*CIDRSelector); ok {
		if add {
			if sc.cidrSels[c.Prefix] == nil {
				sc.cidrSels[c.Prefix] = map[*cachedSelector]struct{}{}
			}
			sc.cidrSels[c.Prefix][cs] = struct{}{}
		} else if set := sc.cidrSels[c.Prefix]; set != nil {
			delete(set, cs)
			if len(set) == 0 {
				delete(sc.cidrSels, c.Prefix)
			}
		}
		return
	}
	kvs := indexLabels(cs.m)
	if kvs == nil {
		if add {
			sc.otherSels[cs] = struct{}{}
		} else {
			delete(sc.otherSels, cs)
		}
		return
	}
	for _, k := range kvs {
		if add {
			if sc.selByLabel[k] == nil {
				sc.selByLabel[k] = map[*cachedSelector]struct{}{}
			}
			sc.selByLabel[k][cs] = struct{}{}
		} else if set := sc.selByLabel[k]; set != nil {
			delete(set, cs)
			if len(set) == 0 {
				delete(sc.selByLabel, k)
			}
		}
	}
}

// candidateSelectors calls f for every selector that might select the
// identity (a superset; f may see a selector more than once).
func (sc *SelectorCache) candidateSelectors(id identity.NumericIdentity, lbls labels.Labels, f func(*cachedSelector)) {
	for cs := range sc.otherSels {
		f(cs)
	}
	// CIDR selectors select a CIDR identity when their prefix contains the
	// identity's, and the world identities when their prefix is /0: look
	// them up by every prefix containing the identity's.
	if p, ok := CIDRIdentityPrefix(lbls); ok {
		for bits := 0; bits <= p.Bits(); bits++ {
			outer, _ := p.Addr().Prefix(bits)
			for cs := range sc.cidrSels[outer] {
				f(cs)
			}
		}
	}
	switch id {
	case identity.ReservedIdentityWorld, identity.ReservedIdentityWorldIPv4, identity.ReservedIdentityWorldIPv6:
		for _, all := range []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0"), netip.MustParsePrefix("::/0")} {
			for cs := range sc.cidrSels[all] {
				f(cs)
			}
		}
	}
	for l := range lbls.All() {
		for cs := range sc.selByLabel[kv{l.Key, l.Value}] {
			f(cs)
		}
	}
}

// candidateIdentities calls f for every identity m might select.
func (sc *SelectorCache) candidateIdentities(m Matcher, f func(identity.NumericIdentity, labels.Labels)) {
	if c, ok := m.(*CIDRSelector); ok {
		sc.cidrIDsIn(c.Prefix, f)
		for _, id := range []identity.NumericIdentity{identity.ReservedIdentityWorld, identity.ReservedIdentityWorldIPv4, identity.ReservedIdentityWorldIPv6} {
			if l, ok := sc.identities[id]; ok {
				f(id, l)
			}
		}
		return
	}
	if kvs := indexLabels(m); kvs != nil {
		for _, k := range kvs {
			for id := range sc.idsByLabel[k] {
				f(id, sc.identities[id])
			}
		}
		return
	}
	for id, l := range sc.identities {
		f(id, l)
	}
}

// cachedSelector is one selector in use, the identities it selects, and
// the rules using it.
type cachedSelector struct {
	m      Matcher
	refs   int
	ids    map[identity.NumericIdentity]struct{}
	sorted []identity.NumericIdentity // ids, sorted; replaced, never modified

	subjectOf map[*compiledRule]struct{} // rules selecting their subjects with it
	peerOf    map[*compiledRule]int      // rules using it as a peer, with a count
}

// NewSelectorCache returns a cache holding the reserved identities
// (host, world, unmanaged, health, init, remote-node, kube-apiserver,
// ingress, world-ipv4, world-ipv6) and no selector.
func NewSelectorCache() *SelectorCache {
	sc := &SelectorCache{
		identities: map[identity.NumericIdentity]labels.Labels{},
		selectors:  map[string]*cachedSelector{},
		idsByLabel: map[kv]map[identity.NumericIdentity]struct{}{},
		selByLabel: map[kv]map[*cachedSelector]struct{}{},
		cidrSels:   map[netip.Prefix]map[*cachedSelector]struct{}{},
		otherSels:  map[*cachedSelector]struct{}{},
	}
	for _, r := range identity.AllReserved() {
		sc.identities[r.ID] = r.Labels
		sc.indexIdentity(r.ID, r.Labels, true)
	}
	return sc
}

// Labels returns the labels of a known identity.
func (sc *SelectorCache) Labels(id identity.NumericIdentity) (labels.Labels, bool) {
	l, ok := sc.identities[id]
	return l, ok
}

// NumIdentities returns how many identities the cache knows.
func (sc *SelectorCache) NumIdentities() int { return len(sc.identities) }

// add registers a use of m and returns its entry.
func (sc *SelectorCache) add(m Matcher) *cachedSelector {
	key := m.String()
	if cs, ok := sc.selectors[key]; ok {
		cs.refs++
		return cs
	}
	cs := &cachedSelector{m: m, refs: 1, ids: map[identity.NumericIdentity]struct{}{},
		subjectOf: map[*compiledRule]struct{}{}, peerOf: map[*compiledRule]int{}}
	sc.candidateIdentities(m, func(id identity.NumericIdentity, lbls labels.Labels) {
		if m.Matches(id, lbls) {
			cs.ids[id] = struct{}{}
		}
	})
	cs.resort()
	sc.selectors[key] = cs
	sc.indexSelector(cs, true)
	return cs
}

// release drops a use of cs, forgetting it after the last.
func (sc *SelectorCache) release(cs *cachedSelector) {
	cs.refs--
	if cs.refs <= 0 {
		delete(sc.selectors, cs.m.String())
		sc.indexSelector(cs, false)
	}
}

// Selections returns the identities the selector with the text key (a
// Matcher's String) selects, sorted, and whether the selector is in use.
func (sc *SelectorCache) Selections(key string) ([]identity.NumericIdentity, bool) {
	cs, ok := sc.selectors[key]
	if !ok {
		return nil, false
	}
	return cs.selections(), true
}

// selections returns the sorted identities; the slice is shared and never
// modified, a change replaces it.
func (cs *cachedSelector) selections() []identity.NumericIdentity { return cs.sorted }

func (cs *cachedSelector) resort() {
	cs.sorted = slices.Sorted(maps.Keys(cs.ids))
}

// update inserts or replaces identities and deletes others, and returns the
// selectors whose selections changed.
func (sc *SelectorCache) update(upserts map[identity.NumericIdentity]labels.Labels, deletes []identity.NumericIdentity) []*cachedSelector {
	changed := map[*cachedSelector]struct{}{}
	for _, id := range deletes {
		old, ok := sc.identities[id]
		if !ok {
			continue
		}
		sc.candidateSelectors(id, old, func(cs *cachedSelector) {
			if _, ok := cs.ids[id]; ok {
				delete(cs.ids, id)
				changed[cs] = struct{}{}
			}
		})
		delete(sc.identities, id)
		sc.indexIdentity(id, old, false)
	}
	for id, lbls := range upserts {
		old, had := sc.identities[id]
		if had && old.Equal(lbls) {
			continue
		}
		if had {
			sc.indexIdentity(id, old, false)
		}
		sc.identities[id] = lbls
		sc.indexIdentity(id, lbls, true)
		check := func(cs *cachedSelector) {
			_, was := cs.ids[id]
			if is := cs.m.Matches(id, lbls); is != was {
				if is {
					cs.ids[id] = struct{}{}
				} else {
					delete(cs.ids, id)
				}
				changed[cs] = struct{}{}
			}
		}
		if had {
			sc.candidateSelectors(id, old, check)
		}
		sc.candidateSelectors(id, lbls, check)
	}
	out := make([]*cachedSelector, 0, len(changed))
	for cs := range changed {
		cs.resort()
		out = append(out, cs)
	}
	return out
}

// SelectorInfo describes one selector in use, for `cellium policy
// selectors`.
type SelectorInfo struct {
	Selector   string                     `json:"selector"`
	Users      int                        `json:"users"`
	Identities []identity.NumericIdentity `json:"identities"`
}

// All returns every selector in use, sorted by text.
func (sc *SelectorCache) All() []SelectorInfo {
	out := make([]SelectorInfo, 0, len(sc.selectors))
	for key, cs := range sc.selectors {
		out = append(out, SelectorInfo{Selector: key, Users: cs.refs, Identities: slices.Clone(cs.selections())})
	}
	slices.SortFunc(out, func(a, b SelectorInfo) int {
		if a.Selector < b.Selector {
			return -1
		}
		if a.Selector > b.Selector {
			return 1
		}
		return 0
	})
	return out
}
