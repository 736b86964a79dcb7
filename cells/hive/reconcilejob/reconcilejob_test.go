package reconcilejob_test

import (
	"context"
	"errors"
	"iter"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cilium/statedb"
	"github.com/cilium/statedb/index"
	"go.uber.org/goleak"

	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/cells/hive/hivetest"
	"github.com/cellium/cellium/cells/hive/reconcilejob"
	"github.com/cellium/cellium/statedb/reconciler"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type obj struct {
	Name   string
	Status reconciler.Status
}

func (*obj) TableHeader() []string { return []string{"Name", "Status"} }
func (o *obj) TableRow() []string  { return []string{o.Name, o.Status.String()} }

var nameIndex = statedb.Index[*obj, string]{
	Name:       "name",
	FromObject: func(o *obj) index.KeySet { return index.NewKeySet(index.String(o.Name)) },
	FromKey:    index.String,
	FromString: index.FromString,
	Unique:     true,
}

// ops fails every Update until fixed.
type ops struct{ fixed atomic.Bool }

func (o *ops) Update(context.Context, statedb.ReadTxn, *obj) error {
	if !o.fixed.Load() {
		return errors.New("target refuses")
	}
	return nil
}
func (o *ops) Delete(context.Context, statedb.ReadTxn, *obj) error { return nil }
func (o *ops) Prune(context.Context, statedb.ReadTxn, iter.Seq2[*obj, statedb.Revision]) error {
	return nil
}

type metrics struct {
	mu       sync.Mutex
	failures int
	errors   int
}

func (m *metrics) Operation(name, op string, _ time.Duration, err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if name == "test" && op == "update" && err != nil {
		m.failures++
	}
}

func (m *metrics) Errors(name string, n int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if name == "test" {
		m.errors = n
	}
}

// New wires the hive's reconciler.Metrics into the reconciler and runs it
// as job "reconcile-test", whose health follows the reconciler's state.
func TestNewWiresMetricsAndHealth(t *testing.T) {
	var (
		db     *statedb.DB
		table  statedb.RWTable[*obj]
		health hive.HealthReporter
		target = &ops{}
		m      = &metrics{}
	)
	hivetest.Start(t, nil,
		hive.Provide(
			func() reconciler.Metrics { return m },
			func(db *statedb.DB) (statedb.RWTable[*obj], error) { return statedb.NewTable(db, "objs", nameIndex) },
		),
		hive.Module("test-module", "Test",
			hive.Invoke(func(p reconcilejob.Params, tbl statedb.RWTable[*obj]) error {
				_, err := reconcilejob.New(p, reconciler.Config[*obj]{
					Name: "test", Table: tbl, Operations: target,
					GetStatus: func(o *obj) reconciler.Status { return o.Status },
					SetStatus: func(o *obj, s reconciler.Status) *obj { c := *o; c.Status = s; return &c },
					RetryMin:  time.Millisecond, RetryMax: 10 * time.Millisecond,
				}, nil)
				return err
			}),
		),
		hivetest.Capture(&db), hivetest.Capture(&table), hivetest.Capture(&health),
	)
	txn := db.WriteTxn(table)
	if _, _, err := table.Insert(txn, &obj{Name: "a", Status: reconciler.Pending()}); err != nil {
		t.Fatal(err)
	}
	txn.Commit()

	job := func() hive.HealthStatus {
		for _, s := range health.Statuses() {
			if strings.HasSuffix(s.ID, "reconcile-test") {
				return s
			}
		}
		return hive.HealthStatus{}
	}
	waitFor(t, "degraded health and failures counted", func() bool {
		m.mu.Lock()
		defer m.mu.Unlock()
		return job().Level == hive.LevelDegraded && m.failures > 0 && m.errors == 1
	})
	target.fixed.Store(true)
	waitFor(t, "ok health and no errors", func() bool {
		m.mu.Lock()
		defer m.mu.Unlock()
		o, _, _ := table.Get(db.ReadTxn(), nameIndex.Query("a"))
		return job().Level == hive.LevelOK && m.errors == 0 && o.Status.Kind == reconciler.StatusDone
	})
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
