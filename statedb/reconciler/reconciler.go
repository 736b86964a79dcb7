package reconciler

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"reflect"
	"strings"
	"time"

	"github.com/cilium/statedb"
)

// Reconciler reconciles one table into one target. Create it with New,
// call Subscribe before the objects it must see are written (a start hook),
// then Run in a goroutine.
type Reconciler[Obj any] struct {
	cfg     Config[Obj]
	db      *statedb.DB
	changes statedb.ChangeIterator[Obj]
	batch   BatchOperations[Obj]
	pruner  RoundPruner[Obj]

	retries   map[string]*retryItem[Obj]
	lastErr   error
	fullAfter time.Time // earliest next full reconciliation after a failure
	fullFails int
	// pass is what is left of the full reconciliation under way: the
	// objects of the table when it began, updated a round at a time
	// between incremental rounds (so that a change waits for one round of
	// it, not all of it); nil when none is under way.
	pass []Obj
	// pruning is set while a RoundPruner's prune is under way (after the
	// pass); pruneTime is the time its rounds took so far, and
	// pruneDeletes the failed deletions retried when it began: only
	// those can the prune have done.
	pruning      bool
	pruneTime    time.Duration
	pruneDeletes map[string]pruneDelete[Obj]
}

// pruneDelete is a failed deletion retried when a prune began, and its
// attempts then.
type pruneDelete[Obj any] struct {
	item     *retryItem[Obj]
	attempts int
}

type retryItem[Obj any] struct {
	obj      Obj
	delete   bool
	attempts int
	at       time.Time
	err      error
}

// New validates cfg and creates a reconciler. It starts nothing.
func New[Obj any](db *statedb.DB, cfg Config[Obj]) (*Reconciler[Obj], error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	r := &Reconciler[Obj]{cfg: cfg, db: db, retries: map[string]*retryItem[Obj]{}}
	r.batch, _ = cfg.Operations.(BatchOperations[Obj])
	r.pruner, _ = cfg.Operations.(RoundPruner[Obj])
	return r, nil
}

// Describe names what r reconciles for introspection, "table → target":
// the target is its Operations' String() when it has one, its Go type
// otherwise.
func (r *Reconciler[Obj]) Describe() string {
	table := "?"
	if r.cfg.Table != nil {
		table = r.cfg.Table.Name()
	}
	var target string
	if s, ok := r.cfg.Operations.(fmt.Stringer); ok {
		target = s.String()
	} else {
		target = strings.TrimPrefix(reflect.TypeOf(r.cfg.Operations).String(), "*")
	}
	return table + " → " + target
}

// Subscribe starts following the table's changes; every object in the
// table now or later will be seen by Run.
func (r *Reconciler[Obj]) Subscribe() error {
	wtxn := r.db.WriteTxn(r.cfg.Table)
	changes, err := r.cfg.Table.Changes(wtxn)
	wtxn.Commit()
	if err != nil {
		return fmt.Errorf("reconciler %s: subscribe to %s: %w", r.cfg.Name, r.cfg.Table.Name(), err)
	}
	r.changes = changes
	return nil
}

