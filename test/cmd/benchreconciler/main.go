// Command benchreconciler runs statedb's own reconciler benchmark workload
// (github.com/cilium/statedb/reconciler/benchmark: N objects inserted in
// write transactions of a batch each, reconciled into a no-op target,
// until the last one is marked done) through statedb's reconciler in a
// cilium/hive and through cellium's statedb/reconciler in cellium's hive,
// one after the other in one process, and prints both side by side
// (`make bench-reconciler`).
package main

import (
	"context"
	"flag"
	"fmt"
	"iter"
	"log/slog"
	"os"
	"runtime"
	"sync/atomic"
	"time"

	chive "github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/job"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/index"
	sreconciler "github.com/cilium/statedb/reconciler"
	"golang.org/x/time/rate"

	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/cells/hive/reconcilejob"
	"github.com/cellium/cellium/statedb/reconciler"
)

func main() {
	objects := flag.Int("objects", 1_000_000, "objects to insert and reconcile (statedb's benchmark default)")
	batch := flag.Int("batchsize", 1000, "objects per write transaction")
	incr := flag.Int("incrbatchsize", 1000, "most objects per incremental round (statedb's WithRoundLimits; cellium's RoundLimit)")
	runs := flag.Int("runs", 1, "runs of each, alternating")
	flag.Parse()
	if *objects < 1 || *batch < 1 || *incr < 1 || *runs < 1 {
		fmt.Fprintln(os.Stderr, "benchreconciler: -objects, -batchsize, -incrbatchsize and -runs must be at least 1")
		os.Exit(2)
	}
	fmt.Printf("%d objects, write batches of %d, incremental rounds of at most %d, GOMAXPROCS %d\n\n",
		*objects, *batch, *incr, runtime.GOMAXPROCS(0))
	fmt.Printf("%-34s %12s %16s %14s %12s\n", "reconciler", "seconds", "objects/s", "allocated MB", "updates")
	for range *runs {
		for _, r := range []struct {
			name string
			run  func(n, batch, incr int) (time.Duration, int64, error)
		}{
			{"statedb/reconciler (cilium/hive)", runUpstream},
			{"cellium statedb/reconciler", runCellium},
		} {
			runtime.GC()
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			d, updates, err := r.run(*objects, *batch, *incr)
			if err != nil {
				fmt.Fprintf(os.Stderr, "benchreconciler: %s: %v\n", r.name, err)
				os.Exit(1)
			}
			runtime.ReadMemStats(&after)
			fmt.Printf("%-34s %12.2f %16.0f %14d %12d\n", r.name, d.Seconds(), float64(*objects)/d.Seconds(),
				(after.TotalAlloc-before.TotalAlloc)/1024/1024, updates)
		}
	}
}

// upstreamObject is the row of statedb's benchmark.
type upstreamObject struct {
	id     uint64
	status sreconciler.Status
}

// TableHeader and TableRow make the rows printable, as statedb asks.
func (o *upstreamObject) TableHeader() []string { return []string{"id", "status"} }
func (o *upstreamObject) TableRow() []string {
	return []string{fmt.Sprint(o.id), o.status.String()}
}

func (o *upstreamObject) clone() *upstreamObject { c := *o; return &c }
func (o *upstreamObject) setStatus(s sreconciler.Status) *upstreamObject {
	o.status = s
	return o
}
func (o *upstreamObject) getStatus() sreconciler.Status { return o.status }

var upstreamIndex = statedb.Index[*upstreamObject, uint64]{
	Name:       "id",
	FromObject: func(o *upstreamObject) index.KeySet { return index.NewKeySet(index.Uint64(o.id)) },
	FromKey:    index.Uint64,
	Unique:     true,
}

type upstreamOps struct{ updates atomic.Int64 }

func (o *upstreamOps) Update(context.Context, statedb.ReadTxn, statedb.Revision, *upstreamObject) error {
	o.updates.Add(1)
	return nil
}
func (o *upstreamOps) Delete(context.Context, statedb.ReadTxn, statedb.Revision, *upstreamObject) error {
	return nil
}
func (o *upstreamOps) Prune(context.Context, statedb.ReadTxn, iter.Seq2[*upstreamObject, statedb.Revision]) error {
	return nil
}

