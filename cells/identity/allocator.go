package identity

import (
	"cmp"
	"context"
	"fmt"
	"hash/fnv"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/cilium/statedb"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	ciliumv2client "github.com/cellium/cellium/api/client/clientset/versioned/typed/cilium.io/v2"
	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/cells/hive/reconcilejob"
	"github.com/cellium/cellium/cells/k8s"
	"github.com/cellium/cellium/statedb/identity"
	k8stables "github.com/cellium/cellium/statedb/k8s"
	"github.com/cellium/cellium/statedb/labels"
	"github.com/cellium/cellium/statedb/reconciler"
	"github.com/cellium/cellium/statedb/tables"
)

var errNoClient = fmt.Errorf("CiliumIdentities need the Kubernetes API: %w", k8s.ErrNotConfigured)

// convergeWait bounds how long an agent that created an identity waits to
// see it come back through its watch before it checks for duplicates.
const convergeWait = 10 * time.Second

// allocatorOptions are the allocator's tunables.
type allocatorOptions struct {
	// Min and Max bound the numbers the allocator creates.
	Min, Max identity.NumericIdentity
	// Timeout bounds one Allocate call.
	Timeout time.Duration
	// Metrics records the allocations reconciler's work; may be nil.
	Metrics reconciler.Metrics
	// KV is the kvstore backend in --identity-allocation-mode=kvstore
	// and the double-write modes; nil in CRD mode.
	KV *kvBackend
	// DoubleWrite (with KV) writes every identity both to etcd and as a
	// CiliumIdentity object; ReadKV says which of the two is read (the
	// CiliumIdentity table's source) and picks new numbers.
	DoubleWrite, ReadKV bool
}

// allocator is the CRD-mode Allocator.
//
// Reading: the k8s cells mirror every CiliumIdentity into a table indexed
// by labels (k8stables.CiliumIdentityLabelsIndex); the allocator queries
// it (identities).
//
// Writing: a new label set gets a number chosen deterministically from
// its labels (see create), so agents racing on the same labels try the
// same object name and the API server's name uniqueness picks one winner.
//
// Using: this agent's references are rows of the allocations table; the
// reconciler keeps each referenced identity present and unmarked.
type allocator struct {
	log    *slog.Logger
	db     *statedb.DB
	cids   statedb.Table[*ciliumv2.CiliumIdentity]
	allocs statedb.RWTable[*identity.Allocation]
	client ciliumv2client.CiliumIdentityInterface // nil without a Kubernetes API
	opts   allocatorOptions

	idx   identities
	locks keyLocks
	kv    *kvBackend // nil in CRD mode
	rec   *reconciler.Reconciler[*identity.Allocation]

	// restored maps the labels key of an identity that restored endpoints
	// used before the agent restarted to its number (see Restore).
	restoredMu sync.Mutex
	restored   map[string]identity.NumericIdentity
}

// newAllocatorWith validates opts and builds the allocator; it starts
// nothing (see jobs).
func newAllocatorWith(log *slog.Logger, db *statedb.DB, cids statedb.Table[*ciliumv2.CiliumIdentity],
	allocs statedb.RWTable[*identity.Allocation], client ciliumv2client.CiliumIdentityInterface, opts allocatorOptions,
) (*allocator, error) {
	if opts.Min == identity.InvalidIdentity || opts.Min > opts.Max {
		return nil, fmt.Errorf("identity allocator: invalid range %d..%d", opts.Min, opts.Max)
	}
	if opts.Timeout <= 0 {
		return nil, fmt.Errorf("identity allocator: timeout must be greater than 0")
	}
	a := &allocator{
		log: log, db: db, cids: cids, allocs: allocs, client: client, opts: opts,
		idx: identities{table: cids}, kv: opts.KV,
	}
	var ops reconciler.Operations[*identity.Allocation] = &identityOps{log: log, cids: cids, client: client}
	switch {
	case opts.KV != nil && opts.DoubleWrite:
		// Both backends. The CiliumIdentity table mirrors the objects
		// only when they are what is read; else the objects are read
		// from the API server.
		crd := &identityOps{log: log, client: client}
		if !opts.ReadKV {
			crd.cids = cids
		}
		ops = doubleWriteOps{&kvOps{b: opts.KV}, crd}
	case opts.KV != nil:
		ops = &kvOps{b: opts.KV}
	}
	rec, err := reconciler.New(db, reconciler.Config[*identity.Allocation]{
		Name:         "identity-allocations",
		Table:        allocs,
		GetStatus:    func(a *identity.Allocation) reconciler.Status { return a.Status },
		SetStatus:    func(a *identity.Allocation, s reconciler.Status) *identity.Allocation { return a.With(a.Refs, s) },
		Operations:   ops,
		FullInterval: fullReconcileInterval,
		RetryMin:     100 * time.Millisecond,
		RetryMax:     30 * time.Second,
		Metrics:      opts.Metrics,
	})
	if err != nil {
		return nil, err
	}
	a.rec = rec
	return a, nil
}

