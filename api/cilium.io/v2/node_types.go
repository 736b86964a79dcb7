package v2

import (
	"bytes"
	"encoding/json"
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// CiliumNode is a node as the networking layer sees it: its addresses, its
// encryption key, its health endpoint, and its share of pod addresses. It has
// the name of the Kubernetes node; the agent on that node writes the spec and
// the operator the IPAM parts.
//
// +genclient
// +genclient:nonNamespaced
// +kubebuilder:object:root=true
// +kubebuilder:resource:path=ciliumnodes,singular=ciliumnode,scope=Cluster,shortName={cn,ciliumn},categories={cilium}
// +kubebuilder:printcolumn:name="CiliumInternalIP",type=string,JSONPath=`.spec.addresses[?(@.type=="CiliumInternalIP")].ip`,description="Address of the node's cilium_host interface"
// +kubebuilder:printcolumn:name="InternalIP",type=string,JSONPath=`.spec.addresses[?(@.type=="InternalIP")].ip`,description="Internal address of the node"
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:subresource:status
// +kubebuilder:storageversion
type CiliumNode struct {
	metav1.TypeMeta `json:",inline"`
	// +kubebuilder:validation:Required
	metav1.ObjectMeta `json:"metadata"`

	// Spec is the node's configuration.
	Spec NodeSpec `json:"spec"`

	// Status is what the operator and agent observed.
	//
	// +kubebuilder:validation:Optional
	Status NodeStatus `json:"status,omitempty"`
}

// CiliumNodeList is a list of CiliumNode objects.
//
// +kubebuilder:object:root=true
type CiliumNodeList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata"`

	// Items are the nodes.
	Items []CiliumNode `json:"items"`
}

// NodeSpec is the configuration of a node. The struct-valued fields (health,
// ingress, encryption, the cloud sections, ipam) are always written, as `{}`
// when empty.
type NodeSpec struct {
	// InstanceID identifies the node to its infrastructure, such as a cloud
	// instance ID; it differs from the node name.
	//
	// +optional
	InstanceID string `json:"instance-id,omitempty"`

	// BootID is the boot ID of the node's kernel.
	//
	// +optional
	BootID string `json:"bootid,omitempty"`

	// Addresses are the node's addresses.
	//
	// +optional
	Addresses []NodeAddress `json:"addresses,omitempty"`

	// HealthAddressing holds the addresses of the node's health endpoint.
	//
	// +optional
	HealthAddressing HealthAddressingSpec `json:"health,omitempty"`

	// IngressAddressing holds the addresses of the node's Ingress listener.
	//
	// +optional
	IngressAddressing AddressPair `json:"ingress,omitempty"`

	// Encryption is the node's encryption key index.
	//
	// +optional
	Encryption EncryptionSpec `json:"encryption,omitempty"`

	// ENI is AWS ENI IPAM configuration, kept as given.
	//
	// +optional
	ENI CloudIPAMData `json:"eni,omitempty"`

	// Azure is Azure IPAM configuration, kept as given.
	//
	// +optional
	Azure CloudIPAMData `json:"azure,omitempty"`

	// AlibabaCloud is Alibaba Cloud IPAM configuration, kept as given.
	//
	// +optional
	AlibabaCloud CloudIPAMData `json:"alibaba-cloud,omitempty"`

	// IPAM is the node's address-management configuration.
	//
	// +optional
	IPAM IPAMSpec `json:"ipam,omitempty"`
}

// AddressType is the kind of a node address: Hostname, ExternalIP,
// InternalIP, ExternalDNS, InternalDNS or CiliumInternalIP.
type AddressType string

// The node address kinds.
const (
	NodeHostName         AddressType = "Hostname"
	NodeExternalIP       AddressType = "ExternalIP"
	NodeInternalIP       AddressType = "InternalIP"
	NodeExternalDNS      AddressType = "ExternalDNS"
	NodeInternalDNS      AddressType = "InternalDNS"
	NodeCiliumInternalIP AddressType = "CiliumInternalIP"
)

// NodeAddress is one address of a node.
type NodeAddress struct {
	// Type is the kind of address.
	//
	// +optional
	Type AddressType `json:"type,omitempty"`

	// IP is the address.
	//
	// +optional
	IP string `json:"ip,omitempty"`
}

// HealthAddressingSpec holds the addresses of a node's health endpoint.
type HealthAddressingSpec struct {
	// IPv4 address of the health endpoint.
	//
	// +optional
	IPv4 string `json:"ipv4,omitempty"`

	// IPv6 address of the health endpoint.
	//
	// +optional
	IPv6 string `json:"ipv6,omitempty"`
}

