package tables_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/cilium/statedb"
	"github.com/cilium/statedb/index"
	"go.uber.org/goleak"

	"github.com/cellium/cellium/statedb/tables"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type row string

func (row) TableHeader() []string { return []string{"Row"} }
func (r row) TableRow() []string  { return []string{string(r)} }

var idx = statedb.Index[row, string]{
	Name:       "id",
	FromObject: func(r row) index.KeySet { return index.NewKeySet(index.String(string(r))) },
	FromKey:    index.String,
	FromString: index.FromString,
	Unique:     true,
}

func newTable(t *testing.T, db *statedb.DB, name string) (statedb.RWTable[row], func()) {
	t.Helper()
	tbl, err := statedb.NewTable(db, name, idx)
	if err != nil {
		t.Fatal(err)
	}
	txn := db.WriteTxn(tbl)
	done := tbl.RegisterInitializer(txn, "test")
	txn.Commit()
	return tbl, func() {
		txn := db.WriteTxn(tbl)
		done(txn)
		txn.Commit()
	}
}

func expired(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), time.Millisecond)
	t.Cleanup(cancel)
	<-ctx.Done()
	return ctx
}

// WaitInitialized needs every table initialized, and names those still
// missing when ctx ends.
func TestWaitInitialized(t *testing.T) {
	db := statedb.New()
	a, initA := newTable(t, db, "a")
	b, initB := newTable(t, db, "b")

	err := tables.WaitInitialized(expired(t), db, a, b)
	if !errors.Is(err, context.DeadlineExceeded) || err.Error() != "wait for tables a, b to be initialized: context deadline exceeded" {
		t.Fatalf("err = %v: want the deadline, naming a and b", err)
	}
	initB()
	err = tables.WaitInitialized(expired(t), db, a, b)
	if err == nil || err.Error() != "wait for tables a to be initialized: context deadline exceeded" {
		t.Fatalf("with b initialized: err = %v, want a named alone", err)
	}
	if tables.Initialized(db.ReadTxn(), a, b) {
		t.Fatal("Initialized with a not initialized")
	}

	// A waiter blocked on a is woken by a's initialization.
	result := make(chan error, 1)
	go func() { result <- tables.WaitInitialized(t.Context(), db, a, b) }()
	initA()
	if err := <-result; err != nil {
		t.Fatal(err)
	}
	// Initialized: returns nil even with an expired ctx.
	if err := tables.WaitInitialized(expired(t), db, a, b); err != nil {
		t.Fatal(err)
	}
	if !tables.Initialized(db.ReadTxn(), a, b) {
		t.Fatal("not Initialized")
	}
}

// InitWatch returns the channel of the first table still not initialized,
// which closes when it is, and nil once all are (never a closed channel).
func TestInitWatch(t *testing.T) {
	db := statedb.New()
	a, initA := newTable(t, db, "a")
	b, initB := newTable(t, db, "b")
	w := tables.InitWatch(db.ReadTxn(), a, b)
	if w == nil {
		t.Fatal("nil before any table is initialized")
	}
	initA()
	select {
	case <-w:
	default:
		t.Fatal("a's channel did not close when a was initialized")
	}
	w = tables.InitWatch(db.ReadTxn(), a, b)
	if w == nil {
		t.Fatal("nil while b is not initialized")
	}
	initB()
	<-w
	if w := tables.InitWatch(db.ReadTxn(), a, b); w != nil {
		t.Fatal("a channel after both are initialized: a loop would wake on it forever")
	}
}
