package reconciler_test

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cilium/statedb"
	"github.com/cilium/statedb/index"
	"go.uber.org/goleak"

	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/cells/hive/hivetest"
	"github.com/cellium/cellium/statedb/reconciler"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// route is a desired object: a name and a value to program.
type route struct {
	Name   string
	Value  int
	Status reconciler.Status
}

func (r *route) TableHeader() []string { return []string{"Name", "Value", "Status"} }
func (r *route) TableRow() []string {
	return []string{r.Name, fmt.Sprint(r.Value), r.Status.String()}
}

var routeName = statedb.Index[*route, string]{
	Name:       "name",
	FromObject: func(r *route) index.KeySet { return index.NewKeySet(index.String(r.Name)) },
	FromKey:    index.String,
	Unique:     true,
}

// fakeTarget is a target with fault injection: failures[name] makes the
// next n updates of name fail.
type fakeTarget struct {
	mu       sync.Mutex
	state    map[string]int
	failures map[string]int
	updates  map[string]int
	pruned   []string
	// pruneFailures makes the next n prunes fail.
	pruneFailures int
	// stuck names cannot be deleted (by Delete or Prune) until cleared.
	stuck   map[string]bool
	deletes map[string]int
}

func newFakeTarget() *fakeTarget {
	return &fakeTarget{state: map[string]int{}, failures: map[string]int{}, updates: map[string]int{},
		stuck: map[string]bool{}, deletes: map[string]int{}}
}

func (f *fakeTarget) Update(_ context.Context, _ statedb.ReadTxn, r *route) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.updates[r.Name]++
	if f.failures[r.Name] > 0 {
		f.failures[r.Name]--
		return fmt.Errorf("injected failure for %s", r.Name)
	}
	f.state[r.Name] = r.Value
	return nil
}

func (f *fakeTarget) Delete(_ context.Context, _ statedb.ReadTxn, r *route) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.deletes[r.Name]++
	if f.stuck[r.Name] {
		return fmt.Errorf("injected delete failure for %s", r.Name)
	}
	delete(f.state, r.Name)
	return nil
}

func (f *fakeTarget) Prune(_ context.Context, _ statedb.ReadTxn, desired iter.Seq2[*route, statedb.Revision]) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.pruneFailures > 0 {
		f.pruneFailures--
		return fmt.Errorf("injected prune failure")
	}
	want := map[string]bool{}
	for r := range desired {
		want[r.Name] = true
	}
	for name := range f.state { // list first, then delete
		if !want[name] && f.stuck[name] {
			return fmt.Errorf("injected delete failure for %s", name)
		}
		if !want[name] {
			f.pruned = append(f.pruned, name)
			delete(f.state, name)
		}
	}
	return nil
}

func (f *fakeTarget) snapshot() map[string]int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return maps.Clone(f.state)
}

func (f *fakeTarget) set(name string, v int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.state[name] = v
}

// routesCell is a module that owns the routes table and runs a reconciler
// into the target the test provides.
var routesCell = hive.Module("routes", "Test routes",
	hive.Provide(func(db *statedb.DB) (statedb.RWTable[*route], error) {
		return statedb.NewTable(db, "routes", routeName)
	}),
	hive.Invoke(func(db *statedb.DB, tbl statedb.RWTable[*route], ops reconciler.Operations[*route], jobs hive.Jobs) error {
		r, err := reconciler.New(db, reconciler.Config[*route]{
			Name:         "routes",
			Table:        tbl,
			GetStatus:    func(r *route) reconciler.Status { return r.Status },
			SetStatus:    func(r *route, s reconciler.Status) *route { c := *r; c.Status = s; return &c },
			Operations:   ops,
			FullInterval: 50 * time.Millisecond,
			RetryMin:     time.Millisecond,
			RetryMax:     10 * time.Millisecond,
		})
		if err != nil {
			return err
		}
		jobs.Add(hive.Service("reconcile-routes", r.Subscribe, func(ctx context.Context, h hive.Health) { r.Run(ctx, h) }))
		return nil
	}),
)

