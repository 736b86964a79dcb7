package endpointmanager

import (
	"log/slog"
	"testing"
	"time"

	"github.com/cilium/statedb"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	"github.com/cellium/cellium/statedb/endpoints"
	"github.com/cellium/cellium/statedb/identity"
	statepolicy "github.com/cellium/cellium/statedb/policy"
)

// BenchmarkRegenerate1000: the endpoint manager's side of a policy change
// that affects 1,000 endpoints: each goes ready -> regenerating -> ready
// at the new revision, one commit per step (stepState).
func BenchmarkRegenerate1000(b *testing.B) {
	const n = 1000
	db := statedb.New()
	eps, err := endpoints.NewTable(db)
	if err != nil {
		b.Fatal(err)
	}
	pols, err := statepolicy.NewTable(db)
	if err != nil {
		b.Fatal(err)
	}
	m := &Manager{log: slog.New(slog.DiscardHandler), db: db, table: eps, policies: pols, now: time.Now}
	txn := db.WriteTxn(eps, pols)
	for i := 1; i <= n; i++ {
		_, _, _ = eps.Insert(txn, &endpoints.Endpoint{ID: uint16(i), Identity: identity.NumericIdentity(1000 + i), State: ciliumv2.EndpointStateReady})
	}
	txn.Commit()
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		rev := uint64(i + 1)
		txn := db.WriteTxn(pols)
		for id := 1; id <= n; id++ {
			_, _, _ = pols.Insert(txn, &statepolicy.EndpointPolicyRow{EndpointID: uint16(id), Identity: identity.NumericIdentity(1000 + id),
				Policy: &statepolicy.EndpointPolicy{Revision: rev}})
		}
		txn.Commit()
		for id := 1; id <= n; id++ {
			m.stepState(uint16(id))
		}
	}
	b.StopTimer()
	if ep, _, _ := eps.Get(db.ReadTxn(), endpoints.IDIndex.Query(n)); ep.State != ciliumv2.EndpointStateReady || ep.PolicyRevision == 0 {
		b.Fatalf("endpoint %d: %s at revision %d", n, ep.State, ep.PolicyRevision)
	}
}