// jobs are the allocator's background work: the watch for deleted or
// marked identities in use, and the reconciler.
func (a *allocator) jobs() []hive.Job {
	jobs := []hive.Job{
		hive.ObserveTable("identity-in-use-watch", a.db, a.cids, a.onIdentityChange),
		reconcilejob.Job("identity-allocations", a.rec, nil),
	}
	if a.kv != nil {
		jobs = append(jobs, a.reRegisterJob())
	}
	return jobs
}

// Allocate implements Allocator.
func (a *allocator) Allocate(ctx context.Context, lbls labels.Labels) (Identity, error) {
	if lbls.Len() == 0 {
		return Identity{}, ErrNoLabels
	}
	if id, ok := identity.LookupReservedByLabels(lbls); ok {
		return Identity{ID: id, Labels: lbls}, nil
	}
	if identity.ScopeForLabels(lbls) != identity.IdentityScopeGlobal {
		return Identity{}, fmt.Errorf("allocate identity for %s: %w", lbls, ErrUnsupportedScope)
	}
	ctx, cancel := context.WithTimeout(ctx, a.opts.Timeout)
	defer cancel()
	key := lbls.SortedList()
	unlock, err := a.locks.lock(ctx, key)
	if err != nil {
		return Identity{}, fmt.Errorf("allocate identity for %s: %w", lbls, err)
	}
	defer unlock()

	// Fast path: this agent already uses an identity for these labels.
	if id, ok := a.addRefByKey(key); ok {
		return Identity{ID: id, Labels: lbls}, nil
	}
	id, err := a.resolveRestored(key)
	if err != nil {
		id, err = a.resolve(ctx, lbls, key)
	}
	if err == nil {
		err = a.addRef(id, lbls)
	}
	if err != nil {
		return Identity{}, fmt.Errorf("allocate identity for %s: %w", lbls, err)
	}
	return Identity{ID: id, Labels: lbls}, nil
}

// Restore implements Allocator.
func (a *allocator) Restore(lbls labels.Labels, id identity.NumericIdentity) {
	if id.IsReserved() || !a.inRange(id) || lbls.Len() == 0 {
		return
	}
	a.restoredMu.Lock()
	defer a.restoredMu.Unlock()
	if a.restored == nil {
		a.restored = map[string]identity.NumericIdentity{}
	}
	a.restored[lbls.SortedList()] = id
}

// errNotRestored: no restored identity applies.
var errNotRestored = fmt.Errorf("no restored identity")

// resolveRestored returns the restored number of the labels key while the
// CiliumIdentities are not listed yet (the API server is unreachable at
// boot). Once they are, the cluster's objects decide and the restored
// numbers are dropped.
func (a *allocator) resolveRestored(key string) (identity.NumericIdentity, error) {
	a.restoredMu.Lock()
	defer a.restoredMu.Unlock()
	if a.restored == nil {
		return 0, errNotRestored
	}
	if ok, _ := a.cids.Initialized(a.db.ReadTxn()); ok {
		a.restored = nil
		return 0, errNotRestored
	}
	id, ok := a.restored[key]
	if !ok {
		return 0, errNotRestored
	}
	return id, nil
}

// resolve finds the cluster's identity for lbls or creates one, in the
// backend that is read; in the double-write modes it then writes the same
// number to the other backend.
func (a *allocator) resolve(ctx context.Context, lbls labels.Labels, key string) (identity.NumericIdentity, error) {
	id, err := a.resolveRead(ctx, lbls, key)
	if err != nil || !a.opts.DoubleWrite {
		return id, err
	}
	if err := a.writeOther(ctx, id, lbls, key); err != nil {
		return 0, err
	}
	return id, nil
}

