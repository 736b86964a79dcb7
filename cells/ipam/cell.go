package ipam

import (
	"github.com/cilium/statedb"

	"github.com/cellium/cellium/cells/hive"
	ipamtables "github.com/cellium/cellium/statedb/ipam"
)

// Cell is the agent's IPAM in cluster-pool mode. It needs k8s.NodeName,
// statedir.Dir, the k8s CiliumNodes table and, for releasing the restored
// addresses of pods deleted while the agent was down, the local pods table
// (optional), and for its garbage collector the endpoints table (optional).
//
// Callers of Allocator must not block a start hook on it: the pool exists
// only once the CiliumNodes table has this node's pod CIDRs, which a
// background job fills. Call it from jobs or request handlers.
var Cell = hive.Module("ipam", "Pod IP address management in cluster-pool mode",
	// --ipam-gc-grace.
	hive.Config(DefaultConfig),
	// The allocations table (statedb/ipam) is written only by the
	// allocator...
	hive.ProvidePrivate(ipamtables.NewTable),
	// ...and read by node discovery (health and router IP), the CNI
	// configuration writer (can the node allocate?), the endpoint manager
	// (health endpoint IP), the doctor and the CLI.
	hive.Provide(statedb.RWTable[*ipamtables.Allocation].ToTable),
	// The allocator; its start hook reads <--state-dir>/ipam. Private: others
	// get only the narrow interfaces below.
	hive.ProvidePrivate(newAllocator),
	// The allocator's narrow interface, which the responder below uses
	// (no other cell may: test/layout).
	hive.Provide(asAllocator),
	// Answers the endpoint manager's requests (its ipam-requests table):
	// the CNI API's claims and releases, and the addresses of restored
	// endpoints. Readers use the allocations table.
	Responder,
	// POST/DELETE/GET /v1/ipam on the agent API; POST answers with the
	// PodMTU (optional, from cni-config) too.
	hive.Provide(apiHandlers),
	// Jobs: build the pool from this node's CiliumNode pod CIDRs; allocate
	// the health endpoint's address (the CiliumNode's, if it publishes
	// one, so that it survives a lost state directory); release
	// restored addresses of pods that no longer exist; free pod addresses
	// no endpoint has used for --ipam-gc-grace (needs the endpoints table).
	hive.Invoke(registerJobs),
	// Address usage gauges, when a metrics registry is present.
	hive.Invoke(registerMetrics),
)

func asAllocator(a *allocator) Allocator { return a }
