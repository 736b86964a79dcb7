package reconciler_test

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"maps"
	"slices"
	"sync"
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
}

func newFakeTarget() *fakeTarget {
	return &fakeTarget{state: map[string]int{}, failures: map[string]int{}, updates: map[string]int{}}
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
	time.Sleep(150 * time.Millisecond) // three full intervals
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