// runUpstream is statedb's benchmark as it wires it: a cilium/hive with
// statedb's and hive's job cells, the reconciler registered with round
// limits of incr objects and 1000 rounds a second.
func runUpstream(n, batch, incr int) (time.Duration, int64, error) {
	var (
		ops = &upstreamOps{}
		db  *statedb.DB
		tbl statedb.RWTable[*upstreamObject]
	)
	h := chive.New(
		cell.SimpleHealthCell,
		statedb.Cell,
		job.Cell,
		cell.Module("bench", "Benchmark",
			cell.Invoke(func(d *statedb.DB) (err error) {
				db = d
				tbl, err = statedb.NewTable(d, "test-objects", upstreamIndex)
				return err
			}),
			cell.Provide(job.Registry.NewGroup),
			cell.Invoke(func(p sreconciler.Params) error {
				_, err := sreconciler.Register(p, tbl,
					(*upstreamObject).clone, (*upstreamObject).setStatus, (*upstreamObject).getStatus,
					ops, nil,
					sreconciler.WithRoundLimits(incr, rate.NewLimiter(1000.0, 10)))
				return err
			}),
		),
	)
	log := slog.New(slog.DiscardHandler)
	if err := h.Start(log, context.Background()); err != nil {
		return 0, 0, err
	}
	defer func() { _ = h.Stop(log, context.Background()) }()
	return fill(db, tbl, upstreamIndex, n, batch, &ops.updates,
		func(id uint64) *upstreamObject { return &upstreamObject{id: id, status: sreconciler.StatusPending()} },
		func(o *upstreamObject) bool { return o.status.Kind == sreconciler.StatusKindDone })
}

// celliumObject is the same row for cellium's reconciler.
type celliumObject struct {
	id     uint64
	status reconciler.Status
}

// TableHeader and TableRow make the rows printable, as statedb asks.
func (o *celliumObject) TableHeader() []string { return []string{"id", "status"} }
func (o *celliumObject) TableRow() []string {
	return []string{fmt.Sprint(o.id), o.status.String()}
}

var celliumIndex = statedb.Index[*celliumObject, uint64]{
	Name:       "id",
	FromObject: func(o *celliumObject) index.KeySet { return index.NewKeySet(index.Uint64(o.id)) },
	FromKey:    index.Uint64,
	Unique:     true,
}

type celliumOps struct{ updates atomic.Int64 }

func (o *celliumOps) Update(context.Context, statedb.ReadTxn, *celliumObject) error {
	o.updates.Add(1)
	return nil
}
func (o *celliumOps) Delete(context.Context, statedb.ReadTxn, *celliumObject) error { return nil }
func (o *celliumOps) Prune(context.Context, statedb.ReadTxn, iter.Seq2[*celliumObject, statedb.Revision]) error {
	return nil
}

// runCellium runs the same workload the way cellium's cells run a
// reconciler: cellium's hive, reconcilejob.New, RoundLimit incr.
func runCellium(n, batch, incr int) (time.Duration, int64, error) {
	var (
		ops = &celliumOps{}
		db  *statedb.DB
		tbl statedb.RWTable[*celliumObject]
	)
	h := hive.NewWithOptions(hive.Options{
		Logger:    slog.New(slog.DiscardHandler),
		LookupEnv: func(string) (string, bool) { return "", false },
	}, hive.Module("bench", "Benchmark",
		hive.Invoke(func(d *statedb.DB, p reconcilejob.Params) (err error) {
			db = d
			if tbl, err = statedb.NewTable(d, "test-objects", celliumIndex); err != nil {
				return err
			}
			_, err = reconcilejob.New(p, reconciler.Config[*celliumObject]{
				Name:  "test-objects",
				Table: tbl,
				GetStatus: func(o *celliumObject) reconciler.Status {
					return o.status
				},
				SetStatus: func(o *celliumObject, s reconciler.Status) *celliumObject {
					c := *o
					c.status = s
					return &c
				},
				Operations:   ops,
				FullInterval: time.Hour,
				RoundLimit:   incr,
			}, nil)
			return err
		}),
	))
	if err := h.Start(context.Background()); err != nil {
		return 0, 0, err
	}
	defer func() { _ = h.Stop(context.Background()) }()
	return fill(db, tbl, celliumIndex, n, batch, &ops.updates,
		func(id uint64) *celliumObject { return &celliumObject{id: id, status: reconciler.Pending()} },
		func(o *celliumObject) bool { return o.status.Kind == reconciler.StatusDone })
}

// fill is the benchmark's workload on a started reconciler of tbl: n
// objects made by mk, inserted in write transactions of batch, then a wait
// until the last is done; it returns the time taken and the target's
// Update calls (updates), at least one per object.
func fill[Obj any](db *statedb.DB, tbl statedb.RWTable[Obj], idx statedb.Index[Obj, uint64], n, batch int,
	updates *atomic.Int64, mk func(id uint64) Obj, done func(Obj) bool) (time.Duration, int64, error) {
	start := time.Now()
	id := uint64(0)
	for range n / batch {
		txn := db.WriteTxn(tbl)
		for range batch {
			if _, _, err := tbl.Insert(txn, mk(id)); err != nil {
				txn.Abort()
				return 0, 0, err
			}
			id++
		}
		txn.Commit()
	}
	for {
		obj, _, watch, ok := tbl.GetWatch(db.ReadTxn(), idx.Query(id-1))
		if ok && done(obj) {
			break
		}
		<-watch
	}
	d := time.Since(start)
	if got := updates.Load(); got < int64(id) {
		return 0, 0, fmt.Errorf("%d updates for %d objects: some were never reconciled", got, id)
	}
	return d, updates.Load(), nil
}