func startRoutes(t *testing.T, target *fakeTarget) (*statedb.DB, statedb.RWTable[*route], hive.HealthReporter) {
	var (
		db     *statedb.DB
		tbl    statedb.RWTable[*route]
		health hive.HealthReporter
	)
	hivetest.Start(t, nil,
		hive.Provide(func() reconciler.Operations[*route] { return target }),
		routesCell,
		hivetest.Capture(&db), hivetest.Capture(&tbl), hivetest.Capture(&health),
	)
	return db, tbl, health
}

func insert(db *statedb.DB, tbl statedb.RWTable[*route], routes ...*route) {
	txn := db.WriteTxn(tbl)
	for _, r := range routes {
		r.Status = reconciler.Pending()
		tbl.Insert(txn, r)
	}
	txn.Commit()
}

func TestRetriesFailingOperation(t *testing.T) {
	target := newFakeTarget()
	target.failures["flaky"] = 3
	db, tbl, health := startRoutes(t, target)
	insert(db, tbl, &route{Name: "flaky", Value: 1}, &route{Name: "fine", Value: 2})

	sawError := false
	waitFor(t, "flaky reconciled after retries", func() bool {
		obj, _, ok := tbl.Get(db.ReadTxn(), routeName.Query("flaky"))
		if ok && obj.Status.Kind == reconciler.StatusError {
			sawError = true
		}
		return ok && obj.Status.Kind == reconciler.StatusDone && target.snapshot()["flaky"] == 1
	})
	target.mu.Lock()
	attempts := target.updates["flaky"]
	target.mu.Unlock()
	if attempts < 4 {
		t.Fatalf("flaky updated %d times, want at least 4 (3 failures + success)", attempts)
	}
	_ = sawError // the error status may be overwritten before we look; attempts prove the retries
	waitFor(t, "health ok", func() bool {
		for _, s := range health.Statuses() {
			if s.ID == "job-reconcile-routes" {
				return s.Level == hive.LevelOK
			}
		}
		return false
	})
}

func TestErrorStatusAndHealthWhileFailing(t *testing.T) {
	target := newFakeTarget()
	target.failures["broken"] = 1 << 30
	db, tbl, health := startRoutes(t, target)
	insert(db, tbl, &route{Name: "broken", Value: 1})
	waitFor(t, "error status written back", func() bool {
		obj, _, ok := tbl.Get(db.ReadTxn(), routeName.Query("broken"))
		return ok && obj.Status.Kind == reconciler.StatusError && obj.Status.Error == "injected failure for broken"
	})
	waitFor(t, "health degraded", func() bool {
		for _, s := range health.Statuses() {
			if s.ID == "job-reconcile-routes" && s.Level == hive.LevelDegraded {
				return true
			}
		}
		return false
	})
}

func TestFullReconciliationPrunesAndRepairs(t *testing.T) {
	target := newFakeTarget()
	target.set("stale", 99) // exists in the target, not desired
	db, tbl, _ := startRoutes(t, target)
	insert(db, tbl, &route{Name: "a", Value: 1})
	waitFor(t, "stale pruned", func() bool {
		s := target.snapshot()
		_, stale := s["stale"]
		return !stale && s["a"] == 1
	})
	if !slices.Contains(target.pruned, "stale") {
		t.Fatalf("stale not pruned: %v", target.pruned)
	}
	// Drift: someone changes the target behind our back; the periodic
	// full reconciliation puts it back.
	target.set("a", 42)
	waitFor(t, "drift repaired", func() bool { return target.snapshot()["a"] == 1 })
}

func TestDeleteRemovesFromTarget(t *testing.T) {
	target := newFakeTarget()
	db, tbl, _ := startRoutes(t, target)
	insert(db, tbl, &route{Name: "a", Value: 1}, &route{Name: "b", Value: 2})
	waitFor(t, "inserted", func() bool { return len(target.snapshot()) == 2 })
	txn := db.WriteTxn(tbl)
	tbl.Delete(txn, &route{Name: "a"})
	txn.Commit()
	waitFor(t, "a deleted", func() bool { _, ok := target.snapshot()["a"]; return !ok })
}

