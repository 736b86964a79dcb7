package nodediscovery

import (
	"github.com/cilium/statedb"

	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/statedb/nodes"
)

// Cell needs k8s.NodeName, k8s.Clientset, the k8s nodes and CiliumNodes
// tables, ipam.Allocator (to allocate the health IP) and the IPAM
// allocations table (statedb/ipam, to read it and the router IP back),
// both from ipam.Cell.
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
	// Jobs computing the local-node row and allocating the health IP.
	hive.Invoke(registerDiscovery),
	// Job mirroring all CiliumNodes into the nodes table.
	hive.Invoke(registerNodesSync),
	// Reconciler publishing the local-node row as this node's CiliumNode.
	hive.Invoke(registerReconciler),
)