// Run reconciles until ctx is cancelled. The first full reconciliation
// (with pruning) waits until the table is initialized, so that nothing is
// pruned before the writers have filled the table.
func (r *Reconciler[Obj]) Run(ctx context.Context, health Health) {
	if r.changes == nil {
		if err := r.Subscribe(); err != nil {
			health.Degraded("subscribe", err)
			return
		}
	}
	defer r.changes.Close()

	var fullTick <-chan time.Time
	if r.cfg.FullInterval > 0 {
		t := time.NewTicker(r.cfg.FullInterval)
		defer t.Stop()
		fullTick = t.C
	}
	initialized, initWatch := r.cfg.Table.Initialized(r.db.ReadTxn())
	needFull := true
	retryTimer := time.NewTimer(time.Hour)
	defer retryTimer.Stop()
	var wake <-chan struct{}
	if r.cfg.Wake != nil {
		wake = r.cfg.Wake(r.db.ReadTxn())
	}

	for {
		watch := r.incremental(ctx)
		if ctx.Err() != nil {
			return
		}
		if initialized && needFull && !time.Now().Before(r.fullAfter) {
			if r.full(ctx) {
				needFull = !r.fullAfter.IsZero() // a failed prune is retried after a backoff
			}
		}
		r.retry(ctx)
		r.report(health)

		if r.pass != nil || r.pruning {
			// The full pass goes on after the changes that came meanwhile.
			closed := make(chan struct{})
			close(closed)
			watch = closed
		}
		wait := time.Hour
		if next, ok := r.nextRetry(); ok {
			wait = time.Until(next)
		}
		if needFull && initialized && !r.fullAfter.IsZero() {
			wait = min(wait, time.Until(r.fullAfter))
		}
		retryTimer.Reset(max(wait, 0))
		select {
		case <-ctx.Done():
			return
		case <-watch:
		case <-retryTimer.C:
		case <-fullTick:
			needFull = true
		case <-initWatch:
			initialized, initWatch = true, nil
		case <-wake:
			wake = r.cfg.Wake(r.db.ReadTxn())
			now := time.Now()
			for _, item := range r.retries {
				if !item.delete && r.cfg.Waits(item.err) {
					item.at = now
				}
			}
		}
	}
}

type statusUpdate[Obj any] struct {
	obj    Obj
	rev    statedb.Revision
	status Status
}

// incremental processes up to RoundLimit changes and writes their status.
// It returns the channel that closes when more changes are available.
func (r *Reconciler[Obj]) incremental(ctx context.Context) <-chan struct{} {
	txn := r.db.ReadTxn()
	changes, watch := r.changes.Next(txn)
	var (
		updates []statusUpdate[Obj]
		upsert  []BatchEntry[Obj]
		upRevs  []statedb.Revision
		dels    []BatchEntry[Obj]
		n       int
	)
	for change := range changes {
		rev := change.Revision
		key := r.key(change.Object)
		pendingDelete := r.cfg.GetStatus(change.Object).Kind == StatusPendingDelete
		if change.Deleted && !pendingDelete {
			delete(r.retries, key)
			dels = append(dels, BatchEntry[Obj]{Object: change.Object})
		} else if change.Deleted || pendingDelete {
			// The reconciler's own pending-delete rows, written or removed:
			// the retry of the deletion goes on (or is done).
		} else if r.cfg.GetStatus(change.Object).Kind == StatusPending {
			upsert = append(upsert, BatchEntry[Obj]{Object: change.Object})
			upRevs = append(upRevs, rev)
		}
		if n++; n >= r.cfg.RoundLimit {
			break
		}
	}
	r.apply(ctx, txn, upsert, false)
	r.apply(ctx, txn, dels, true)
	for i, e := range upsert {
		key := r.key(e.Object)
		if e.Result != nil {
			r.scheduleRetry(key, e.Object, false, e.Result)
			updates = append(updates, statusUpdate[Obj]{e.Object, upRevs[i], Failed(e.Result)})
		} else {
			delete(r.retries, key)
			updates = append(updates, statusUpdate[Obj]{e.Object, upRevs[i], Done()})
		}
	}
	var failedDels []BatchEntry[Obj]
	for _, e := range dels {
		if e.Result != nil {
			r.scheduleRetry(r.key(e.Object), e.Object, true, e.Result)
			failedDels = append(failedDels, e)
		}
	}
	r.writeStatuses(updates)
	r.writePendingDeletes(failedDels, nil)
	if n >= r.cfg.RoundLimit {
		// More may be waiting: come back immediately.
		closed := make(chan struct{})
		close(closed)
		return closed
	}
	return watch
}