func TestPruneWaitsForInitialization(t *testing.T) {
	target := newFakeTarget()
	target.set("kept-until-init", 1)
	var (
		db   *statedb.DB
		tbl  statedb.RWTable[*route]
		done func(statedb.WriteTxn)
	)
	hivetest.Start(t, nil,
		hive.Provide(func() reconciler.Operations[*route] { return target }),
		routesCell,
		// A writer that has not finished its initial sync.
		hive.Invoke(func(d *statedb.DB, t statedb.RWTable[*route]) {
			db, tbl = d, t
			txn := d.WriteTxn(t)
			done = t.RegisterInitializer(txn, "test-writer")
			txn.Commit()
		}),
	)
	// The reconciler is running (it reconciles three later changes, one
	// after the other), yet prunes nothing before initialization.
	for i := range 3 {
		name := fmt.Sprintf("marker-%d", i)
		insert(db, tbl, &route{Name: name, Value: i})
		waitFor(t, name+" reconciled", func() bool {
			obj, _, ok := tbl.Get(db.ReadTxn(), routeName.Query(name))
			return ok && obj.Status.Kind == reconciler.StatusDone
		})
	}
	if _, ok := target.snapshot()["kept-until-init"]; !ok {
		t.Fatal("pruned before the table was initialized")
	}
	txn := db.WriteTxn(tbl)
	done(txn)
	txn.Commit()
	waitFor(t, "pruned after init", func() bool { _, ok := target.snapshot()["kept-until-init"]; return !ok })
}

