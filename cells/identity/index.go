package identity

import (
	"cmp"
	"slices"

	"github.com/cilium/statedb"
	"k8s.io/apimachinery/pkg/util/resourceversion"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	"github.com/cellium/cellium/statedb/identity"
	k8stables "github.com/cellium/cellium/statedb/k8s"
	"github.com/cellium/cellium/statedb/labels"
)

// cidEntry is one CiliumIdentity as the allocator sees it.
type cidEntry struct {
	id     identity.NumericIdentity
	key    string // labels.SortedList(): equal keys, equal label sets
	labels labels.Labels
	obj    *ciliumv2.CiliumIdentity
}

// toEntry parses a CiliumIdentity; false for an object whose name is not
// an identity number (not one cellium or Cilium made).
func toEntry(obj *ciliumv2.CiliumIdentity) (cidEntry, bool) {
	id, err := identity.ParseNumericIdentity(obj.Name)
	if err != nil {
		return cidEntry{}, false
	}
	lbls := labels.FromMap(obj.SecurityLabels, "")
	return cidEntry{id: id, key: lbls.SortedList(), labels: lbls, obj: obj}, true
}

// identities queries the CiliumIdentity table (the k8s cells' mirror) by
// number and by labels (k8stables.CiliumIdentityLabelsIndex). A reader
// that has seen an object in a snapshot finds it in the indexes of the
// same snapshot: statedb updates them in the transaction that writes it.
type identities struct {
	table statedb.Table[*ciliumv2.CiliumIdentity]
}

// get returns the identity with number id in txn.
func (x identities) get(txn statedb.ReadTxn, id identity.NumericIdentity) (cidEntry, bool) {
	obj, _, found := x.table.Get(txn, k8stables.NameIndex[*ciliumv2.CiliumIdentity]().Query(id.StringID()))
	if !found {
		return cidEntry{}, false
	}
	return toEntry(obj)
}

// preferred returns, of the identities in txn with the labels key whose
// number passes ok, the one every agent picks (see earlier).
func (x identities) preferred(txn statedb.ReadTxn, key string, ok func(identity.NumericIdentity) bool) (cidEntry, bool) {
	var best cidEntry
	found := false
	for obj := range x.table.List(txn, k8stables.CiliumIdentityLabelsIndex.Query(key)) {
		e, valid := toEntry(obj)
		if valid && ok(e.id) && (!found || earlier(e, best)) {
			best, found = e, true
		}
	}
	return best, found
}

// all returns every identity in txn, sorted by number.
func (x identities) all(txn statedb.ReadTxn) []cidEntry {
	var out []cidEntry
	for obj := range x.table.All(txn) {
		if e, ok := toEntry(obj); ok {
			out = append(out, e)
		}
	}
	slices.SortFunc(out, func(a, b cidEntry) int { return cmp.Compare(a.id, b.id) })
	return out
}

// earlier orders identities with equal labels: the one created first wins,
// by creation time, then by resource version (comparable for objects of one
// resource, and ordered like the API server's watch stream), then by
// number. Every agent applies the same order, so they all pick the same
// identity; see converge for why "created first" is the order that agents
// with different views agree on.
func earlier(a, b cidEntry) bool {
	c := a.obj.CreationTimestamp.Time.Compare(b.obj.CreationTimestamp.Time)
	if c == 0 {
		if rv, err := resourceversion.CompareResourceVersion(a.obj.ResourceVersion, b.obj.ResourceVersion); err == nil {
			c = rv
		}
	}
	if c == 0 {
		c = cmp.Compare(a.id, b.id)
	}
	return c < 0
}