// CloudIPAMData is a cloud provider's section of a CiliumNode (eni, azure,
// alibaba-cloud). cellium does not manage cloud IPAM: it keeps the JSON as it
// found it and writes `{}` when there is none, as Cilium does for unused
// sections.
//
// +kubebuilder:validation:Type=object
// +kubebuilder:pruning:PreserveUnknownFields
type CloudIPAMData struct {
	// Raw is the section's JSON object; nil means empty.
	Raw []byte `json:"-"`
}

// MarshalJSON writes the kept object, or `{}` when there is none.
func (d CloudIPAMData) MarshalJSON() ([]byte, error) {
	if len(d.Raw) == 0 {
		return []byte("{}"), nil
	}
	return d.Raw, nil
}

// UnmarshalJSON keeps a JSON object (compacted); null and {} leave the
// section empty.
// Anything else than an object or null is an error.
func (d *CloudIPAMData) UnmarshalJSON(b []byte) error {
	t := bytes.TrimSpace(b)
	if bytes.Equal(t, []byte("null")) {
		d.Raw = nil
		return nil
	}
	if len(t) == 0 || t[0] != '{' || !json.Valid(t) {
		return fmt.Errorf("cloud IPAM section: want a JSON object, got %.40q", t)
	}
	var buf bytes.Buffer
	if err := json.Compact(&buf, t); err != nil {
		return fmt.Errorf("cloud IPAM section: %w", err)
	}
	if buf.String() == "{}" {
		d.Raw = nil
		return nil
	}
	d.Raw = buf.Bytes()
	return nil
}

// IPAMSpec is a node's address-management configuration. Which fields are
// used depends on the IPAM mode.
type IPAMSpec struct {
	// Pool holds IPv4 addresses handed to the node one by one (CRD-backed
	// and cloud IPAM modes), keyed by address.
	//
	// +optional
	Pool AllocationMap `json:"pool,omitempty"`

	// IPv6Pool is Pool for IPv6.
	//
	// +optional
	IPv6Pool AllocationMap `json:"ipv6-pool,omitempty"`

	// Pools holds the node's requests to and grants from named pools
	// (multi-pool mode). A struct, so it is always written.
	//
	// +optional
	Pools IPAMPoolSpec `json:"pools,omitempty"`

	// PodCIDRs are the prefixes the node hands pod addresses out of
	// (kubernetes and cluster-pool modes).
	//
	// +optional
	PodCIDRs []string `json:"podCIDRs,omitempty"`

	// MinAllocate is the number of addresses the node needs before it starts.
	//
	// +kubebuilder:validation:Minimum=0
	// +optional
	MinAllocate int `json:"min-allocate,omitempty"`

	// MaxAllocate caps the addresses given to the node.
	//
	// +kubebuilder:validation:Minimum=0
	// +optional
	MaxAllocate int `json:"max-allocate,omitempty"`

	// PreAllocate is the number of free addresses to keep ready.
	//
	// +kubebuilder:validation:Minimum=0
	// +optional
	PreAllocate int `json:"pre-allocate,omitempty"`

	// MaxAboveWatermark is how many addresses may be allocated beyond
	// PreAllocate in one go.
	//
	// +kubebuilder:validation:Minimum=0
	// +optional
	MaxAboveWatermark int `json:"max-above-watermark,omitempty"`

	// StaticIPTags are cloud tags selecting a static address for the node.
	//
	// +optional
	StaticIPTags map[string]string `json:"static-ip-tags,omitempty"`
}

// AllocationMap maps an address to what it is allocated to.
type AllocationMap map[string]AllocationIP

// AllocationIP is the owner of an address and the resource it belongs to.
type AllocationIP struct {
	// Owner is who uses the address (for example `namespace/pod`); empty
	// while it is free.
	//
	// +optional
	Owner string `json:"owner,omitempty"`

	// Resource is the infrastructure object the address belongs to, such as
	// an ENI ID.
	//
	// +optional
	Resource string `json:"resource,omitempty"`
}

// IPAMPoolSpec holds a node's multi-pool requests and allocations.
type IPAMPoolSpec struct {
	// Requested lists, per pool, how many addresses the agent needs.
	//
	// +optional
	Requested []IPAMPoolRequest `json:"requested,omitempty"`

	// Allocated lists, per pool, the prefixes the operator gave the node.
	//
	// +optional
	Allocated []IPAMPoolAllocation `json:"allocated,omitempty"`
}

// IPAMPoolRequest is the agent's demand on one pool.
type IPAMPoolRequest struct {
	// Pool is the pool's name.
	Pool string `json:"pool"`

	// Needed is the number of addresses wanted.
	//
	// +optional
	Needed IPAMPoolDemand `json:"needed,omitempty"`
}