func TestConfigValidation(t *testing.T) {
	_, err := reconciler.New(statedb.New(), reconciler.Config[*route]{Name: "x"})
	if err == nil || !errors.Is(err, err) || err.Error() != "reconciler x: Table is required" {
		t.Fatalf("unexpected error %v", err)
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for: %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// A failed prune is retried after a short backoff, not at the next full
// interval: with a 1h interval the stale object still goes quickly.
func TestFailedPruneIsRetried(t *testing.T) {
	target := newFakeTarget()
	target.set("stale", 1)
	target.pruneFailures = 2
	var (
		db  *statedb.DB
		tbl statedb.RWTable[*route]
	)
	hivetest.Start(t, nil,
		hive.Provide(func() reconciler.Operations[*route] { return target }),
		hive.Module("routes", "Test routes",
			hive.Provide(func(db *statedb.DB) (statedb.RWTable[*route], error) {
				return statedb.NewTable(db, "routes", routeName)
			}),
			hive.Invoke(func(d *statedb.DB, t statedb.RWTable[*route], ops reconciler.Operations[*route], jobs hive.Jobs) error {
				db, tbl = d, t
				r, err := reconciler.New(d, reconciler.Config[*route]{
					Name: "routes", Table: t, Operations: ops, FullInterval: time.Hour,
					GetStatus: func(r *route) reconciler.Status { return r.Status },
					SetStatus: func(r *route, s reconciler.Status) *route { c := *r; c.Status = s; return &c },
					RetryMin:  time.Millisecond, RetryMax: 10 * time.Millisecond,
				})
				if err != nil {
					return err
				}
				jobs.Add(hive.Service("reconcile", r.Subscribe, func(ctx context.Context, h hive.Health) { r.Run(ctx, h) }))
				return nil
			}),
		),
	)
	_ = db
	_ = tbl
	waitFor(t, "stale pruned after failed prunes", func() bool { _, ok := target.snapshot()["stale"]; return !ok })
}

// A failed deletion is visible in the table: the row comes back with
// status PendingDelete and the error, is neither updated nor counted as
// desired by pruning, and goes away once the deletion succeeds. Inserting
// the key again makes it desired again and stops the deletion.
func TestFailedDeleteIsPendingDeleteInTable(t *testing.T) {
	target := newFakeTarget()
	db, tbl, health := startRoutes(t, target)
	insert(db, tbl, &route{Name: "stuck", Value: 1}, &route{Name: "back", Value: 2})
	waitFor(t, "both programmed", func() bool {
		s := target.snapshot()
		return s["stuck"] == 1 && s["back"] == 2
	})
	target.mu.Lock()
	target.stuck["stuck"], target.stuck["back"] = true, true
	target.mu.Unlock()
	txn := db.WriteTxn(tbl)
	for _, name := range []string{"stuck", "back"} {
		obj, _, _ := tbl.Get(txn, routeName.Query(name))
		if _, _, err := tbl.Delete(txn, obj); err != nil {
			t.Fatal(err)
		}
	}
	txn.Commit()

	waitFor(t, "pending-delete rows with the error, health degraded", func() bool {
		for _, name := range []string{"stuck", "back"} {
			obj, _, ok := tbl.Get(db.ReadTxn(), routeName.Query(name))
			if !ok || obj.Status.Kind != reconciler.StatusPendingDelete || obj.Status.Error != "injected delete failure for "+name {
				return false
			}
		}
		for _, s := range health.Statuses() {
			if s.ID == "job-reconcile-routes" {
				return s.Level == hive.LevelDegraded
			}
		}
		return false
	})
	// Retries go on (more deletes), and no update ever ran on a
	// pending-delete row: the target still has the old values.
	target.mu.Lock()
	before := target.deletes["stuck"]
	updates := target.updates["stuck"]
	target.mu.Unlock()
	waitFor(t, "another delete attempt", func() bool {
		target.mu.Lock()
		defer target.mu.Unlock()
		return target.deletes["stuck"] > before
	})
	target.mu.Lock()
	if target.updates["stuck"] != updates {
		t.Errorf("a pending-delete row was updated in the target")
	}
	target.mu.Unlock()

	// "back" is wanted again: its insert wins over the pending delete.
	insert(db, tbl, &route{Name: "back", Value: 3})
	waitFor(t, "back desired again", func() bool {
		obj, _, ok := tbl.Get(db.ReadTxn(), routeName.Query("back"))
		return ok && obj.Status.Kind == reconciler.StatusDone && target.snapshot()["back"] == 3
	})
	// "stuck" can be deleted at last: its row goes.
	target.mu.Lock()
	delete(target.stuck, "stuck")
	target.mu.Unlock()
	waitFor(t, "stuck deleted from target and table", func() bool {
		_, _, ok := tbl.Get(db.ReadTxn(), routeName.Query("stuck"))
		_, inTarget := target.snapshot()["stuck"]
		return !ok && !inTarget
	})
	waitFor(t, "health ok", func() bool {
		for _, s := range health.Statuses() {
			if s.ID == "job-reconcile-routes" {
				return s.Level == hive.LevelOK
			}
		}
		return false
	})
	if obj, _, ok := tbl.Get(db.ReadTxn(), routeName.Query("back")); !ok || obj.Status.Kind != reconciler.StatusDone {
		t.Fatalf("back = %+v, %v after stuck was deleted", obj, ok)
	}
}

// loggingTarget logs the names it updates, in order, once logging is on;
// each logged update takes a little time, as a map write does, and onLog
// runs after each (outside the lock).
type loggingTarget struct {
	*fakeTarget
	logMu sync.Mutex
	on    bool
	log   []string
	onLog func(n int)
}

func (l *loggingTarget) Update(ctx context.Context, txn statedb.ReadTxn, r *route) error {
	l.logMu.Lock()
	on := l.on
	n := 0
	if on {
		l.log = append(l.log, r.Name)
		n = len(l.log)
	}
	l.logMu.Unlock()
	if on {
		time.Sleep(200 * time.Microsecond)
		l.onLog(n)
	}
	return l.fakeTarget.Update(ctx, txn, r)
}

// A change that comes while a full reconciliation is under way is applied
// after at most one round of it (RoundLimit objects), not after all of it:
// the full pass of a large table (10,000 Services' frontends) must not hold
// a Service change back for its whole length.
func TestChangeDuringFullPassWaitsOneRound(t *testing.T) {
	const objects, roundLimit = 300, 10
	db := statedb.New()
	tbl, err := statedb.NewTable(db, "routes", routeName)
	if err != nil {
		t.Fatal(err)
	}
	target := &loggingTarget{fakeTarget: newFakeTarget()}
	insertedAt := make(chan int, 1)
	target.onLog = func(n int) {
		if n == objects/10 { // a tenth into a full pass
			insert(db, tbl, &route{Name: "new", Value: 1})
			insertedAt <- n
		}
	}
	r, err := reconciler.New(db, reconciler.Config[*route]{
		Name:         "routes",
		Table:        tbl,
		GetStatus:    func(r *route) reconciler.Status { return r.Status },
		SetStatus:    func(r *route, s reconciler.Status) *route { c := *r; c.Status = s; return &c },
		Operations:   target,
		FullInterval: 100 * time.Millisecond,
		RoundLimit:   roundLimit,
	})
	if err != nil {
		t.Fatal(err)
	}
	var routes []*route
	for i := range objects {
		routes = append(routes, &route{Name: fmt.Sprintf("r%03d", i), Value: i})
	}
	insert(db, tbl, routes...)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); r.Run(ctx, nopHealth{}) }()
	defer func() { cancel(); <-done }()
	waitFor(t, "every route done", func() bool {
		n := 0
		for o := range tbl.All(db.ReadTxn()) {
			if o.Status.Kind == reconciler.StatusDone {
				n++
			}
		}
		return n == objects
	})
	// Only full passes update the routes from now on.
	target.logMu.Lock()
	target.on = true
	target.logMu.Unlock()
	at := <-insertedAt
	waitFor(t, "the new route applied", func() bool { return target.snapshot()["new"] == 1 })
	target.logMu.Lock()
	log := slices.Clone(target.log)
	target.logMu.Unlock()
	i := slices.Index(log, "new")
	if i < 0 {
		t.Fatal("the new route was not updated through the target")
	}
	if waited := i - at; waited > roundLimit {
		t.Errorf("the change waited for %d updates of the full pass, want at most one round (%d)", waited, roundLimit)
	}
}

