package policy

import (
	"maps"
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
	}
	for _, r := range identity.AllReserved() {
		sc.identities[r.ID] = r.Labels
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
	for id, lbls := range sc.identities {
		if m.Matches(id, lbls) {
			cs.ids[id] = struct{}{}
		}
	}
	cs.resort()
	sc.selectors[key] = cs
	return cs
}

// release drops a use of cs, forgetting it after the last.
func (sc *SelectorCache) release(cs *cachedSelector) {
	cs.refs--
	if cs.refs <= 0 {
		delete(sc.selectors, cs.m.String())
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
		if _, ok := sc.identities[id]; !ok {
			continue
		}
		delete(sc.identities, id)
		for _, cs := range sc.selectors {
			if _, ok := cs.ids[id]; ok {
				delete(cs.ids, id)
				changed[cs] = struct{}{}
			}
		}
	}
	for id, lbls := range upserts {
		if old, ok := sc.identities[id]; ok && old.Equal(lbls) {
			continue
		}
		sc.identities[id] = lbls
		for _, cs := range sc.selectors {
			_, had := cs.ids[id]
			if has := cs.m.Matches(id, lbls); has != had {
				if has {
					cs.ids[id] = struct{}{}
				} else {
					delete(cs.ids, id)
				}
				changed[cs] = struct{}{}
			}
		}
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
