package parser

import (
	"net/netip"

	flowpb "github.com/cilium/cilium/api/v1/flow"

	"github.com/cellium/cellium/statedb/endpoints"
	"github.com/cellium/cellium/statedb/identity"
	"github.com/cellium/cellium/statedb/ipcache"
	"github.com/cellium/cellium/statedb/lb"
	"github.com/cellium/cellium/statedb/policy"
)

// Endpoints finds this node's endpoints (statedb/endpoints).
type Endpoints interface {
	// EndpointByIP returns the local endpoint with address ip.
	EndpointByIP(ip netip.Addr) (*endpoints.Endpoint, bool)
}

// Workloads names the workloads of a local pod (its controller, with a
// ReplicaSet of a Deployment named as the Deployment: WorkloadOf).
type Workloads interface {
	// PodWorkloads returns the workloads of pod namespace/name; nil when
	// the pod is unknown or has no controller. The result is shared: do
	// not modify it.
	PodWorkloads(namespace, name string) []*flowpb.Workload
}

// IPCache finds the ipcache row of an address (statedb/ipcache).
type IPCache interface {
	// LookupIP returns the row whose prefix holds ip, the longest one
	// when several do, as the datapath's LPM lookup would.
	LookupIP(ip netip.Addr) (*ipcache.Entry, bool)
}

// Nodes names the nodes of the cluster (statedb/nodes).
type Nodes interface {
	// NodeNameByIP returns the name of the node with address ip.
	NodeNameByIP(ip netip.Addr) (string, bool)
}

// Identities gives the labels of security identities.
type Identities interface {
	// IdentityLabels returns the labels of identity id as Hubble prints
	// them ("k8s:app=web", "reserved:world"), sorted. The result is
	// shared: do not modify it.
	IdentityLabels(id identity.NumericIdentity) ([]string, bool)
}

// Services finds the Service of a frontend (statedb/lb).
type Services interface {
	// ServiceByFrontend returns the Service whose frontend (ClusterIP,
	// port, protocol) addr is. The result is shared: do not modify it.
	ServiceByFrontend(addr lb.L4Addr) (*flowpb.Service, bool)
}

// Policies gives the computed policy of local endpoints (statedb/policy).
type Policies interface {
	// EndpointPolicy returns the policy computed for endpoint id.
	EndpointPolicy(id uint16) (*policy.EndpointPolicy, bool)
}

// NodeLabels gives the labels of the node flows are captured on.
type NodeLabels interface {
	// NodeLabels returns the labels of the named node as "key=value",
	// sorted. The result is shared: do not modify it.
	NodeLabels(name string) []string
}

// Sources is what the parser enriches flows from. Every field may be nil:
// what it would give is then left out of the flows.
type Sources struct {
	Endpoints  Endpoints
	Workloads  Workloads
	IPCache    IPCache
	Nodes      Nodes
	Identities Identities
	Services   Services
	Policies   Policies
	NodeLabels NodeLabels
}
