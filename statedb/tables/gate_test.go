package tables_test

import (
	"testing"

	"github.com/cilium/statedb"

	"github.com/cellium/cellium/statedb/tables"
)

// An InitGate initializes all its tables in the transaction Open is given,
// only then, and once.
func TestInitGate(t *testing.T) {
	db := statedb.New()
	a, err := statedb.NewTable(db, "gate-a", idx)
	if err != nil {
		t.Fatal(err)
	}
	b, err := statedb.NewTable(db, "gate-b", idx)
	if err != nil {
		t.Fatal(err)
	}
	wtxn := db.WriteTxn(a, b)
	g := tables.NewInitGate(a.RegisterInitializer(wtxn, "deriver"))
	g.Add(b.RegisterInitializer(wtxn, "deriver"))
	wtxn.Commit()

	if !g.Closed() {
		t.Fatal("a gate with initializers is open")
	}
	if tables.Initialized(db.ReadTxn(), a, b) {
		t.Fatal("tables initialized before the gate opened")
	}
	wtxn = db.WriteTxn(a, b)
	g.Open(wtxn)
	if g.Closed() {
		t.Fatal("gate still closed after Open")
	}
	g.Open(wtxn) // a second Open does nothing
	wtxn.Commit()
	if !tables.Initialized(db.ReadTxn(), a, b) {
		t.Fatal("tables not initialized after Open committed")
	}

	var zero tables.InitGate
	if zero.Closed() {
		t.Fatal("the zero gate is closed")
	}
}
