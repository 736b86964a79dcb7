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
	kvtables "github.com/cellium/cellium/statedb/kvstore"
	"github.com/cellium/cellium/statedb/lb"
	"github.com/cellium/cellium/statedb/nodes"
	"github.com/cellium/cellium/statedb/policy"
)

// Cell derives the ipcache table from the endpoints, nodes, CiliumEndpoint
// and policy CIDR tables, and, while the socket load balancer is on, marks
// its frontends' addresses (the lb-frontends table).
var Cell = hive.Module("ipcache", "IP prefix to identity, from endpoints, nodes, CEPs, CIDRs, Service frontends",
	// The table: rows written only here.
	hive.ProvidePrivate(ipcache.NewTable),
	// Everyone reads it (the CLI, the datapath); the datapath's
	// reconciler also writes the rows' status.
	hive.Provide(statedb.RWTable[*ipcache.Entry].ToTable,
		func(t statedb.RWTable[*ipcache.Entry]) ipcache.StatusTable { return ipcache.StatusTable{RWTable: t} }),
	// The CiliumEndpoints the checks refuse: rows written only here, by
	// the deriver, read by the doctor and the CLI.
	hive.ProvidePrivate(ipcache.NewRefusedTable),
	hive.Provide(statedb.RWTable[*ipcache.RefusedCEP].ToTable),
	// Input tables in, prefixes out; the CiliumEndpoint checks' metrics.
	hive.ProvidePrivate(register),
	hive.Invoke(func(*Deriver) {}),
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
	// The socket load balancer's switch and frontends: provided by its
	// cell (daemon/socklb) under the BPF datapath, absent (off) without.
	SocketLB  lb.SocketLB                 `optional:"true"`
	Frontends statedb.Table[*lb.Frontend] `optional:"true"`
	IPCache   statedb.RWTable[*ipcache.Entry]
	Refused   statedb.RWTable[*ipcache.RefusedCEP]
	// KVStore: the etcd kvstore's ipcache keys (kvstoresync.Cell).
	KVStore    statedb.Table[*kvtables.IPEntry] `optional:"true"`
	Jobs       hive.Jobs
	Log        *slog.Logger
	Registerer prometheus.Registerer `optional:"true"`
}

func register(p params) (*Deriver, error) {
	t := Tables{DB: p.DB, Endpoints: p.Endpoints, LocalNode: p.LocalNode, Nodes: p.Nodes,
		CEPs: p.CEPs, CIDRs: p.CIDRs, Identities: p.Identities, IPCache: p.IPCache, Refused: p.Refused,
		KVStore: p.KVStore}
	if p.SocketLB.Enabled {
		// Only what the socket LB translates is guarded: with it off, a
		// ClusterIP is world to the datapath (Documentation/operations/socket-lb.md).
		t.Frontends = p.Frontends
	}
	d := NewDeriver(t, p.Log)
	p.Jobs.Add(hive.Service("derive-ipcache", d.Subscribe, func(ctx context.Context, h hive.Health) { d.Run(ctx, h) }))
	return d, registerMetrics(p.Registerer, d)
}