// writeOther writes identity id of lbls to the backend that is written
// but not read (double-write modes): the CiliumIdentity object, or etcd's
// master key (the reconciler then writes this node's value key). The
// number taken by other labels there is ErrIdentityConflict.
func (a *allocator) writeOther(ctx context.Context, id identity.NumericIdentity, lbls labels.Labels, key string) error {
	if !a.opts.ReadKV {
		won, cur, err := a.kv.createOnly(ctx, id, key)
		if err != nil {
			return err
		}
		if !won && cur != key {
			return fmt.Errorf("double-write: kvstore identity %d has labels %q, want %q: %w", id, cur, key, ErrIdentityConflict)
		}
		return nil
	}
	if a.client == nil {
		return errNoClient
	}
	for range 2 { // a number deleted between Create and Get is tried once more
		res, _, err := a.tryCreate(ctx, id, lbls, key)
		if err != nil {
			return fmt.Errorf("double-write: %w", err)
		}
		switch res {
		case createdIt, existsSame:
			return nil
		case existsOther:
			return fmt.Errorf("double-write: CiliumIdentity %s has other labels than %s: %w", id.StringID(), lbls, ErrIdentityConflict)
		}
	}
	return fmt.Errorf("double-write: CiliumIdentity %s deleted while being created; retry", id.StringID())
}

// resolveRead is resolve in the backend that is read.
func (a *allocator) resolveRead(ctx context.Context, lbls labels.Labels, key string) (identity.NumericIdentity, error) {
	if a.kv != nil && (!a.opts.DoubleWrite || a.opts.ReadKV) {
		// Known from the mirror of etcd: the reconciler writes this
		// node's value key. Else etcd decides, under its lock.
		if e, ok := a.idx.preferred(a.db.ReadTxn(), key, a.inRange); ok {
			return e.id, nil
		}
		return a.kv.resolve(ctx, lbls, key)
	}
	if a.client == nil {
		return 0, errNoClient
	}
	if err := a.waitListed(ctx); err != nil {
		return 0, err
	}
	if e, ok := a.idx.preferred(a.db.ReadTxn(), key, a.inRange); ok {
		return e.id, nil
	}
	return a.create(ctx, lbls, key)
}

// waitListed waits until the CiliumIdentity table holds the API's
// identities, so that an existing identity is never missed.
func (a *allocator) waitListed(ctx context.Context) error {
	if err := tables.WaitInitialized(ctx, a.db, a.cids); err != nil {
		return fmt.Errorf("CiliumIdentities not listed (is the API server reachable and the CiliumIdentity CRD registered?): %w", err)
	}
	return nil
}

func (a *allocator) inRange(id identity.NumericIdentity) bool {
	return id >= a.opts.Min && id <= a.opts.Max
}

// create makes a CiliumIdentity for lbls and returns its number.
//
// Numbers are probed linearly from a start derived from the labels (Cilium
// starts at a random number). Agents racing on the same new labels thus
// try the same names in the same order: the first Create wins and the
// others get AlreadyExists with equal labels and use it. A number whose
// object has other labels is skipped, whether the index knows it or
// Create reports it.
func (a *allocator) create(ctx context.Context, lbls labels.Labels, key string) (identity.NumericIdentity, error) {
	span := uint64(a.opts.Max-a.opts.Min) + 1
	start := probeStart(key, span)
	for i := uint64(0); i < span; i++ {
		n := a.opts.Min + identity.NumericIdentity((start+i)%span)
		if e, ok := a.idx.get(a.db.ReadTxn(), n); ok {
			if e.key == key {
				return n, nil // created meanwhile by another agent
			}
			continue
		}
		// A number deleted between our Create and Get is tried once more,
		// as racing agents would.
		for attempt := 0; attempt < 2; attempt++ {
			if err := ctx.Err(); err != nil {
				return 0, fmt.Errorf("find a free identity: %w", err)
			}
			res, created, err := a.tryCreate(ctx, n, lbls, key)
			switch {
			case err != nil:
				return 0, err
			case res == createdIt:
				return a.converge(ctx, created, key)
			case res == existsSame:
				return n, nil
			case res == goneMeanwhile:
				continue
			}
			break // existsOther: next number
		}
	}
	return 0, fmt.Errorf("%w (%d..%d); the operator's identity GC frees unused ones", ErrNoFreeIdentity, a.opts.Min, a.opts.Max)
}

type createResult int

const (
	createdIt     createResult = iota // this call created the object
	existsSame                        // the number exists with the same labels
	existsOther                       // the number exists with other labels
	goneMeanwhile                     // Create said it exists, Get said it does not
)

// tryCreate tries to create identity n for lbls.
func (a *allocator) tryCreate(ctx context.Context, n identity.NumericIdentity, lbls labels.Labels, key string) (createResult, *ciliumv2.CiliumIdentity, error) {
	created, err := a.client.Create(ctx, newCiliumIdentity(n, lbls), metav1.CreateOptions{})
	if err == nil {
		return createdIt, created, nil
	}
	if !apierrors.IsAlreadyExists(err) {
		return 0, nil, fmt.Errorf("create CiliumIdentity %s: %w", n.StringID(), err)
	}
	cur, err := a.client.Get(ctx, n.StringID(), metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return goneMeanwhile, nil, nil
	case err != nil:
		return 0, nil, fmt.Errorf("get CiliumIdentity %s: %w", n.StringID(), err)
	case labelsKey(cur) == key:
		return existsSame, nil, nil
	}
	return existsOther, nil, nil
}

