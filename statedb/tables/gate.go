package tables

import "github.com/cilium/statedb"

// InitGate holds back the initialization of the tables a deriver writes
// until the deriver says its inputs are complete: it keeps what each
// output table's RegisterInitializer returned and calls them all once, in
// the write transaction that first holds the full derived state. Readers
// of the output tables (a reconciler that prunes, a CNI configuration
// writer) thus never act on a half-derived table. The zero value is an
// open gate. An InitGate is owned by its deriver's job: it is not safe for
// concurrent use.
type InitGate struct {
	done []func(statedb.WriteTxn)
}

// NewInitGate returns a gate closed over the initializers done.
func NewInitGate(done ...func(statedb.WriteTxn)) InitGate {
	return InitGate{done: done}
}

// Add closes the gate over one more initializer.
func (g *InitGate) Add(done func(statedb.WriteTxn)) { g.done = append(g.done, done) }

// Closed reports whether the output tables still wait for the deriver.
func (g *InitGate) Closed() bool { return len(g.done) > 0 }

// Open marks every output table initialized in wtxn (they are, once wtxn
// commits). Later calls do nothing.
func (g *InitGate) Open(wtxn statedb.WriteTxn) {
	for _, f := range g.done {
		f(wtxn)
	}
	g.done = nil
}
