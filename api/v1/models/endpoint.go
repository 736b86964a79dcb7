package models

// The endpoint status types below have the JSON of the CiliumEndpoint's
// .status (api/cilium.io/v2 EndpointStatus), field for field, so that
// `cellium endpoint get -o json` prints the CEP's .status. They are
// declared here, not imported, so that clients of the API (the CNI plugin,
// the CLI) do not link the Kubernetes libraries; the agent converts.

// EndpointStatus is the observable state of an endpoint: the .status of
// GET /v1/endpoint/{id}, equal to the pod's CiliumEndpoint .status.
// Controllers and Policy are not filled by the agent today.
type EndpointStatus struct {
	// ID is the endpoint's ID, unique on its node only.
	ID int64 `json:"id,omitempty"`

	// Controllers lists the agent's background tasks for the endpoint that
	// are failing. Not filled any more.
	Controllers ControllerList `json:"controllers,omitempty"`

	// ExternalIdentifiers identify the endpoint outside the agent: pod and
	// container runtime IDs.
	ExternalIdentifiers *EndpointIdentifiers `json:"external-identifiers,omitempty"`

	// Health summarises the endpoint's health.
	Health *EndpointHealth `json:"health,omitempty"`

	// Identity is the endpoint's security identity.
	Identity *EndpointIdentity `json:"identity,omitempty"`

	// Log holds the last few status changes of the endpoint.
	Log []*EndpointStatusChange `json:"log,omitempty"`

	// Networking holds the endpoint's addresses and node.
	Networking *EndpointNetworking `json:"networking,omitempty"`

	// Encryption is the node's encryption key index at the time of writing.
	// A struct, so it is always written, as `{}` when encryption is off.
	Encryption EncryptionSpec `json:"encryption,omitempty"`

	// Policy lists the peers the endpoint's policy allows and denies. Not
	// filled any more.
	Policy *EndpointPolicy `json:"policy,omitempty"`

	// State is the endpoint's lifecycle state.
	State EndpointState `json:"state,omitempty"`

	// NamedPorts are the pod's named container ports, for policies that name
	// ports.
	NamedPorts NamedPorts `json:"named-ports,omitempty"`

	// ServiceAccount is the pod's service account name.
	ServiceAccount string `json:"service-account,omitempty"`
}

// EndpointState is the lifecycle state of an endpoint.
type EndpointState string

// The endpoint states. The agent reports restoring, waiting-to-regenerate,
// regenerating, disconnecting and disconnected as ready in a CiliumEndpoint.
const (
	EndpointStateCreating            EndpointState = "creating"
	EndpointStateWaitingForIdentity  EndpointState = "waiting-for-identity"
	EndpointStateNotReady            EndpointState = "not-ready"
	EndpointStateWaitingToRegenerate EndpointState = "waiting-to-regenerate"
	EndpointStateRegenerating        EndpointState = "regenerating"
	EndpointStateRestoring           EndpointState = "restoring"
	EndpointStateReady               EndpointState = "ready"
	EndpointStateDisconnecting       EndpointState = "disconnecting"
	EndpointStateDisconnected        EndpointState = "disconnected"
	EndpointStateInvalid             EndpointState = "invalid"
)

// EndpointIdentifiers are the names other systems know an endpoint by.
type EndpointIdentifiers struct {
	// CNIAttachmentID is the runtime's ID for the CNI attachment.
	CNIAttachmentID string `json:"cni-attachment-id,omitempty"`

	// ContainerID is the ID the container runtime gave the pod sandbox.
	ContainerID string `json:"container-id,omitempty"`

	// ContainerName is the name the runtime gave the container.
	ContainerName string `json:"container-name,omitempty"`

	// DockerEndpointID is the Docker libnetwork endpoint ID.
	DockerEndpointID string `json:"docker-endpoint-id,omitempty"`

	// DockerNetworkID is the Docker libnetwork network ID.
	DockerNetworkID string `json:"docker-network-id,omitempty"`

	// PodName is the pod, as `namespace/name`.
	PodName string `json:"pod-name,omitempty"`
}