// roundPruner is a target whose prune takes many rounds (each a little
// time, as a batch of a map listing does): the first lists the state, the
// last deletes what the then current desired does not have. Its Prune
// runs all the rounds in one go.
type roundPruner struct {
	*fakeTarget
	rounds int
	mu     sync.Mutex
	// round counts the rounds of the prune under way (0: none); log
	// records "update <name> <round>" and "prune-done".
	round   int
	listed  []string
	log     []string
	onRound func(round int)
}

func (p *roundPruner) Update(ctx context.Context, txn statedb.ReadTxn, r *route) error {
	p.mu.Lock()
	p.log = append(p.log, fmt.Sprintf("update %s %d", r.Name, p.round))
	p.mu.Unlock()
	return p.fakeTarget.Update(ctx, txn, r)
}

func (p *roundPruner) PruneRound(_ context.Context, _ statedb.ReadTxn, desired iter.Seq2[*route, statedb.Revision], _ time.Duration) (bool, error) {
	p.mu.Lock()
	p.round++
	round := p.round
	if round == 1 {
		p.listed = slices.Collect(maps.Keys(p.snapshot()))
	}
	p.mu.Unlock()
	time.Sleep(2 * time.Millisecond)
	if p.onRound != nil {
		p.onRound(round)
	}
	if round < p.rounds {
		return false, nil
	}
	want := map[string]bool{}
	for r := range desired {
		want[r.Name] = true
	}
	p.fakeTarget.mu.Lock()
	for _, name := range p.listed {
		if !want[name] {
			delete(p.fakeTarget.state, name)
			p.fakeTarget.pruned = append(p.fakeTarget.pruned, name)
		}
	}
	p.fakeTarget.mu.Unlock()
	p.mu.Lock()
	p.round = 0
	p.log = append(p.log, "prune-done")
	p.mu.Unlock()
	return true, nil
}

func (p *roundPruner) Prune(ctx context.Context, txn statedb.ReadTxn, desired iter.Seq2[*route, statedb.Revision]) error {
	for {
		done, err := p.PruneRound(ctx, txn, desired, time.Hour)
		if done || err != nil {
			return err
		}
	}
}

