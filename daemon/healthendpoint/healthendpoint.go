// Package healthendpoint composes the agent's health endpoint datapath
// cell: the health-netns and health-interface tables (statedb/health), the
// deriver that fills the first from the health endpoint row and the router
// IP, and its reconciler into the kernel (datapath/healthep: the
// cilium-health namespace, the lxc_health veth, the responder on port
// 4240), behind --enable-endpoint-health-checking. Like daemon/hostrouting
// it is a package of its own, composed only by cellium-agent's main.
package healthendpoint

import (
	"context"
	"log/slog"
	"time"

	"github.com/cilium/statedb"

	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/cells/hive/reconcilejob"
	"github.com/cellium/cellium/datapath/healthep"
	"github.com/cellium/cellium/datapath/link"
	"github.com/cellium/cellium/statedb/endpoints"
	"github.com/cellium/cellium/statedb/health"
	"github.com/cellium/cellium/statedb/nodes"
)

// Flag switches the cell on and off (Cilium's flag and default).
const Flag = "enable-endpoint-health-checking"

// FullInterval is how often the reconciler checks the namespace, veth and
// responder again, repairing what was removed or stopped.
const FullInterval = 10 * time.Second

// Options say where the cell acts; the zero Options are the agent's.
type Options struct {
	// Host is the node's namespace (the zero Host is the agent's own).
	Host link.Host
	// Names are the namespace, veth and port (zero: Cilium's).
	Names healthep.Names
	// FullInterval overrides FullInterval when not 0.
	FullInterval time.Duration
}

// Cell gives the node's health endpoint its namespace, veth and responder
// in the agent's own network namespace.
var Cell = NewCell(Options{})

// NewCell is Cell with o (tests give a namespace playing the node and
// names of their own).
func NewCell(o Options) hive.Cell {
	return hive.Module("health-endpoint", "Health endpoint namespace, veth and responder",
		hive.Feature(Flag, true,
			"Give the node's health endpoint a network namespace (cilium-health), a veth (lxc_health) and a responder on port 4240, so that the node's connectivity to it can be probed",
			// Written only here: the desired row by the deriver, its
			// status by the reconciler, the interface by the operations.
			hive.ProvidePrivate(health.NewNetnsTable, health.NewInterfaceTable),
			// Read by the endpoint manager (the health endpoint row's
			// interface), the CLI and the doctor.
			hive.Provide(statedb.RWTable[*health.Netns].ToTable, statedb.RWTable[*health.Interface].ToTable),
			// The operations, for tests that stop the responder.
			hive.Provide(func(p opsParams) *healthep.Ops {
				return healthep.NewOps(o.Host, p.DB, p.Interfaces, p.Log)
			}),
			// Health endpoint + router IP -> desired row -> the kernel.
			hive.Invoke(func(p params) error { return register(p, o) }),
		),
	)
}

type opsParams struct {
	hive.In
	DB         *statedb.DB
	Interfaces statedb.RWTable[*health.Interface]
	Log        *slog.Logger
}

type params struct {
	hive.In
	DB        *statedb.DB
	Endpoints statedb.Table[*endpoints.Endpoint]
	LocalNode statedb.Table[*nodes.LocalNode]
	Netns     statedb.RWTable[*health.Netns]
	Ops       *healthep.Ops
	Lifecycle hive.Lifecycle
	Jobs      hive.Jobs
	Reconcile reconcilejob.Params
}

func register(p params, o Options) error {
	d := healthep.NewDeriver(o.Names, p.DB, p.Endpoints, p.LocalNode, p.Netns)
	rc := healthep.Reconciler(p.Netns, p.Ops)
	rc.FullInterval = FullInterval
	if o.FullInterval != 0 {
		rc.FullInterval = o.FullInterval
	}
	// Job "reconcile-health-netns".
	if _, err := reconcilejob.New(p.Reconcile, rc, nil); err != nil {
		return err
	}
	p.Jobs.Add(hive.Service("derive-health-endpoint", nil, func(ctx context.Context, h hive.Health) { d.Run(ctx, h) }))
	// The responder stops with the agent; the namespace and the veth stay
	// for the next agent to adopt.
	p.Lifecycle.Append(hive.Hook{Name: "health-responder", OnStop: func(context.Context) error {
		p.Ops.Close()
		return nil
	}})
	return nil
}
