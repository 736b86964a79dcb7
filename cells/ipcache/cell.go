package ipcache

import (
	"context"
	"log/slog"

	"github.com/cilium/statedb"
	"github.com/prometheus/client_golang/prometheus"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/statedb/endpoints"
	"github.com/cellium/cellium/statedb/ipcache"
	"github.com/cellium/cellium/statedb/nodes"
	"github.com/cellium/cellium/statedb/policy"
)

// Cell derives the ipcache table from the endpoints, nodes, CiliumEndpoint
// and policy CIDR tables.
var Cell = hive.Module("ipcache", "IP prefix to identity, from endpoints, nodes, CEPs and policy CIDRs",
	// The table: rows written only here.
	hive.ProvidePrivate(ipcache.NewTable),
	// Everyone reads it (the CLI, the datapath); the datapath's
	// reconciler also writes the rows' status.
	hive.Provide(statedb.RWTable[*ipcache.Entry].ToTable,
		func(t statedb.RWTable[*ipcache.Entry]) ipcache.StatusTable { return ipcache.StatusTable{RWTable: t} }),
	// Input tables in, prefixes out; the CiliumEndpoint checks' metrics.
	hive.Invoke(register),
)

type params struct {
	hive.In
	DB        *statedb.DB
	Endpoints statedb.Table[*endpoints.Endpoint]
	LocalNode statedb.Table[*nodes.LocalNode]
	Nodes     statedb.Table[*nodes.Node]
	CEPs      statedb.Table[*ciliumv2.CiliumEndpoint]
	CIDRs     statedb.Table[*policy.CIDRIdentity]
	// Identities: a CEP's identity must be a CiliumIdentity of its namespace.
	Identities statedb.Table[*ciliumv2.CiliumIdentity]
	IPCache    statedb.RWTable[*ipcache.Entry]
	Jobs       hive.Jobs
	Log        *slog.Logger
	Registerer prometheus.Registerer `optional:"true"`
}

func register(p params) error {
	d := NewDeriver(Tables{DB: p.DB, Endpoints: p.Endpoints, LocalNode: p.LocalNode, Nodes: p.Nodes,
		CEPs: p.CEPs, CIDRs: p.CIDRs, Identities: p.Identities, IPCache: p.IPCache}, p.Log)
	p.Jobs.Add(hive.Service("derive-ipcache", d.Subscribe, func(ctx context.Context, h hive.Health) { d.Run(ctx, h) }))
	return registerMetrics(p.Registerer, d)
}
