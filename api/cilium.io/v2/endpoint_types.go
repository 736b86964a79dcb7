package v2

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// CiliumEndpoint mirrors one pod's endpoint, as seen by the agent on the
// pod's node, into the API server. It has the pod's name and namespace and
// only a status: the agent writes the whole object, there is no spec and no
// status subresource.
//
// +genclient
// +genclient:noStatus
// +kubebuilder:object:root=true
// +kubebuilder:resource:path=ciliumendpoints,singular=ciliumendpoint,scope=Namespaced,shortName={cep,ciliumep},categories={cilium}
// +kubebuilder:printcolumn:name="Security Identity",type=integer,JSONPath=`.status.identity.id`,description="Numeric security identity of the endpoint"
// +kubebuilder:printcolumn:name="Ingress Enforcement",type=string,JSONPath=`.status.policy.ingress.state`,priority=1,description="Whether ingress policy is enforced"
// +kubebuilder:printcolumn:name="Egress Enforcement",type=string,JSONPath=`.status.policy.egress.state`,priority=1,description="Whether egress policy is enforced"
// +kubebuilder:printcolumn:name="Endpoint State",type=string,JSONPath=`.status.state`,description="Lifecycle state of the endpoint"
// +kubebuilder:printcolumn:name="IPv4",type=string,JSONPath=`.status.networking.addressing[0].ipv4`,description="First IPv4 address of the endpoint"
// +kubebuilder:printcolumn:name="IPv6",type=string,JSONPath=`.status.networking.addressing[0].ipv6`,description="First IPv6 address of the endpoint"
// +kubebuilder:storageversion
type CiliumEndpoint struct {
	metav1.TypeMeta `json:",inline"`
	// +kubebuilder:validation:Required
	metav1.ObjectMeta `json:"metadata"`

	// Status is the endpoint as the agent last saw it.
	//
	// +kubebuilder:validation:Optional
	Status EndpointStatus `json:"status,omitempty"`
}

// CiliumEndpointList is a list of CiliumEndpoint objects.
//
// +kubebuilder:object:root=true
type CiliumEndpointList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata"`

	// Items are the endpoints.
	Items []CiliumEndpoint `json:"items"`
}

// EndpointStatus is the observable state of an endpoint. Recent Cilium fills
// only id, external-identifiers, identity, networking, state, encryption,
// named-ports and service-account; cellium also fills health, log and
// policy. Controllers is kept so that objects carrying it still decode.
type EndpointStatus struct {
	// ID is the endpoint's ID, unique on its node only.
	//
	// +optional
	ID int64 `json:"id,omitempty"`

	// Controllers lists the agent's background tasks for the endpoint that
	// are failing. Not filled any more.
	//
	// +optional
	Controllers ControllerList `json:"controllers,omitempty"`

	// ExternalIdentifiers identify the endpoint outside the agent: pod and
	// container runtime IDs.
	//
	// +optional
	ExternalIdentifiers *EndpointIdentifiers `json:"external-identifiers,omitempty"`

	// Health summarises the endpoint's health.
	//
	// +optional
	Health *EndpointHealth `json:"health,omitempty"`

	// Identity is the endpoint's security identity.
	//
	// +optional
	Identity *EndpointIdentity `json:"identity,omitempty"`

	// Log holds the last few status changes of the endpoint.
	//
	// +optional
	Log []*EndpointStatusChange `json:"log,omitempty"`

	// Networking holds the endpoint's addresses and node.
	//
	// +optional
	Networking *EndpointNetworking `json:"networking,omitempty"`

	// Encryption is the node's encryption key index at the time of writing.
	// A struct, so it is always written, as `{}` when encryption is off.
	//
	// +optional
	Encryption EncryptionSpec `json:"encryption,omitempty"`

	// Policy lists, per direction, whether the endpoint's policy is enforced
	// and the peers it allows and denies.
	//
	// +optional
	Policy *EndpointPolicy `json:"policy,omitempty"`

	// State is the endpoint's lifecycle state.
	//
	// +optional
	State EndpointState `json:"state,omitempty"`

	// NamedPorts are the pod's named container ports, for policies that name
	// ports.
	//
	// +optional
	NamedPorts NamedPorts `json:"named-ports,omitempty"`

	// ServiceAccount is the pod's service account name.
	//
	// +optional
	ServiceAccount string `json:"service-account,omitempty"`
}