// apply runs Update (or Delete) on every entry, in one batch call when the
// target supports it, and records the outcome in each entry.
func (r *Reconciler[Obj]) apply(ctx context.Context, txn statedb.ReadTxn, entries []BatchEntry[Obj], del bool) {
	if len(entries) == 0 {
		return
	}
	op := "update"
	if del {
		op = "delete"
	}
	if r.batch != nil {
		t0 := time.Now()
		if del {
			r.batch.DeleteBatch(ctx, txn, entries)
		} else {
			r.batch.UpdateBatch(ctx, txn, entries)
		}
		var errs []error
		for _, e := range entries {
			errs = append(errs, e.Result)
		}
		r.observe(op+"-batch", time.Since(t0), errors.Join(errs...))
		return
	}
	for i := range entries {
		t0 := time.Now()
		if del {
			entries[i].Result = r.cfg.Operations.Delete(ctx, txn, entries[i].Object)
		} else {
			entries[i].Result = r.cfg.Operations.Update(ctx, txn, entries[i].Object)
		}
		r.observe(op, time.Since(t0), entries[i].Result)
	}
}

// fullRoundBudget bounds the time of one round of a full reconciliation,
// so that a change waits at most about that long for it.
const fullRoundBudget = 10 * time.Millisecond

// full reconciles every object again and then prunes the target, one
// round of at most RoundLimit objects or fullRoundBudget per call (each
// object at its current version); a RoundPruner prunes in rounds of
// fullRoundBudget too. It reports whether the pass is over.
func (r *Reconciler[Obj]) full(ctx context.Context) bool {
	txn := r.db.ReadTxn()
	if r.pruning {
		return r.pruneRound(ctx, txn)
	}
	if r.pass == nil {
		r.pass = []Obj{}
		for obj := range r.cfg.Table.All(txn) {
			r.pass = append(r.pass, obj)
		}
	}
	var updates []statusUpdate[Obj]
	began := time.Now()
	for i := 0; len(r.pass) > 0 && i < r.cfg.RoundLimit && time.Since(began) < fullRoundBudget; i++ {
		snap := r.pass[0]
		r.pass = r.pass[1:]
		obj, rev, found := r.current(txn, snap)
		if !found || r.cfg.GetStatus(obj).Kind == StatusPendingDelete {
			continue // deleted since, or not desired: its deletion is retried
		}
		t0 := time.Now()
		err := r.cfg.Operations.Update(ctx, txn, obj)
		r.observe("update", time.Since(t0), err)
		old := r.cfg.GetStatus(obj)
		key := r.key(obj)
		if err != nil {
			r.scheduleRetry(key, obj, false, err)
			updates = append(updates, statusUpdate[Obj]{obj, rev, Failed(err)})
			continue
		}
		delete(r.retries, key)
		if old.Kind != StatusDone {
			updates = append(updates, statusUpdate[Obj]{obj, rev, Done()})
		}
	}
	r.writeStatuses(updates)
	if len(r.pass) > 0 {
		return false
	}
	r.pass = nil
	r.pruning, r.pruneTime = true, 0
	r.pruneDeletes = map[string]pruneDelete[Obj]{}
	for key, item := range r.retries {
		if item.delete {
			r.pruneDeletes[key] = pruneDelete[Obj]{item, item.attempts}
		}
	}
	if r.pruner != nil {
		// The first round (the listing) after the changes that came
		// during the pass's last round.
		return false
	}
	return r.pruneRound(ctx, txn)
}

