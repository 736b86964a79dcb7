// Package reconcilejob runs a statedb/reconciler.Reconciler inside a hive:
// one helper wires the hive's reconciler metrics into it and adds the job
// that subscribes at start and reports the reconciler's state as the job's
// health, so that every cell gets both the same way.
package reconcilejob

import (
	"context"

	"github.com/cilium/statedb"

	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/statedb/reconciler"
)

// Params are the hive values a reconciler needs. Metrics is optional (a
// hive without the metrics cell records nothing).
type Params struct {
	hive.In

	DB      *statedb.DB
	Jobs    hive.Jobs
	Metrics reconciler.Metrics `optional:"true"`
}

// New creates the reconciler of cfg, recording into the hive's metrics
// unless cfg.Metrics is set, and adds its job (see Job) to p.Jobs. check,
// when not nil, runs in the job's start step before subscribing; its error
// fails the hive's start (say which flag to change).
//
// Possible errors: cfg is invalid (reconciler.New).
func New[Obj any](p Params, cfg reconciler.Config[Obj], check func() error) (*reconciler.Reconciler[Obj], error) {
	if cfg.Metrics == nil {
		cfg.Metrics = p.Metrics
	}
	r, err := reconciler.New(p.DB, cfg)
	if err != nil {
		return nil, err
	}
	p.Jobs.Add(Job(cfg.Name, r, check))
	return r, nil
}

// Job returns the job that runs r, named "reconcile-" + name: it
// subscribes to the table in the hive's start (after check, when not nil),
// so that no object written once the hive started is missed, then runs r
// until stop with the job's health as the reconciler's. The hive's
// inventory lists it with r.Describe().
func Job[Obj any](name string, r *reconciler.Reconciler[Obj], check func() error) hive.Job {
	return hive.DescribeJob(hive.Service("reconcile-"+name,
		func() error {
			if check != nil {
				if err := check(); err != nil {
					return err
				}
			}
			return r.Subscribe()
		},
		func(ctx context.Context, h hive.Health) { r.Run(ctx, h) }),
		r.Describe())
}