// IPAMPoolDemand is a number of addresses per family.
type IPAMPoolDemand struct {
	// IPv4Addrs is the number of IPv4 addresses.
	//
	// +kubebuilder:validation:Minimum=0
	// +optional
	IPv4Addrs int `json:"ipv4-addrs,omitempty"`

	// IPv6Addrs is the number of IPv6 addresses.
	//
	// +kubebuilder:validation:Minimum=0
	// +optional
	IPv6Addrs int `json:"ipv6-addrs,omitempty"`
}

// IPAMPoolAllocation is what one pool gave a node.
type IPAMPoolAllocation struct {
	// Pool is the pool's name.
	Pool string `json:"pool"`

	// CIDRs are the prefixes given.
	//
	// +optional
	CIDRs []string `json:"cidrs,omitempty"`

	// AllowFirstIP lets the node use the first address of each prefix.
	//
	// +optional
	AllowFirstIP bool `json:"allowFirstIP,omitempty"`

	// AllowLastIP lets the node use the last address of each prefix.
	//
	// +optional
	AllowLastIP bool `json:"allowLastIP,omitempty"`
}

// NodeStatus is what was observed about a node's addresses.
type NodeStatus struct {
	// ENI is AWS ENI IPAM status, kept as given.
	//
	// +optional
	ENI CloudIPAMData `json:"eni,omitempty"`

	// Azure is Azure IPAM status, kept as given.
	//
	// +optional
	Azure CloudIPAMData `json:"azure,omitempty"`

	// AlibabaCloud is Alibaba Cloud IPAM status, kept as given.
	//
	// +optional
	AlibabaCloud CloudIPAMData `json:"alibaba-cloud,omitempty"`

	// IPAM is the address-management status.
	//
	// +optional
	IPAM IPAMStatus `json:"ipam,omitempty"`
}

// IPAMStatus is the address-management state of a node.
type IPAMStatus struct {
	// Used maps each IPv4 address in use to its owner.
	//
	// +optional
	Used AllocationMap `json:"used,omitempty"`

	// IPv6Used is Used for IPv6.
	//
	// +optional
	IPv6Used AllocationMap `json:"ipv6-used,omitempty"`

	// PodCIDRs maps each pod prefix of the node to its usage.
	//
	// +optional
	PodCIDRs PodCIDRMap `json:"pod-cidrs,omitempty"`

	// OperatorStatus is the operator's view of the node. A struct, so it is
	// always written.
	//
	// +optional
	OperatorStatus IPAMOperatorStatus `json:"operator-status,omitempty"`

	// ReleaseIPs tracks the hand-back of IPv4 addresses, keyed by address.
	//
	// +optional
	ReleaseIPs map[string]IPReleaseStatus `json:"release-ips,omitempty"`

	// ReleaseIPv6s is ReleaseIPs for IPv6.
	//
	// +optional
	ReleaseIPv6s map[string]IPReleaseStatus `json:"release-ipv6s,omitempty"`

	// AssignedStaticIP is the static address given to the node.
	//
	// +optional
	AssignedStaticIP string `json:"assigned-static-ip,omitempty"`
}

// PodCIDRMap maps a pod prefix to its usage.
type PodCIDRMap map[string]PodCIDRMapEntry

// PodCIDRMapEntry is the usage of one pod prefix.
type PodCIDRMapEntry struct {
	// Status is the prefix's usage.
	//
	// +optional
	Status PodCIDRStatus `json:"status,omitempty"`
}

// PodCIDRStatus is the usage of a pod prefix.
//
// +kubebuilder:validation:Enum=released;depleted;in-use
type PodCIDRStatus string

// The pod prefix usages.
const (
	PodCIDRStatusReleased PodCIDRStatus = "released"
	PodCIDRStatusDepleted PodCIDRStatus = "depleted"
	PodCIDRStatusInUse    PodCIDRStatus = "in-use"
)

// IPAMOperatorStatus is the operator's report about a node.
type IPAMOperatorStatus struct {
	// Error is the last error the operator hit for the node.
	//
	// +optional
	Error string `json:"error,omitempty"`
}

// IPReleaseStatus is a step of the hand-back of an address between agent and
// operator.
//
// +kubebuilder:validation:Enum=marked-for-release;ready-for-release;do-not-release;released
type IPReleaseStatus string

// The address hand-back steps.
const (
	IPAMMarkForRelease  IPReleaseStatus = "marked-for-release"
	IPAMReadyForRelease IPReleaseStatus = "ready-for-release"
	IPAMDoNotRelease    IPReleaseStatus = "do-not-release"
	IPAMReleased        IPReleaseStatus = "released"
)
