package nodediscovery

import (
	"github.com/cilium/statedb"

	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/statedb/nodes"
)

// Cell needs k8s.NodeName, k8s.Clientset, the k8s nodes and CiliumNodes
// tables, and IPAM's allocations table (statedb/ipam, from ipam.Cell) for
// the health endpoint's address and the router IP.
var Cell = hive.Module("nodediscovery", "Local CiliumNode and the nodes table",
	// --auto-create-cilium-node-resource.
	hive.Config(DefaultConfig),
	// The tables; only this module writes them.
	hive.ProvidePrivate(nodes.NewLocalNodeTable, nodes.NewNodesTable),
	// Everyone reads them: the endpoint manager and CEP sync through
	// LocalNode, the CLI and later the ipcache through the nodes table.
	hive.Provide(statedb.RWTable[*nodes.LocalNode].ToTable, statedb.RWTable[*nodes.Node].ToTable, newLocalNode),
	// GET /v1/node for `cellium node list`.
	hive.Provide(nodeHandlers),
	// The job computing the local-node row.
	hive.Invoke(registerDiscovery),
	// Job mirroring all CiliumNodes into the nodes table.
	hive.Invoke(registerNodesSync),
	// Reconciler publishing the local-node row as this node's CiliumNode.
	hive.Invoke(registerReconciler),
	// With --kvstore=etcd, the row also goes to cilium/state/nodes/v1 (leased).
	hive.Invoke(registerKVStoreNode),
)
