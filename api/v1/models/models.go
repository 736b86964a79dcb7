package models

import "time"

// Error is the body of every failed request.
type Error struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

func (e *Error) Error() string { return e.Message }

// EndpointChangeRequest is the body of PUT /v1/endpoint: what the CNI
// plugin made for a pod and asks the agent to manage.
type EndpointChangeRequest struct {
	// ContainerID is the sandbox (infra) container ID (CNI_CONTAINERID).
	ContainerID string `json:"container-id"`
	// ContainerInterfaceName is the interface in the pod (CNI_IFNAME).
	ContainerInterfaceName string `json:"container-interface-name"`
	// K8sNamespace, K8sPodName and K8sUID identify the pod (CNI_ARGS).
	K8sNamespace string `json:"k8s-namespace"`
	K8sPodName   string `json:"k8s-pod-name"`
	K8sUID       string `json:"k8s-uid,omitempty"`
	// InterfaceName and InterfaceIndex are the host side of the veth.
	InterfaceName  string `json:"interface-name"`
	InterfaceIndex int    `json:"interface-index"`
	// MAC is the pod side's address, HostMAC the host side's.
	MAC     string `json:"mac"`
	HostMAC string `json:"host-mac"`
	// NetnsPath is the pod's network namespace.
	NetnsPath string `json:"netns-path"`
	// Addressing is the IP the plugin got from POST /v1/ipam.
	Addressing AddressPair `json:"addressing"`
	// SyncBuildEndpoint makes the call wait until the endpoint is ready.
	SyncBuildEndpoint bool `json:"sync-build-endpoint"`
}

// Endpoint is what GET /v1/endpoint/{id} returns.
type Endpoint struct {
	ID int64 `json:"id"`
	// Spec is what the endpoint was created from.
	Spec *EndpointChangeRequest `json:"spec,omitempty"`
	// Status is exactly the .status of the pod's CiliumEndpoint.
	Status EndpointStatus `json:"status"`
	// Policy holds the endpoint's policy revisions. Cilium's API has them
	// at status.policy.realized / status.policy.spec; here status is the
	// CEP's, which has no field for them, so they sit beside it.
	Policy *EndpointPolicyRevisions `json:"policy,omitempty"`
}

// EndpointPolicyRevisions are the policy repository revisions of an
// endpoint's policy.
type EndpointPolicyRevisions struct {
	// Realized is the revision of the policy the endpoint has taken (at
	// its last regeneration).
	Realized EndpointPolicyRevision `json:"realized"`
	// Spec is the revision of the policy the engine computed for it last;
	// above Realized while the endpoint regenerates.
	Spec EndpointPolicyRevision `json:"spec"`
}

// EndpointPolicyRevision is one policy revision, under Cilium's key.
type EndpointPolicyRevision struct {
	PolicyRevision uint64 `json:"policy-revision"`
}

// IPAMAddress is one allocated address.
type IPAMAddress struct {
	// IP is the allocated address.
	IP string `json:"ip"`
	// Gateway is the node's router IP, the pod's default gateway.
	Gateway string `json:"gateway"`
	// CIDRs are the node's pod CIDRs the address came from.
	CIDRs []string `json:"cidrs"`
	// Owner is who the address was allocated to ("namespace/pod").
	Owner string `json:"owner,omitempty"`
	// ContainerID is the CNI container ID the address was allocated for,
	// when the caller sent one (POST /v1/ipam?container-id=).
	ContainerID string `json:"container-id,omitempty"`
	// Since is when the address was allocated, restored or last claimed
	// by an endpoint (RFC 3339); the IPAM garbage collector's grace
	// counts from it.
	Since string `json:"since,omitempty"`
}

// IPAMReleased is an address the IPAM garbage collector freed because no
// endpoint used it (GET /v1/ipam/gc).
type IPAMReleased struct {
	IPAMAddress
	// ReleasedAt is when it was freed (RFC 3339).
	ReleasedAt string `json:"released-at"`
}

// IPAMGC is GET /v1/ipam/gc: the garbage collector's setting and what it
// freed last.
type IPAMGC struct {
	// Grace is --ipam-gc-grace ("0s": the collector is off).
	Grace string `json:"grace"`
	// ReleasedTotal counts the addresses freed since the agent started.
	ReleasedTotal uint64 `json:"released-total"`
	// Released are the last addresses freed, oldest first (at most 100).
	Released []IPAMReleased `json:"released"`
}

// IPAMResponse is what POST /v1/ipam returns.
type IPAMResponse struct {
	IPv4 *IPAMAddress `json:"ipv4,omitempty"`
	// MTU is the MTU of pod interfaces (the agent's --mtu, or the one it
	// derived from the node), so that the CNI plugin needs no other call
	// to set up the pod. 0 when the agent does not know it.
	MTU int `json:"mtu,omitempty"`
}

// Identity is a security identity: GET /v1/identity[/{id}].
type Identity struct {
	ID     int64    `json:"id"`
	Labels []string `json:"labels"`
}