// EndpointHealthStatus is the health of one aspect of an endpoint: one of
// OK, Bootstrap, Pending, Warning, Failure, Disabled.
type EndpointHealthStatus string

// The endpoint health values.
const (
	EndpointHealthOK        EndpointHealthStatus = "OK"
	EndpointHealthBootstrap EndpointHealthStatus = "Bootstrap"
	EndpointHealthPending   EndpointHealthStatus = "Pending"
	EndpointHealthWarning   EndpointHealthStatus = "Warning"
	EndpointHealthFailure   EndpointHealthStatus = "Failure"
	EndpointHealthDisabled  EndpointHealthStatus = "Disabled"
)

// EndpointHealth is the health of an endpoint and of its parts.
type EndpointHealth struct {
	// Bpf is the health of the endpoint's datapath programs.
	Bpf EndpointHealthStatus `json:"bpf,omitempty"`

	// Connected tells whether the endpoint is reachable.
	Connected bool `json:"connected,omitempty"`

	// OverallHealth sums up the other fields.
	OverallHealth EndpointHealthStatus `json:"overallHealth,omitempty"`

	// Policy is the health of the endpoint's policy.
	Policy EndpointHealthStatus `json:"policy,omitempty"`
}

// EndpointIdentity is the security identity of an endpoint.
type EndpointIdentity struct {
	// ID is the numeric identity.
	ID int64 `json:"id,omitempty"`

	// Labels are the identity's labels, sorted, each `source:key=value`.
	Labels []string `json:"labels,omitempty"`
}

// EndpointStatusChange is one entry of an endpoint's status log.
type EndpointStatusChange struct {
	// Code is ok or failed.
	Code string `json:"code,omitempty"`

	// Message describes the change.
	Message string `json:"message,omitempty"`

	// State is the endpoint state at the time.
	State string `json:"state,omitempty"`

	// Timestamp is when the change happened.
	Timestamp string `json:"timestamp,omitempty"`
}

// ControllerList is a list of controller statuses.
type ControllerList []ControllerStatus

// ControllerStatus describes one background task of the agent.
type ControllerStatus struct {
	// Configuration is how the task runs.
	Configuration *ControllerConfiguration `json:"configuration,omitempty"`

	// Name of the task.
	Name string `json:"name,omitempty"`

	// Status counts the task's runs.
	Status *ControllerStatusStatus `json:"status,omitempty"`

	// UUID of the task.
	UUID string `json:"uuid,omitempty"`
}

// ControllerConfiguration is the schedule of a background task.
type ControllerConfiguration struct {
	// ErrorRetry tells whether the task is retried after an error.
	ErrorRetry bool `json:"error-retry,omitempty"`

	// ErrorRetryBase is the base back-off after an error, in nanoseconds.
	ErrorRetryBase int64 `json:"error-retry-base,omitempty"`

	// Interval is the time between regular runs, in nanoseconds.
	Interval int64 `json:"interval,omitempty"`
}

// ControllerStatusStatus counts the runs of a background task.
type ControllerStatusStatus struct {
	// ConsecutiveFailureCount is the number of failures since the last
	// success.
	ConsecutiveFailureCount int64 `json:"consecutive-failure-count,omitempty"`

	// FailureCount is the total number of failures.
	FailureCount int64 `json:"failure-count,omitempty"`

	// LastFailureMsg is the error of the last failure.
	LastFailureMsg string `json:"last-failure-msg,omitempty"`

	// LastFailureTimestamp is when the task last failed.
	LastFailureTimestamp string `json:"last-failure-timestamp,omitempty"`

	// LastSuccessTimestamp is when the task last succeeded.
	LastSuccessTimestamp string `json:"last-success-timestamp,omitempty"`

	// SuccessCount is the total number of successes.
	SuccessCount int64 `json:"success-count,omitempty"`
}