// probeStart is the offset of the first number create tries for the label
// set key. It must be the same on every agent.
func probeStart(key string, span uint64) uint64 {
	h := fnv.New64a()
	h.Write([]byte(key))
	return h.Sum64() % span
}

// converge runs after this agent created an identity: if another agent
// created one with the same labels under another number (their probes can
// differ when an identity on the way was deleted concurrently), all agents
// must settle on one.
//
// The rule is "the identity created first wins" (see earlier). Once the
// agent sees its own object in its watch, it has seen every object created
// before it, since the watch delivers changes in the order the API server
// stored them. So the first-created identity is visible to every agent that
// created a duplicate after it, and they all pick it; its creator sees
// nothing older and keeps it. The loser deletes its own object, which
// nobody on its node has used yet.
func (a *allocator) converge(ctx context.Context, created *ciliumv2.CiliumIdentity, key string) (identity.NumericIdentity, error) {
	id, err := identity.ParseNumericIdentity(created.Name)
	if err != nil {
		return 0, err
	}
	waitCtx, cancel := context.WithTimeout(ctx, convergeWait)
	defer cancel()
	txn, ok := a.waitVisible(waitCtx, created)
	if !ok {
		a.log.Warn("Created CiliumIdentity not seen in the watch yet; not checking for duplicates", "identity", id)
		return id, nil
	}
	best, ok := a.idx.preferred(txn, key, a.inRange)
	if !ok || best.id == id {
		return id, nil
	}
	a.log.Info("Another agent created the same identity first; using it", "identity", best.id, "duplicate", id)
	opts := metav1.DeleteOptions{}
	if created.UID != "" {
		opts.Preconditions = &metav1.Preconditions{UID: &created.UID}
	}
	if err := a.client.Delete(ctx, created.Name, opts); err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		a.log.Warn("Could not delete duplicate CiliumIdentity; the operator's GC will", "identity", id, "error", err)
	}
	return best.id, nil
}

// waitVisible waits until the table holds the created object and returns
// the snapshot that does.
func (a *allocator) waitVisible(ctx context.Context, created *ciliumv2.CiliumIdentity) (statedb.ReadTxn, bool) {
	q := k8stables.NameIndex[*ciliumv2.CiliumIdentity]().Query(created.Name)
	for {
		txn := a.db.ReadTxn()
		obj, _, watch, found := a.cids.GetWatch(txn, q)
		if found && (created.UID == "" || obj.UID == created.UID) {
			return txn, true
		}
		select {
		case <-ctx.Done():
			return nil, false
		case <-watch:
		}
	}
}

// addRefByKey takes a reference to the identity this agent already uses
// for the labels key.
func (a *allocator) addRefByKey(key string) (identity.NumericIdentity, bool) {
	txn := a.db.WriteTxn(a.allocs)
	defer txn.Abort()
	row, _, ok := a.allocs.Get(txn, identity.AllocationLabelsIndex.Query(key))
	if !ok {
		return 0, false
	}
	if _, _, err := a.allocs.Insert(txn, row.With(row.Refs+1, row.Status)); err != nil {
		return 0, false
	}
	txn.Commit()
	return row.ID, true
}

// addRef takes a reference to id. The first one makes the reconciler
// check the object (and remove a heartbeat mark).
func (a *allocator) addRef(id identity.NumericIdentity, lbls labels.Labels) error {
	txn := a.db.WriteTxn(a.allocs)
	defer txn.Abort()
	row, _, ok := a.allocs.Get(txn, identity.AllocationIDIndex.Query(id))
	switch {
	case !ok:
		row = &identity.Allocation{ID: id, Labels: lbls, Refs: 1, Status: reconciler.Pending()}
	case !row.Labels.Equal(lbls):
		return fmt.Errorf("identity %d is in use here with labels %v: %w", id, row.Labels, ErrIdentityConflict)
	default:
		row = row.With(row.Refs+1, row.Status)
	}
	if _, _, err := a.allocs.Insert(txn, row); err != nil {
		return fmt.Errorf("record identity %d: %w", id, err)
	}
	txn.Commit()
	return nil
}

