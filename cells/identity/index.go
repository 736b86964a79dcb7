package identity

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"

	"github.com/cilium/statedb"
	"k8s.io/apimachinery/pkg/util/resourceversion"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/statedb/identity"
	"github.com/cellium/cellium/statedb/labels"
)

// cidEntry is one CiliumIdentity as the index sees it.
type cidEntry struct {
	id     identity.NumericIdentity
	key    string // labels.SortedList(): equal keys, equal label sets
	labels labels.Labels
	obj    *ciliumv2.CiliumIdentity
}

// labelIndex finds CiliumIdentities by their security labels. The
// CiliumIdentity table belongs to the k8s cells and is indexed by name
// only, so the index is built here from the table's change stream.
//
// sync brings it up to a given snapshot of the table, so that a caller who
// has seen an object in the table can count on the index holding it too.
type labelIndex struct {
	db    *statedb.DB
	table statedb.Table[*ciliumv2.CiliumIdentity]

	mu      sync.Mutex
	changes statedb.ChangeIterator[*ciliumv2.CiliumIdentity] // nil before start and after stop
	byID    map[identity.NumericIdentity]cidEntry
	byKey   map[string]map[identity.NumericIdentity]struct{}
}

func newLabelIndex(db *statedb.DB, table statedb.Table[*ciliumv2.CiliumIdentity]) *labelIndex {
	return &labelIndex{
		db:    db,
		table: table,
		byID:  map[identity.NumericIdentity]cidEntry{},
		byKey: map[string]map[identity.NumericIdentity]struct{}{},
	}
}

// job keeps the index current (and the table's graveyard drained) while
// the hive runs.
func (x *labelIndex) job() hive.Job {
	return hive.Service("identity-label-index", x.subscribe, x.run)
}

func (x *labelIndex) subscribe() error {
	wtxn := x.db.WriteTxn(x.table)
	changes, err := x.table.Changes(wtxn)
	wtxn.Commit()
	if err != nil {
		return fmt.Errorf("subscribe to %s: %w", x.table.Name(), err)
	}
	x.mu.Lock()
	x.changes = changes
	x.mu.Unlock()
	return nil
}

func (x *labelIndex) run(ctx context.Context, h hive.Health) {
	defer func() {
		x.mu.Lock()
		if x.changes != nil {
			x.changes.Close()
			x.changes = nil
		}
		x.mu.Unlock()
	}()
	for {
		watch, err := x.sync(x.db.ReadTxn())
		if err != nil {
			h.Degraded("sync", err)
			return
		}
		h.OK(fmt.Sprintf("%d identities indexed", x.len()))
		select {
		case <-ctx.Done():
			return
		case <-watch:
		}
	}
}

// sync applies every change of the table up to txn. It returns a channel
// that closes when the table changes again.
func (x *labelIndex) sync(txn statedb.ReadTxn) (<-chan struct{}, error) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.changes == nil {
		return nil, ErrNotStarted
	}
	seq, watch := x.changes.Next(txn)
	for change := range seq {
		id, err := identity.ParseNumericIdentity(change.Object.Name)
		if err != nil {
			continue // not an identity cellium or Cilium made
		}
		x.remove(id)
		if !change.Deleted {
			lbls := labels.FromMap(change.Object.SecurityLabels, "")
			e := cidEntry{id: id, key: lbls.SortedList(), labels: lbls, obj: change.Object}
			x.byID[id] = e
			if x.byKey[e.key] == nil {
				x.byKey[e.key] = map[identity.NumericIdentity]struct{}{}
			}
			x.byKey[e.key][id] = struct{}{}
		}
	}
	return watch, nil
}

// remove drops id from the index; x.mu is held.
func (x *labelIndex) remove(id identity.NumericIdentity) {
	old, ok := x.byID[id]
	if !ok {
		return
	}
	delete(x.byID, id)
	delete(x.byKey[old.key], id)
	if len(x.byKey[old.key]) == 0 {
		delete(x.byKey, old.key)
	}
}

func (x *labelIndex) len() int {
	x.mu.Lock()
	defer x.mu.Unlock()
	return len(x.byID)
}

// get returns the identity with number id.
func (x *labelIndex) get(id identity.NumericIdentity) (cidEntry, bool) {
	x.mu.Lock()
	defer x.mu.Unlock()
	e, ok := x.byID[id]
	return e, ok
}

// preferred returns, of the identities with the labels key whose number
// passes ok, the one every agent picks (see earlier).
func (x *labelIndex) preferred(key string, ok func(identity.NumericIdentity) bool) (cidEntry, bool) {
	x.mu.Lock()
	defer x.mu.Unlock()
	var best cidEntry
	found := false
	for id := range x.byKey[key] {
		e := x.byID[id]
		if ok(id) && (!found || earlier(e, best)) {
			best, found = e, true
		}
	}
	return best, found
}

// all returns every indexed identity, sorted by number.
func (x *labelIndex) all() []cidEntry {
	x.mu.Lock()
	defer x.mu.Unlock()
	return slices.SortedFunc(maps.Values(x.byID), func(a, b cidEntry) int { return cmp.Compare(a.id, b.id) })
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