// EndpointNetworking holds an endpoint's addresses and the node it runs on.
type EndpointNetworking struct {
	// Addressing lists the endpoint's address pairs, sorted by IPv4 then IPv6.
	Addressing AddressPairList `json:"addressing"`

	// NodeIP is the address of the endpoint's node, reachable from other
	// nodes.
	NodeIP string `json:"node,omitempty"`
}

// AddressPair is an IPv4 and/or an IPv6 address.
type AddressPair struct {
	// IPV4 is the IPv4 address.
	IPV4 string `json:"ipv4,omitempty"`

	// IPV6 is the IPv6 address.
	IPV6 string `json:"ipv6,omitempty"`
}

// AddressPairList is a list of address pairs.
type AddressPairList []*AddressPair

// EncryptionSpec is the transparent-encryption state of a node or endpoint.
type EncryptionSpec struct {
	// Key is the index of the encryption key in use, or 0 when encryption is
	// off.
	Key int `json:"key,omitempty"`
}

// NamedPorts is a list of named L4 ports.
type NamedPorts []*Port

// Port is a named L4 port of a pod.
type Port struct {
	// Name of the port.
	Name string `json:"name,omitempty"`

	// Port number.
	Port uint16 `json:"port,omitempty"`

	// Protocol: TCP, UDP, SCTP or ANY.
	Protocol string `json:"protocol,omitempty"`
}

// EndpointPolicy lists, per direction, the peers an endpoint's policy allows
// and denies.
type EndpointPolicy struct {
	// Ingress is the policy for received traffic.
	Ingress *EndpointPolicyDirection `json:"ingress,omitempty"`

	// Egress is the policy for sent traffic.
	Egress *EndpointPolicyDirection `json:"egress,omitempty"`
}

// EndpointPolicyState is the enforcement mode of one direction: enforcing,
// non-enforcing or disabled.
type EndpointPolicyState string

// The enforcement modes.
const (
	EndpointPolicyStateEnforcing    EndpointPolicyState = "enforcing"
	EndpointPolicyStateNonEnforcing EndpointPolicyState = "non-enforcing"
	EndpointPolicyStateDisabled     EndpointPolicyState = "disabled"
)

// EndpointPolicyDirection is the policy of an endpoint in one direction.
type EndpointPolicyDirection struct {
	// Enforcing tells whether policy is enforced in this direction. Always
	// written, even when false.
	Enforcing bool `json:"enforcing"`

	// Allowed are the peers allowed.
	Allowed AllowedIdentityList `json:"allowed,omitempty"`

	// Denied are the peers denied.
	Denied DenyIdentityList `json:"denied,omitempty"`

	// Removing is deprecated.
	Removing AllowedIdentityList `json:"removing,omitempty"`

	// Adding is deprecated.
	Adding AllowedIdentityList `json:"adding,omitempty"`

	// State is the enforcement mode.
	State EndpointPolicyState `json:"state,omitempty"`
}

// AllowedIdentityList is a list of allowed peers, sorted by identity, then
// port, then protocol.
type AllowedIdentityList []IdentityTuple

// DenyIdentityList is a list of denied peers, sorted like AllowedIdentityList.
type DenyIdentityList []IdentityTuple

// IdentityTuple is a peer identity with a destination port and protocol.
type IdentityTuple struct {
	// Identity is the peer's numeric identity.
	Identity uint64 `json:"identity,omitempty"`

	// IdentityLabels are the peer identity's labels.
	IdentityLabels map[string]string `json:"identity-labels,omitempty"`

	// DestPort is the destination port; 0 means any.
	DestPort uint16 `json:"dest-port,omitempty"`

	// Protocol is the IP protocol number; 0 means any.
	Protocol uint8 `json:"protocol,omitempty"`
}