// EndpointState is the lifecycle state of an endpoint.
//
// +kubebuilder:validation:Enum=creating;waiting-for-identity;not-ready;waiting-to-regenerate;regenerating;restoring;ready;disconnecting;disconnected;invalid
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
	//
	// +optional
	CNIAttachmentID string `json:"cni-attachment-id,omitempty"`

	// ContainerID is the ID the container runtime gave the pod sandbox.
	//
	// +optional
	ContainerID string `json:"container-id,omitempty"`

	// ContainerName is the name the runtime gave the container.
	//
	// +optional
	ContainerName string `json:"container-name,omitempty"`

	// DockerEndpointID is the Docker libnetwork endpoint ID.
	//
	// +optional
	DockerEndpointID string `json:"docker-endpoint-id,omitempty"`

	// DockerNetworkID is the Docker libnetwork network ID.
	//
	// +optional
	DockerNetworkID string `json:"docker-network-id,omitempty"`

	// PodName is the pod, as `namespace/name`.
	//
	// +optional
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
	//
	// +optional
	Bpf EndpointHealthStatus `json:"bpf,omitempty"`

	// Connected tells whether the endpoint is reachable.
	//
	// +optional
	Connected bool `json:"connected,omitempty"`

	// OverallHealth sums up the other fields.
	//
	// +optional
	OverallHealth EndpointHealthStatus `json:"overallHealth,omitempty"`

	// Policy is the health of the endpoint's policy.
	//
	// +optional
	Policy EndpointHealthStatus `json:"policy,omitempty"`
}

// EndpointIdentity is the security identity of an endpoint.
type EndpointIdentity struct {
	// ID is the numeric identity.
	//
	// +optional
	ID int64 `json:"id,omitempty"`

	// Labels are the identity's labels, sorted, each `source:key=value`.
	//
	// +optional
	Labels []string `json:"labels,omitempty"`
}

// EndpointStatusChange is one entry of an endpoint's status log.
type EndpointStatusChange struct {
	// Code is ok or failed.
	//
	// +optional
	Code string `json:"code,omitempty"`

	// Message describes the change.
	//
	// +optional
	Message string `json:"message,omitempty"`

	// State is the endpoint state at the time.
	//
	// +optional
	State string `json:"state,omitempty"`

	// Timestamp is when the change happened.
	//
	// +optional
	Timestamp string `json:"timestamp,omitempty"`
}

// ControllerList is a list of controller statuses.
type ControllerList []ControllerStatus

// ControllerStatus describes one background task of the agent.
type ControllerStatus struct {
	// Configuration is how the task runs.
	//
	// +optional
	Configuration *ControllerConfiguration `json:"configuration,omitempty"`

	// Name of the task.
	//
	// +optional
	Name string `json:"name,omitempty"`

	// Status counts the task's runs.
	//
	// +optional
	Status *ControllerStatusStatus `json:"status,omitempty"`

	// UUID of the task.
	//
	// +optional
	UUID string `json:"uuid,omitempty"`
}

// ControllerConfiguration is the schedule of a background task.
type ControllerConfiguration struct {
	// ErrorRetry tells whether the task is retried after an error.
	//
	// +optional
	ErrorRetry bool `json:"error-retry,omitempty"`

	// ErrorRetryBase is the base back-off after an error, in nanoseconds.
	//
	// +optional
	ErrorRetryBase int64 `json:"error-retry-base,omitempty"`

	// Interval is the time between regular runs, in nanoseconds.
	//
	// +optional
	Interval int64 `json:"interval,omitempty"`
}

