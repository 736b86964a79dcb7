package kvstoresync

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/cilium/statedb"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/cells/identity"
	"github.com/cellium/cellium/cells/k8s"
	"github.com/cellium/cellium/cells/kvstore"
	"github.com/cellium/cellium/statedb/endpoints"
	kvtables "github.com/cellium/cellium/statedb/kvstore"
	"github.com/cellium/cellium/statedb/nodes"
	"github.com/cellium/cellium/statedb/tables"
)

// Cell needs *kvstore.Client (nil without --kvstore), k8s.NodeName, the
// endpoints and local-node tables, and identity.ClusterName.
var Cell = hive.Module("kvstoresync", "Remote nodes and ipcache entries through the etcd kvstore",
	// The tables; only this module writes them.
	hive.ProvidePrivate(kvtables.NewNodesTable, kvtables.NewIPCacheTable),
	// nodediscovery reads the nodes, the ipcache cell the entries.
	hive.Provide(statedb.RWTable[*kvtables.Node].ToTable, statedb.RWTable[*kvtables.IPEntry].ToTable),
	// The mirrors of cilium/state/nodes/v1 and cilium/state/ip/v1, and the
	// writer of this node's ipcache keys.
	hive.Invoke(register),
)

type params struct {
	hive.In

	DB         *statedb.DB
	Nodes      statedb.RWTable[*kvtables.Node]
	IPs        statedb.RWTable[*kvtables.IPEntry]
	Endpoints  statedb.Table[*endpoints.Endpoint]
	LocalNode  statedb.Table[*nodes.LocalNode]
	NodeName   k8s.NodeName
	Cluster    identity.ClusterName `optional:"true"`
	KVStore    *kvstore.Client      `optional:"true"`
	Jobs       hive.Jobs
	Log        *slog.Logger
	Registerer prometheus.Registerer `optional:"true"`
}

func register(p params) error {
	wtxn := p.DB.WriteTxn(p.Nodes, p.IPs)
	nodesInit := tables.NewInitGate(p.Nodes.RegisterInitializer(wtxn, "kvstore-nodes"))
	ipsInit := tables.NewInitGate(p.IPs.RegisterInitializer(wtxn, "kvstore-ipcache"))
	if p.KVStore == nil {
		// CRD mode: nothing comes.
		nodesInit.Open(wtxn)
		ipsInit.Open(wtxn)
		wtxn.Commit()
		return nil
	}
	wtxn.Commit()

	invalid := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "cellium_kvstore_invalid_keys_total",
		Help: "Keys under cilium/state/nodes/v1 and cilium/state/ip/v1 the agent ignored because they do not parse, by prefix",
	}, []string{"prefix"})
	if p.Registerer != nil {
		if err := p.Registerer.Register(invalid); err != nil {
			return fmt.Errorf("register kvstore metrics: %w", err)
		}
	}
	cluster, local := string(p.Cluster), string(p.NodeName)
	nm := &mirror[*kvtables.Node]{
		name: "nodes", prefix: kvstore.NodesPrefix + "/", db: p.DB, table: p.Nodes,
		parse: func(key string, v []byte, rev int64) (*kvtables.Node, bool, error) {
			n, err := ParseNode(key, v, rev)
			if err != nil {
				return nil, false, err
			}
			// This node (it knows itself first-hand), and nodes of other
			// clusters (cellium has no cluster mesh).
			return n, n.Cluster == cluster && n.Name != local, nil
		},
		invalid: invalid.WithLabelValues("nodes").Inc,
		log:     p.Log, init: nodesInit, rows: map[string]*kvtables.Node{}, bad: map[string]int64{},
	}
	im := &mirror[*kvtables.IPEntry]{
		name: "ip", prefix: kvstore.IPKeysPrefix, db: p.DB, table: p.IPs,
		parse: func(key string, v []byte, rev int64) (*kvtables.IPEntry, bool, error) {
			e, err := ParseIPEntry(key, v, rev)
			return e, err == nil, err
		},
		invalid: invalid.WithLabelValues("ip").Inc,
		log:     p.Log, init: ipsInit, rows: map[string]*kvtables.IPEntry{}, bad: map[string]int64{},
	}
	w := &writer{kv: p.KVStore, db: p.DB, endpoints: p.Endpoints, localNode: p.LocalNode, mirrored: p.IPs, node: local, log: p.Log}
	p.Jobs.Add(hive.Service("kvstore-nodes", nil, func(ctx context.Context, h hive.Health) {
		nm.etcd = p.KVStore.Etcd()
		nm.run(ctx, h)
	}))
	p.Jobs.Add(hive.Service("kvstore-ipcache", nil, func(ctx context.Context, h hive.Health) {
		im.etcd = p.KVStore.Etcd()
		im.run(ctx, h)
	}))
	p.Jobs.Add(hive.Service("kvstore-ipcache-writer", nil, w.run))
	return nil
}
