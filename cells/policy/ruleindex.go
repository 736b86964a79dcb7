package policy

import "github.com/cellium/cellium/statedb/labels"

// ruleIndex finds the rules whose subject may select a set of labels
// without matching every rule: a rule whose subject has an "In"
// requirement can only select labels holding that requirement's key with
// one of its values, so it is filed under each such (key, value); a rule
// whose subject has none (only NotIn, Exists, DoesNotExist, or no
// requirement at all) is filed with the rules every lookup returns. The
// requirement filed under is the one indexLabels picks for the selector
// cache.
//
// A lookup returns a superset of the selecting rules, never less: the
// caller still matches each candidate.
type ruleIndex struct {
	byLabel map[kv]map[*compiledRule]struct{}
	other   map[*compiledRule]struct{}
}

func newRuleIndex() ruleIndex {
	return ruleIndex{byLabel: map[kv]map[*compiledRule]struct{}{}, other: map[*compiledRule]struct{}{}}
}

// add files cr under what its subject sel requires.
func (x *ruleIndex) add(cr *compiledRule, sel *Selector) {
	kvs := indexLabels(sel)
	if kvs == nil {
		x.other[cr] = struct{}{}
		return
	}
	for _, k := range kvs {
		set := x.byLabel[k]
		if set == nil {
			set = map[*compiledRule]struct{}{}
			x.byLabel[k] = set
		}
		set[cr] = struct{}{}
	}
}

// remove undoes add(cr, sel).
func (x *ruleIndex) remove(cr *compiledRule, sel *Selector) {
	kvs := indexLabels(sel)
	if kvs == nil {
		delete(x.other, cr)
		return
	}
	for _, k := range kvs {
		if set := x.byLabel[k]; set != nil {
			delete(set, cr)
			if len(set) == 0 {
				delete(x.byLabel, k)
			}
		}
	}
}

// candidates calls f for every rule whose subject may select lbls. A rule
// is passed at most once: labels have one value per key, and a rule is
// filed under the values of a single key.
func (x *ruleIndex) candidates(lbls labels.Labels, f func(*compiledRule)) {
	for cr := range x.other {
		f(cr)
	}
	for l := range lbls.All() {
		for cr := range x.byLabel[kv{l.Key, l.Value}] {
			f(cr)
		}
	}
}
