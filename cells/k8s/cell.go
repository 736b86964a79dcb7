// Package k8s holds the Kubernetes cells: the client, configured with
// Cilium's flags, and resource cells that mirror objects into statedb
// tables (statedb/k8s) and mark each table initialized after its first
// full list, so consumers can wait for the first sync.
package k8s

import "github.com/cellium/cellium/cells/hive"

// ClientCell provides Clientset.
var ClientCell = hive.Module("k8s-client", "Kubernetes client",
	hive.Config(DefaultConfig),
	// The clients; the start hook waits for the API server.
	hive.Provide(NewClientset),
)

// OperatorClientCell provides the operator's Clientset: ClientCell's
// client with the operator's rate limit flags (OperatorConfig).
var OperatorClientCell = hive.Module("k8s-client", "Kubernetes client",
	hive.Config(DefaultOperatorConfig),
	hive.Provide(OperatorConfig.ClientConfig),
	hive.Provide(NewClientset),
)

// AgentResourcesCell mirrors what an agent watches: its own node's pods,
// and cluster-wide namespaces, nodes, policies, Services, EndpointSlices
// and Cilium objects.
var AgentResourcesCell = hive.Module("k8s-resources", "Kubernetes resources in statedb",
	LocalPodsCell, NamespacesCell, NodesCell, NetworkPoliciesCell,
	CNPsCell, CCNPsCell, AgentCiliumEndpointsCell, CiliumNodesCell, CiliumIdentitiesCell,
	ServicesCell, EndpointSlicesCell,
)

// OperatorResourcesCell mirrors what the operator watches: every pod,
// nodes and Cilium objects (CNPs and CCNPs for the policy validator),
// Services and CiliumLoadBalancerIPPools for LB IPAM.
var OperatorResourcesCell = hive.Module("k8s-resources", "Kubernetes resources in statedb",
	AllPodsCell, NamespacesCell, NodesCell,
	CiliumEndpointsCell, CiliumNodesCell, CiliumIdentitiesCell,
	CNPsCell, CCNPsCell,
	ServicesCell, CiliumLoadBalancerIPPoolsCell,
)
