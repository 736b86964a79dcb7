package healthcheck

import (
	"github.com/cilium/statedb"

	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/statedb/health"
)

// Flag switches the prober on and off (Cilium's flag and default).
const Flag = "enable-health-checking"

// Cell probes the health endpoint from the agent's own namespace.
var Cell = NewCell(Options{})

// NewCell is Cell with o (tests probe from a namespace playing the node,
// more often).
func NewCell(o Options) hive.Cell {
	return hive.Module("health-check", "Probes the health endpoint of the node and every other node",
		hive.Feature(Flag, true,
			"Probe the node's health endpoint (GET /hello on port 4240 in the cilium-health namespace) and report it as Cluster health in cellium status",
			// Written only by the prober...
			hive.ProvidePrivate(health.NewProbesTable),
			// ...read by GET /v1/healthz and cellium statedb.
			hive.Provide(statedb.RWTable[*health.Probe].ToTable),
			// The probe loop.
			hive.Invoke(func(p params) { register(p, o) }),
			// --health-check-interval.
			hive.Config(DefaultConfig),
			// The probes of every other node: written only by the node
			// prober, read by GET /v1/health/nodes, cellium status and
			// the metrics.
			hive.ProvidePrivate(health.NewNodePathsTable),
			hive.Provide(statedb.RWTable[*health.NodePath].ToTable),
			hive.Invoke(func(p nodeParams) error { return registerNodeProber(p, o) }),
		),
	)
}