// Release implements Allocator.
func (a *allocator) Release(_ context.Context, id identity.NumericIdentity) error {
	if id.IsReserved() {
		return nil
	}
	txn := a.db.WriteTxn(a.allocs)
	defer txn.Abort()
	row, _, ok := a.allocs.Get(txn, identity.AllocationIDIndex.Query(id))
	if !ok {
		return fmt.Errorf("release identity %d: %w", id, ErrNotAllocated)
	}
	var err error
	if row.Refs <= 1 {
		_, _, err = a.allocs.Delete(txn, row)
	} else {
		_, _, err = a.allocs.Insert(txn, row.With(row.Refs-1, row.Status))
	}
	if err != nil {
		return fmt.Errorf("release identity %d: %w", id, err)
	}
	txn.Commit()
	return nil
}

// lookup finds an identity by number (GET /v1/identity/{id}): reserved
// identities, those this agent uses and every CiliumIdentity of the
// cluster.
func (a *allocator) lookup(id identity.NumericIdentity) (Identity, bool) {
	if r, ok := identity.LookupReserved(id); ok {
		return Identity{ID: id, Labels: r.Labels}, true
	}
	txn := a.db.ReadTxn()
	if row, _, ok := a.allocs.Get(txn, identity.AllocationIDIndex.Query(id)); ok {
		return Identity{ID: id, Labels: row.Labels}, true
	}
	if e, ok := a.idx.get(txn, id); ok {
		return Identity{ID: id, Labels: e.labels}, true
	}
	return Identity{}, false
}

// list returns every identity Lookup knows, sorted by number.
func (a *allocator) list() []Identity {
	m := map[identity.NumericIdentity]Identity{}
	for _, r := range identity.AllReserved() {
		m[r.ID] = Identity{ID: r.ID, Labels: r.Labels}
	}
	txn := a.db.ReadTxn()
	for _, e := range a.idx.all(txn) {
		m[e.id] = Identity{ID: e.id, Labels: e.labels}
	}
	for row := range a.allocs.All(txn) {
		if _, ok := m[row.ID]; !ok {
			m[row.ID] = Identity{ID: row.ID, Labels: row.Labels}
		}
	}
	return slices.SortedFunc(maps.Values(m), func(x, y Identity) int { return cmp.Compare(x.ID, y.ID) })
}

// onIdentityChange marks an allocation pending when its CiliumIdentity
// was deleted, marked for deletion by the operator, or replaced with other
// labels, so that the reconciler repairs it.
func (a *allocator) onIdentityChange(_ context.Context, change statedb.Change[*ciliumv2.CiliumIdentity]) error {
	id, err := identity.ParseNumericIdentity(change.Object.Name)
	if err != nil {
		return nil
	}
	row, _, ok := a.allocs.Get(a.db.ReadTxn(), identity.AllocationIDIndex.Query(id))
	if !ok {
		return nil
	}
	if !change.Deleted && !marked(change.Object) && labelsKey(change.Object) == row.Labels.SortedList() {
		return nil
	}
	txn := a.db.WriteTxn(a.allocs)
	defer txn.Abort()
	row, _, ok = a.allocs.Get(txn, identity.AllocationIDIndex.Query(id))
	if !ok {
		return nil
	}
	// Always a new revision, even if already pending: a reconciliation in
	// flight may have read the table before this change.
	if _, _, err := a.allocs.Insert(txn, row.With(row.Refs, reconciler.Pending())); err != nil {
		return fmt.Errorf("mark identity %d for repair: %w", id, err)
	}
	txn.Commit()
	return nil
}

// keyLocks serializes allocations of the same labels within this agent,
// so that it creates at most one identity per label set and counts
// references exactly. Different label sets proceed in parallel.
type keyLocks struct {
	mu sync.Mutex
	m  map[string]*keyLock
}

type keyLock struct {
	ch      chan struct{} // holds a token while locked
	waiters int
}

// lock waits (bounded by ctx) for the lock of key and returns its unlock.
func (l *keyLocks) lock(ctx context.Context, key string) (func(), error) {
	l.mu.Lock()
	if l.m == nil {
		l.m = map[string]*keyLock{}
	}
	k := l.m[key]
	if k == nil {
		k = &keyLock{ch: make(chan struct{}, 1)}
		l.m[key] = k
	}
	k.waiters++
	l.mu.Unlock()
	release := func() {
		l.mu.Lock()
		if k.waiters--; k.waiters == 0 {
			delete(l.m, key)
		}
		l.mu.Unlock()
	}
	select {
	case k.ch <- struct{}{}:
		return func() { <-k.ch; release() }, nil
	case <-ctx.Done():
		release()
		return nil, fmt.Errorf("wait for a concurrent allocation of the same labels: %w", ctx.Err())
	}
}