// NodeAddress is one address of a node.
type NodeAddress struct {
	Type string `json:"type"`
	IP   string `json:"ip"`
}

// Node is one node of the cluster: GET /v1/node.
type Node struct {
	Name       string        `json:"name"`
	Addresses  []NodeAddress `json:"addresses"`
	PodCIDRs   []string      `json:"pod-cidrs,omitempty"`
	HealthIPv4 string        `json:"health-ipv4,omitempty"`
	BootID     string        `json:"boot-id,omitempty"`
	Local      bool          `json:"local,omitempty"`
	// Refused says what of the node's CiliumNode the agent does not use,
	// and why (a malformed or duplicate address or pod CIDR).
	Refused []string `json:"refused,omitempty"`
	// Health is reachable, unreachable or unknown as this agent's probes
	// of the node found ("" for the local node, or without probing).
	Health string `json:"health,omitempty"`
}

// DaemonConfig is GET /v1/config: what clients of the agent need to know.
type DaemonConfig struct {
	// MTU of pod interfaces.
	MTU int `json:"mtu"`
	// NodeName is this agent's node.
	NodeName string `json:"node-name"`
	// Options is every flag with its current value.
	Options map[string]string `json:"options"`
}

// LabelsPatch is the body of PATCH /v1/endpoint/{id}/labels.
type LabelsPatch struct {
	Add    map[string]string `json:"add,omitempty"`
	Delete []string          `json:"delete,omitempty"`
}

// Health is the agent's reply to GET /v1/healthz.
type Health struct {
	// State is HealthStateOK when every module is ok or stopped, else
	// "Degraded".
	State string `json:"state"`
	// Modules is the worst report of each module (of each part with
	// ?verbose=true).
	Modules []ModuleHealth `json:"modules"`
	// ClusterHealth is what probing the node's health endpoint found; nil
	// when probing is off (--enable-health-checking=false).
	ClusterHealth *ClusterHealth `json:"cluster-health,omitempty"`
}

// ClusterHealth counts the health responders the agent probes and how
// many answered (Cilium's "Cluster health: N/M reachable").
type ClusterHealth struct {
	// Reachable and Total count this node's health endpoint (each row of
	// Probes) and the other nodes (Nodes): a node is reachable when every
	// path to it answered its last probe.
	Reachable int           `json:"reachable"`
	Total     int           `json:"total"`
	Probes    []HealthProbe `json:"probes"`
	// Nodes are the other nodes the agent probes, by name.
	Nodes []NodeHealth `json:"nodes,omitempty"`
}

// NodeHealth is what probing one other node found.
type NodeHealth struct {
	Name string `json:"name"`
	// Status is reachable (every path answered), unreachable (one did
	// not) or unknown (one is not probed yet).
	Status string `json:"status"`
	// Paths are the node's address (type node, ICMP) and its health
	// endpoint (type endpoint, ICMP and HTTP).
	Paths []NodePathHealth `json:"paths"`
}

// NodePathHealth is the last probe of one path to another node.
type NodePathHealth struct {
	Type      string `json:"type"`
	Protocol  string `json:"protocol"`
	IP        string `json:"ip"`
	Probed    bool   `json:"probed"`
	Reachable bool   `json:"reachable"`
	Error     string `json:"error,omitempty"`
	// Latency is the duration of the last successful probe.
	Latency       time.Duration `json:"latency-ns,omitempty"`
	LastProbed    *time.Time    `json:"last-probed,omitempty"`
	LastReachable *time.Time    `json:"last-reachable,omitempty"`
}

// HealthProbe is the last probe of one health responder.
type HealthProbe struct {
	// Name says what was probed: "health-endpoint" is this node's.
	Name string `json:"name"`
	// IP is the address probed ("" while there is none).
	IP        string `json:"ip,omitempty"`
	Reachable bool   `json:"reachable"`
	// Error says why it is not reachable.
	Error string `json:"error,omitempty"`
	// Latency is the duration of the last successful probe.
	Latency       time.Duration `json:"latency-ns,omitempty"`
	LastProbed    time.Time     `json:"last-probed"`
	LastReachable *time.Time    `json:"last-reachable,omitempty"`
}

// HealthStateOK is Health.State of an agent without degraded modules.
const HealthStateOK = "Ok"

// ModuleHealth is the health of one module (or part) of the agent.
type ModuleHealth struct {
	ID      string    `json:"id"`
	Module  string    `json:"module"`
	Level   string    `json:"level"`
	Message string    `json:"message,omitempty"`
	Error   string    `json:"error,omitempty"`
	Since   time.Time `json:"since"`
}

// TableInfo is one row of GET /v1/statedb: one of the agent's tables.
type TableInfo struct {
	Name        string   `json:"name"`
	Objects     int      `json:"objects"`
	Initialized bool     `json:"initialized"`
	Pending     []string `json:"pendingInitializers,omitempty"`
	Indexes     []string `json:"indexes"`
}
