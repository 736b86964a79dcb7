package endpointmanager_test

import (
	"context"
	"sync/atomic"

	"github.com/cilium/statedb"

	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/statedb/endpoints"
	"github.com/cellium/cellium/statedb/identity"
	statepolicy "github.com/cellium/cellium/statedb/policy"
)

// fakePolicy stands in for the policy cell: for every endpoint with an
// identity whose row is missing or for another identity, it writes a
// computed row at revision Rev (1 unless the test sets it). Paused, it
// writes nothing (the test writes rows itself).
type fakePolicy struct {
	Rev    atomic.Uint64
	Paused atomic.Bool
}

func newFakePolicy() *fakePolicy {
	f := &fakePolicy{}
	f.Rev.Store(1)
	return f
}

// cell provides the endpoint-policies table (writable for the test too)
// and the job writing it.
func (f *fakePolicy) cell() hive.Cell {
	return hive.Module("fake-policy", "Writes a policy row for every endpoint",
		hive.Provide(statepolicy.NewTable, statedb.RWTable[*statepolicy.EndpointPolicyRow].ToTable),
		hive.Invoke(func(db *statedb.DB, eps statedb.Table[*endpoints.Endpoint], pols statedb.RWTable[*statepolicy.EndpointPolicyRow], jobs hive.Jobs) {
			jobs.Add(hive.ObserveTable("fake-policy", db, eps, func(_ context.Context, c statedb.Change[*endpoints.Endpoint]) error {
				ep := c.Object
				if c.Deleted || f.Paused.Load() || ep.Identity == identity.InvalidIdentity {
					return nil
				}
				txn := db.WriteTxn(pols)
				defer txn.Abort()
				if cur, _, ok := pols.Get(txn, statepolicy.EndpointIDIndex.Query(ep.ID)); ok && cur.Identity == ep.Identity {
					return nil
				}
				_, _, err := pols.Insert(txn, &statepolicy.EndpointPolicyRow{EndpointID: ep.ID, Identity: ep.Identity,
					Policy: &statepolicy.EndpointPolicy{Revision: f.Rev.Load()}})
				if err == nil {
					txn.Commit()
				}
				return err
			}))
		}),
	)
}