// pruneRound runs Prune, or a round of a RoundPruner's prune, and when
// the prune is over ends the full reconciliation; it reports whether it
// is over.
func (r *Reconciler[Obj]) pruneRound(ctx context.Context, txn statedb.ReadTxn) bool {
	t0 := time.Now()
	done, err := true, error(nil)
	if r.pruner != nil {
		done, err = r.pruner.PruneRound(ctx, txn, r.desired(txn), fullRoundBudget)
		r.observe("prune-round", time.Since(t0), err)
	} else {
		err = r.cfg.Operations.Prune(ctx, txn, r.desired(txn))
	}
	r.pruneTime += time.Since(t0)
	if err == nil && !done {
		return false
	}
	r.observe("prune", r.pruneTime, err)
	r.pruning = false
	deletes := r.pruneDeletes
	r.pruneDeletes = nil
	if err != nil {
		r.lastErr = fmt.Errorf("prune: %w", err)
		r.fullFails++
		r.fullAfter = time.Now().Add(r.backoff(r.fullFails))
		return true
	}
	r.fullFails, r.fullAfter = 0, time.Time{}
	var pruned []BatchEntry[Obj]
	for key, d := range deletes {
		// Pruning removed it, unless it was tried again while a
		// RoundPruner's prune went on (that target leaves alone what
		// changed since its listing).
		if r.retries[key] == d.item && d.item.attempts == d.attempts {
			delete(r.retries, key)
			pruned = append(pruned, BatchEntry[Obj]{Object: d.item.obj})
		}
	}
	r.writePendingDeletes(nil, pruned)
	return true
}

// retry re-runs operations whose backoff has expired, against the
// current version of each object.
func (r *Reconciler[Obj]) retry(ctx context.Context) {
	now := time.Now()
	txn := r.db.ReadTxn()
	var updates []statusUpdate[Obj]
	var failedDels, deleted []BatchEntry[Obj]
	for key, item := range r.retries {
		if item.at.After(now) {
			continue
		}
		cur, rev, found := r.current(txn, item.obj)
		if item.delete {
			if found && r.cfg.GetStatus(cur).Kind != StatusPendingDelete {
				delete(r.retries, key) // desired again; the insert is reconciled
				continue
			}
			t0 := time.Now()
			err := r.cfg.Operations.Delete(ctx, txn, item.obj)
			r.observe("delete", time.Since(t0), err)
			if err != nil {
				r.scheduleRetry(key, item.obj, true, err)
				failedDels = append(failedDels, BatchEntry[Obj]{Object: item.obj, Result: err})
			} else {
				delete(r.retries, key)
				deleted = append(deleted, BatchEntry[Obj]{Object: item.obj})
			}
			continue
		}
		if !found || r.cfg.GetStatus(cur).Kind == StatusDone {
			delete(r.retries, key)
			continue
		}
		t0 := time.Now()
		err := r.cfg.Operations.Update(ctx, txn, cur)
		r.observe("update", time.Since(t0), err)
		if err != nil {
			r.scheduleRetry(key, cur, false, err)
			updates = append(updates, statusUpdate[Obj]{cur, rev, Failed(err)})
		} else {
			delete(r.retries, key)
			updates = append(updates, statusUpdate[Obj]{cur, rev, Done()})
		}
	}
	r.writeStatuses(updates)
	r.writePendingDeletes(failedDels, deleted)
}

// desired is every object of the table except the pending-delete rows.
func (r *Reconciler[Obj]) desired(txn statedb.ReadTxn) iter.Seq2[Obj, statedb.Revision] {
	return func(yield func(Obj, statedb.Revision) bool) {
		for obj, rev := range r.cfg.Table.All(txn) {
			if r.cfg.GetStatus(obj).Kind == StatusPendingDelete {
				continue
			}
			if !yield(obj, rev) {
				return
			}
		}
	}
}

