package ipam

import "github.com/cellium/cellium/cells/hive"

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
	// The allocator; its start hook reads <--state-dir>/ipam. Private: others
	// get only the narrow interfaces below.
	hive.ProvidePrivate(newAllocator),
	// Allocator for the endpoint manager, Lookup for nodediscovery (health IP),
	// Lister for the doctor.
	hive.Provide(asAllocator, asLookup, asLister),
	// POST/DELETE/GET /v1/ipam on the agent API; POST answers with the
	// PodMTU (optional, from cni-config) too.
	hive.Provide(apiHandlers),
	// Jobs: build the pool from this node's CiliumNode pod CIDRs; release
	// restored addresses of pods that no longer exist; free pod addresses
	// no endpoint has used for --ipam-gc-grace (needs the endpoints table).
	hive.Invoke(registerJobs),
	// Address usage gauges, when a metrics registry is present.
	hive.Invoke(registerMetrics),
)

func asAllocator(a *allocator) Allocator { return a }
func asLookup(a *allocator) Lookup       { return a }
