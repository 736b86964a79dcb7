package reconciler_test

import (
	"context"
	"fmt"
	"iter"
	"testing"
	"time"

	"github.com/cilium/statedb"

	"github.com/cellium/cellium/statedb/reconciler"
)

type noopTarget struct{}

func (noopTarget) Update(context.Context, statedb.ReadTxn, *route) error { return nil }
func (noopTarget) Delete(context.Context, statedb.ReadTxn, *route) error { return nil }
func (noopTarget) Prune(context.Context, statedb.ReadTxn, iter.Seq2[*route, statedb.Revision]) error {
	return nil
}

type nopHealth struct{}

func (nopHealth) OK(string)              {}
func (nopHealth) Degraded(string, error) {}

// BenchmarkReconcileIncremental measures objects per second from an insert
// through the change stream into a no-op target, status written back.
func BenchmarkReconcileIncremental(b *testing.B) {
	for _, batch := range []int{1, 100, 1000} {
		b.Run(fmt.Sprintf("batch=%d", batch), func(b *testing.B) {
			db := statedb.New()
			if err := db.Start(); err != nil {
				b.Fatal(err)
			}
			defer db.Stop()
			tbl, err := statedb.NewTable(db, "routes", routeName)
			if err != nil {
				b.Fatal(err)
			}
			r, err := reconciler.New(db, reconciler.Config[*route]{
				Name: "bench", Table: tbl, Operations: noopTarget{},
				GetStatus: func(r *route) reconciler.Status { return r.Status },
				SetStatus: func(r *route, s reconciler.Status) *route { c := *r; c.Status = s; return &c },
			})
			if err != nil {
				b.Fatal(err)
			}
			if err := r.Subscribe(); err != nil {
				b.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() { r.Run(ctx, nopHealth{}); close(done) }()
			defer func() { cancel(); <-done }()

			b.ResetTimer()
			total := 0
			for total < b.N {
				txn := db.WriteTxn(tbl)
				for i := 0; i < batch && total < b.N; i++ {
					tbl.Insert(txn, &route{Name: fmt.Sprintf("r%d", total%10000), Value: total, Status: reconciler.Pending()})
					total++
				}
				txn.Commit()
			}
			// Wait until the last write is reconciled.
			for {
				all := true
				for obj := range tbl.All(db.ReadTxn()) {
					if obj.Status.Kind != reconciler.StatusDone {
						all = false
						break
					}
				}
				if all {
					break
				}
				time.Sleep(100 * time.Microsecond)
			}
			b.StopTimer()
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "objects/s")
		})
	}
}

// BenchmarkWriteTxn measures the cost of one statedb write transaction
// inserting n objects.
func BenchmarkWriteTxn(b *testing.B) {
	for _, n := range []int{1, 100} {
		b.Run(fmt.Sprintf("objects=%d", n), func(b *testing.B) {
			db := statedb.New()
			tbl, err := statedb.NewTable(db, "routes", routeName)
			if err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			for i := range b.N {
				txn := db.WriteTxn(tbl)
				for j := range n {
					tbl.Insert(txn, &route{Name: fmt.Sprintf("r%d", (i*n+j)%10000), Value: j})
				}
				txn.Commit()
			}
			b.ReportMetric(float64(b.N*n)/b.Elapsed().Seconds(), "objects/s")
		})
	}
}