// ControllerStatusStatus counts the runs of a background task.
type ControllerStatusStatus struct {
	// ConsecutiveFailureCount is the number of failures since the last
	// success.
	//
	// +optional
	ConsecutiveFailureCount int64 `json:"consecutive-failure-count,omitempty"`

	// FailureCount is the total number of failures.
	//
	// +optional
	FailureCount int64 `json:"failure-count,omitempty"`

	// LastFailureMsg is the error of the last failure.
	//
	// +optional
	LastFailureMsg string `json:"last-failure-msg,omitempty"`

	// LastFailureTimestamp is when the task last failed.
	//
	// +optional
	LastFailureTimestamp string `json:"last-failure-timestamp,omitempty"`

	// LastSuccessTimestamp is when the task last succeeded.
	//
	// +optional
	LastSuccessTimestamp string `json:"last-success-timestamp,omitempty"`

	// SuccessCount is the total number of successes.
	//
	// +optional
	SuccessCount int64 `json:"success-count,omitempty"`
}

// EndpointNetworking holds an endpoint's addresses and the node it runs on.
type EndpointNetworking struct {
	// Addressing lists the endpoint's address pairs, sorted by IPv4 then IPv6.
	Addressing AddressPairList `json:"addressing"`

	// NodeIP is the address of the endpoint's node, reachable from other
	// nodes.
	//
	// +optional
	NodeIP string `json:"node,omitempty"`
}

// AddressPair is an IPv4 and/or an IPv6 address.
type AddressPair struct {
	// IPV4 is the IPv4 address.
	//
	// +optional
	IPV4 string `json:"ipv4,omitempty"`

	// IPV6 is the IPv6 address.
	//
	// +optional
	IPV6 string `json:"ipv6,omitempty"`
}

// AddressPairList is a list of address pairs.
type AddressPairList []*AddressPair

// EncryptionSpec is the transparent-encryption state of a node or endpoint.
type EncryptionSpec struct {
	// Key is the index of the encryption key in use, or 0 when encryption is
	// off.
	//
	// +optional
	Key int `json:"key,omitempty"`
}

// NamedPorts is a list of named L4 ports.
type NamedPorts []*Port

// Port is a named L4 port of a pod.
type Port struct {
	// Name of the port.
	//
	// +optional
	Name string `json:"name,omitempty"`

	// Port number.
	//
	// +optional
	Port uint16 `json:"port,omitempty"`

	// Protocol: TCP, UDP, SCTP or ANY.
	//
	// +optional
	Protocol string `json:"protocol,omitempty"`
}

// EndpointPolicy lists, per direction, the peers an endpoint's policy allows
// and denies.
type EndpointPolicy struct {
	// Ingress is the policy for received traffic.
	//
	// +optional
	Ingress *EndpointPolicyDirection `json:"ingress,omitempty"`

	// Egress is the policy for sent traffic.
	//
	// +optional
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
	//
	// +optional
	Allowed AllowedIdentityList `json:"allowed,omitempty"`

	// Denied are the peers denied.
	//
	// +optional
	Denied DenyIdentityList `json:"denied,omitempty"`

	// Removing is deprecated.
	//
	// +optional
	Removing AllowedIdentityList `json:"removing,omitempty"`

	// Adding is deprecated.
	//
	// +optional
	Adding AllowedIdentityList `json:"adding,omitempty"`

	// State is the enforcement mode.
	//
	// +kubebuilder:validation:Enum=enforcing;non-enforcing;disabled
	// +optional
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
	//
	// +optional
	Identity uint64 `json:"identity,omitempty"`

	// IdentityLabels are the peer identity's labels.
	//
	// +optional
	IdentityLabels map[string]string `json:"identity-labels,omitempty"`

	// DestPort is the destination port; 0 means any.
	//
	// +optional
	DestPort uint16 `json:"dest-port,omitempty"`

	// Protocol is the IP protocol number; 0 means any.
	//
	// +optional
	Protocol uint8 `json:"protocol,omitempty"`
}