// A change that comes while a RoundPruner's prune is under way is applied
// between two of its rounds, not after the whole prune (the prune of the
// services map at 10,000 Services lists 110,000 entries), and the prune
// still removes the stray state and leaves the new object.
func TestChangeDuringPruneWaitsOneRound(t *testing.T) {
	const rounds = 50
	db := statedb.New()
	tbl, err := statedb.NewTable(db, "routes", routeName)
	if err != nil {
		t.Fatal(err)
	}
	target := &roundPruner{fakeTarget: newFakeTarget(), rounds: rounds}
	target.set("stray", 9)
	insertedAt := make(chan int, 1)
	var once sync.Once
	target.onRound = func(round int) {
		if round == 5 {
			once.Do(func() {
				insert(db, tbl, &route{Name: "new", Value: 1})
				insertedAt <- round
			})
		}
	}
	r, err := reconciler.New(db, reconciler.Config[*route]{
		Name:         "routes",
		Table:        tbl,
		GetStatus:    func(r *route) reconciler.Status { return r.Status },
		SetStatus:    func(r *route, s reconciler.Status) *route { c := *r; c.Status = s; return &c },
		Operations:   target,
		FullInterval: time.Hour, // the one at start
	})
	if err != nil {
		t.Fatal(err)
	}
	insert(db, tbl, &route{Name: "a", Value: 1})
	wtxn := db.WriteTxn(tbl)
	tbl.RegisterInitializer(wtxn, "test")(wtxn)
	wtxn.Commit()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); r.Run(ctx, nopHealth{}) }()
	defer func() { cancel(); <-done }()
	at := <-insertedAt
	waitFor(t, "the prune done", func() bool {
		target.mu.Lock()
		defer target.mu.Unlock()
		return slices.Contains(target.log, "prune-done")
	})
	target.mu.Lock()
	log := slices.Clone(target.log)
	target.mu.Unlock()
	applied := -1
	for _, l := range log {
		var round int
		if _, err := fmt.Sscanf(l, "update new %d", &round); err == nil {
			applied = round
			break
		}
		if l == "prune-done" {
			break
		}
	}
	if applied < 0 {
		t.Fatalf("the new route was applied after the prune's %d rounds, not between them: %v", rounds, log)
	}
	if applied-at > 1 {
		t.Errorf("the new route inserted in round %d was applied after round %d, want the next", at, applied)
	}
	if got := target.snapshot(); !maps.Equal(got, map[string]int{"a": 1, "new": 1}) {
		t.Errorf("target after the prune: %v, want a and new only", got)
	}
}

// errWaiting is what waitingTarget's Update returns until ready is set.
var errWaiting = errors.New("waiting for the other table")

// waitingTarget fails an Update with errWaiting until ready.
type waitingTarget struct {
	*fakeTarget
	ready atomic.Bool
}

func (w *waitingTarget) Update(ctx context.Context, txn statedb.ReadTxn, r *route) error {
	if !w.ready.Load() {
		return fmt.Errorf("route %s: %w", r.Name, errWaiting)
	}
	return w.fakeTarget.Update(ctx, txn, r)
}

// An object that waits for another table (a frontend for its backends) is
// retried as soon as that table changes (Wake), not after its backoff, which
// has grown meanwhile; other failures keep their backoff.
func TestWakeRetriesWaitingObject(t *testing.T) {
	db := statedb.New()
	tbl, err := statedb.NewTable(db, "routes", routeName)
	if err != nil {
		t.Fatal(err)
	}
	other, err := statedb.NewTable(db, "other", routeName)
	if err != nil {
		t.Fatal(err)
	}
	target := &waitingTarget{fakeTarget: newFakeTarget()}
	r, err := reconciler.New(db, reconciler.Config[*route]{
		Name:       "routes",
		Table:      tbl,
		GetStatus:  func(r *route) reconciler.Status { return r.Status },
		SetStatus:  func(r *route, s reconciler.Status) *route { c := *r; c.Status = s; return &c },
		Operations: target,
		// Without the wake the retry after the first failure comes only
		// after a minute.
		RetryMin: time.Minute, RetryMax: time.Hour,
		Wake: func(txn statedb.ReadTxn) <-chan struct{} {
			_, w := other.AllWatch(txn)
			return w
		},
		Waits: func(err error) bool { return errors.Is(err, errWaiting) },
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); r.Run(ctx, nopHealth{}) }()
	defer func() { cancel(); <-done }()
	insert(db, tbl, &route{Name: "a", Value: 1})
	waitFor(t, "a failing", func() bool {
		o, _, ok := tbl.Get(db.ReadTxn(), routeName.Query("a"))
		return ok && o.Status.Kind == reconciler.StatusError
	})
	target.ready.Store(true)
	began := time.Now()
	insert(db, other, &route{Name: "x"})
	waitFor(t, "a done after the other table changed", func() bool {
		o, _, ok := tbl.Get(db.ReadTxn(), routeName.Query("a"))
		return ok && o.Status.Kind == reconciler.StatusDone
	})
	if d := time.Since(began); d > 10*time.Second {
		t.Errorf("a retried %s after the wake", d)
	}
}
