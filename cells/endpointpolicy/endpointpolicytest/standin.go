// Package endpointpolicytest stands in for the endpoint policy cell in
// partial-hive tests of the cells that read its table: the endpoint
// manager's states follow the endpoint-policies table, so without a writer
// no endpoint ever becomes ready.
package endpointpolicytest

import (
	"context"
	"sync/atomic"

	"github.com/cilium/statedb"

	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/statedb/endpoints"
	"github.com/cellium/cellium/statedb/identity"
	statepolicy "github.com/cellium/cellium/statedb/policy"
)

// StandIn writes, for every endpoint with an identity whose row is missing
// or for another identity, a computed empty policy at revision Rev (1
// unless the test sets it). While Paused it writes nothing: the test
// writes the rows itself.
type StandIn struct {
	Rev    atomic.Uint64
	Paused atomic.Bool
}

// New returns a running (not paused) stand-in at revision 1.
func New() *StandIn {
	s := &StandIn{}
	s.Rev.Store(1)
	return s
}

// Cell provides the endpoint-policies table (writable and read-only, as
// the policy cell does) and the stand-in's job.
func (s *StandIn) Cell() hive.Cell {
	return hive.Module("endpoint-policy-stand-in", "Writes a policy row for every endpoint",
		hive.Provide(statepolicy.NewTable, statedb.RWTable[*statepolicy.EndpointPolicyRow].ToTable),
		hive.Invoke(func(db *statedb.DB, eps statedb.Table[*endpoints.Endpoint], pols statedb.RWTable[*statepolicy.EndpointPolicyRow], jobs hive.Jobs) {
			jobs.Add(hive.ObserveTable("endpoint-policy-stand-in", db, eps, func(_ context.Context, c statedb.Change[*endpoints.Endpoint]) error {
				return s.write(db, pols, c)
			}))
		}),
	)
}

func (s *StandIn) write(db *statedb.DB, pols statedb.RWTable[*statepolicy.EndpointPolicyRow], c statedb.Change[*endpoints.Endpoint]) error {
	ep := c.Object
	if c.Deleted || s.Paused.Load() || ep.Identity == identity.InvalidIdentity {
		return nil
	}
	txn := db.WriteTxn(pols)
	defer txn.Abort()
	if cur, _, ok := pols.Get(txn, statepolicy.EndpointIDIndex.Query(ep.ID)); ok && cur.Identity == ep.Identity {
		return nil
	}
	_, _, err := pols.Insert(txn, &statepolicy.EndpointPolicyRow{EndpointID: ep.ID, Identity: ep.Identity,
		Policy: &statepolicy.EndpointPolicy{Revision: s.Rev.Load()}})
	if err == nil {
		txn.Commit()
	}
	return err
}