// writePendingDeletes makes failed deletions visible: each object of
// failed goes back into the table with status PendingDelete and its error,
// unless a writer inserted the key again (then it is desired: the retry
// stops). The pending-delete rows of the objects in done (deleted at
// last) are removed.
func (r *Reconciler[Obj]) writePendingDeletes(failed, done []BatchEntry[Obj]) {
	if len(failed) == 0 && len(done) == 0 {
		return
	}
	wtxn := r.db.WriteTxn(r.cfg.Table)
	defer wtxn.Abort()
	for _, e := range failed {
		cur, _, found := r.current(wtxn, e.Object)
		if found && r.cfg.GetStatus(cur).Kind != StatusPendingDelete {
			delete(r.retries, r.key(e.Object))
			continue
		}
		if _, _, err := r.cfg.Table.Insert(wtxn, r.cfg.SetStatus(e.Object, PendingDelete(e.Result))); err != nil {
			r.lastErr = fmt.Errorf("write pending delete: %w", err)
		}
	}
	for _, e := range done {
		cur, rev, found := r.current(wtxn, e.Object)
		if !found || r.cfg.GetStatus(cur).Kind != StatusPendingDelete {
			continue
		}
		if _, _, err := r.cfg.Table.CompareAndDelete(wtxn, rev, cur); err != nil && !errors.Is(err, statedb.ErrRevisionNotEqual) {
			r.lastErr = fmt.Errorf("remove pending delete: %w", err)
		}
	}
	wtxn.Commit()
}

func (r *Reconciler[Obj]) current(txn statedb.ReadTxn, obj Obj) (Obj, statedb.Revision, bool) {
	q, ok := r.cfg.Table.PrimaryIndexer().QueryFromObject(obj)
	if !ok {
		var zero Obj
		return zero, 0, false
	}
	return r.cfg.Table.Get(txn, q)
}

// writeStatuses stores outcomes, skipping objects changed since they were
// read: their new version is pending and will be reconciled.
func (r *Reconciler[Obj]) writeStatuses(updates []statusUpdate[Obj]) {
	if len(updates) == 0 {
		return
	}
	wtxn := r.db.WriteTxn(r.cfg.Table)
	defer wtxn.Abort()
	for _, u := range updates {
		_, _, err := r.cfg.Table.CompareAndSwap(wtxn, u.rev, r.cfg.SetStatus(u.obj, u.status))
		if err != nil && !errors.Is(err, statedb.ErrRevisionNotEqual) && !errors.Is(err, statedb.ErrObjectNotFound) {
			r.lastErr = fmt.Errorf("write status: %w", err)
		}
	}
	wtxn.Commit()
}

func (r *Reconciler[Obj]) scheduleRetry(key string, obj Obj, del bool, err error) {
	item, ok := r.retries[key]
	if !ok || item.delete != del {
		item = &retryItem[Obj]{delete: del}
		r.retries[key] = item
	}
	item.obj, item.err = obj, err
	item.attempts++
	item.at = time.Now().Add(r.backoff(item.attempts))
	r.lastErr = err
}

// backoff is RetryMin doubled per failed attempt, capped at RetryMax.
func (r *Reconciler[Obj]) backoff(attempts int) time.Duration {
	d := r.cfg.RetryMin
	for i := 1; i < attempts && d < r.cfg.RetryMax; i++ {
		d *= 2
	}
	return min(d, r.cfg.RetryMax)
}

func (r *Reconciler[Obj]) nextRetry() (time.Time, bool) {
	var next time.Time
	for _, item := range r.retries {
		if next.IsZero() || item.at.Before(next) {
			next = item.at
		}
	}
	return next, !next.IsZero()
}

func (r *Reconciler[Obj]) report(h Health) {
	if r.cfg.Metrics != nil {
		r.cfg.Metrics.Errors(r.cfg.Name, len(r.retries))
	}
	if len(r.retries) == 0 && r.fullAfter.IsZero() {
		r.lastErr = nil
		h.OK("reconciled")
		return
	}
	h.Degraded(fmt.Sprintf("%d objects failing, retrying", len(r.retries)), r.lastErr)
}

func (r *Reconciler[Obj]) observe(op string, d time.Duration, err error) {
	if r.cfg.Metrics != nil {
		r.cfg.Metrics.Operation(r.cfg.Name, op, d, err)
	}
}

func (r *Reconciler[Obj]) key(obj Obj) string {
	k, _ := r.cfg.Table.PrimaryIndexer().ObjectToKey(obj)
	return string(k)
}
