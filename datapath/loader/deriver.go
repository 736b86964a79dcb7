package loader

import (
	"context"
	"fmt"

	"github.com/cilium/statedb"

	"github.com/cellium/cellium/statedb/bpfprog"
	"github.com/cellium/cellium/statedb/endpoints"
	"github.com/cellium/cellium/statedb/reconciler"
	"github.com/cellium/cellium/statedb/routes"
)

// Tables are the tables the deriver reads and writes.
type Tables struct {
	DB        *statedb.DB
	Endpoints statedb.Table[*endpoints.Endpoint]
	Programs  statedb.RWTable[*bpfprog.Program]
}

// Deriver keeps the bpf-programs table equal to bpfprog.Derive of every
// endpoint. Create it with NewDeriver before the hive starts (it registers
// as the table's initializer), then Run it.
type Deriver struct {
	t         Tables
	auditMode bool
	initDone  func(statedb.WriteTxn)
}

// NewDeriver registers the deriver as the initializer of the programs
// table: it is initialized (and the reconciler may prune the pins of
// endpoints that are gone) only once the endpoints table is, so that a
// restarted agent never detaches a restored endpoint's programs.
// auditMode is --policy-audit-mode.
func NewDeriver(t Tables, auditMode bool) *Deriver {
	wtxn := t.DB.WriteTxn(t.Programs)
	d := &Deriver{t: t, auditMode: auditMode, initDone: t.Programs.RegisterInitializer(wtxn, "bpf-loader")}
	wtxn.Commit()
	return d
}

// Run derives until ctx ends, each time the endpoints change.
func (d *Deriver) Run(ctx context.Context, health reconciler.Health) {
	for {
		rtxn := d.t.DB.ReadTxn()
		eps, watch := d.t.Endpoints.AllWatch(rtxn)
		var initWatch <-chan struct{}
		if d.initDone != nil {
			if ok, w := d.t.Endpoints.Initialized(rtxn); !ok {
				initWatch = w
			}
		}
		var want []*bpfprog.Program
		for ep := range eps {
			if p := bpfprog.Derive(ep, d.auditMode); p != nil {
				want = append(want, p)
			}
		}
		if err := d.write(rtxn, want); err != nil {
			health.Degraded("write desired programs", err)
		} else {
			health.OK(fmt.Sprintf("%d endpoints with programs desired", len(want)))
		}
		select {
		case <-ctx.Done():
			return
		case <-watch:
		case <-initWatch:
		}
	}
}

func (d *Deriver) write(rtxn statedb.ReadTxn, want []*bpfprog.Program) error {
	wtxn := d.t.DB.WriteTxn(d.t.Programs)
	defer wtxn.Abort()
	if _, err := routes.Sync(wtxn, d.t.Programs, want, func(p *bpfprog.Program) reconciler.Status { return p.Status }); err != nil {
		return err
	}
	if d.initDone != nil {
		if ok, _ := d.t.Endpoints.Initialized(rtxn); ok {
			d.initDone(wtxn)
			d.initDone = nil
		}
	}
	wtxn.Commit()
	return nil
}

// ReconcilerConfig is the configuration of the programs table's
// reconciler (name "bpf-programs"), applying ops.
func ReconcilerConfig(t Tables, ops *Ops) reconciler.Config[*bpfprog.Program] {
	return reconciler.Config[*bpfprog.Program]{
		Name: bpfprog.TableName, Table: t.Programs, Operations: ops,
		GetStatus: func(p *bpfprog.Program) reconciler.Status { return p.Status },
		SetStatus: (*bpfprog.Program).WithStatus,
	}
}
