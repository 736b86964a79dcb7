package v2

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// CiliumLoadBalancerIPPool is a set of addresses the operator hands out to
// Services of type LoadBalancer (LB IPAM): each selected Service gets one
// in status.loadBalancer.ingress. Pools are cluster-wide; the operator
// reports in status.conditions how many addresses a pool has, and whether
// it overlaps another pool.
//
// +genclient
// +genclient:nonNamespaced
// +kubebuilder:object:root=true
// +kubebuilder:resource:path=ciliumloadbalancerippools,singular=ciliumloadbalancerippool,scope=Cluster,shortName={ippools,ippool,lbippool,lbippools},categories={cilium}
// +kubebuilder:printcolumn:name="Disabled",type=boolean,JSONPath=`.spec.disabled`
// +kubebuilder:printcolumn:name="Conflicting",type=string,JSONPath=`.status.conditions[?(@.type=="cilium.io/PoolConflict")].status`
// +kubebuilder:printcolumn:name="IPs Available",type=string,JSONPath=`.status.conditions[?(@.type=="cilium.io/IPsAvailable")].message`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:subresource:status
// +kubebuilder:storageversion
type CiliumLoadBalancerIPPool struct {
	metav1.TypeMeta `json:",inline"`
	// +kubebuilder:validation:Required
	metav1.ObjectMeta `json:"metadata"`

	// Spec is the pool's addresses and which Services may use them.
	//
	// +kubebuilder:validation:Required
	Spec CiliumLoadBalancerIPPoolSpec `json:"spec,omitempty"`

	// Status is what the operator observed: address counts and conflicts,
	// as conditions.
	//
	// +kubebuilder:validation:Optional
	Status CiliumLoadBalancerIPPoolStatus `json:"status,omitempty"`
}

// CiliumLoadBalancerIPPoolList is a list of CiliumLoadBalancerIPPool objects.
//
// +kubebuilder:object:root=true
type CiliumLoadBalancerIPPoolList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata"`

	// Items are the pools.
	Items []CiliumLoadBalancerIPPool `json:"items"`
}

// CiliumLoadBalancerIPPoolSpec is the addresses of a pool and the Services
// that may get them.
type CiliumLoadBalancerIPPoolSpec struct {
	// ServiceSelector selects the Services that may get addresses from
	// this pool; unset selects every Service. Besides a Service's own
	// labels it can match io.kubernetes.service.name and
	// io.kubernetes.service.namespace.
	//
	// +kubebuilder:validation:Optional
	ServiceSelector *metav1.LabelSelector `json:"serviceSelector,omitempty"`
	// AllowFirstLastIPs, "Yes" or unset, lets the first and last address
	// of each CIDR block be handed out; "No" reserves them. It does not
	// apply to /31 and /32 blocks, nor to start/stop blocks.
	//
	// +kubebuilder:validation:Optional
	AllowFirstLastIPs AllowFirstLastIPType `json:"allowFirstLastIPs,omitempty"`
	// Blocks are the pool's addresses: CIDRs or start/stop ranges.
	//
	// +kubebuilder:validation:Optional
	Blocks []CiliumLoadBalancerIPPoolIPBlock `json:"blocks,omitempty"`
	// Disabled, if true, stops new allocations from this pool; the
	// addresses Services already have stay theirs.
	//
	// +kubebuilder:validation:Optional
	// +kubebuilder:default=false
	Disabled bool `json:"disabled,omitempty"`
}

// AllowFirstLastIPType is "Yes" or "No".
//
// +kubebuilder:validation:Enum=Yes;No
type AllowFirstLastIPType string

// The values of AllowFirstLastIPType.
const (
	AllowFirstLastIPNo  AllowFirstLastIPType = "No"
	AllowFirstLastIPYes AllowFirstLastIPType = "Yes"
)

// IPv4orIPv6CIDR is a CIDR, such as 192.0.2.0/24 or 2001:db8::/64.
//
// +kubebuilder:validation:Format=cidr
type IPv4orIPv6CIDR string

// CiliumLoadBalancerIPPoolIPBlock is one block of a pool: a CIDR, or the
// addresses from Start to Stop inclusive (Start alone is one address).
type CiliumLoadBalancerIPPoolIPBlock struct {
	// +kubebuilder:validation:Optional
	Cidr IPv4orIPv6CIDR `json:"cidr,omitempty"`
	// +kubebuilder:validation:Optional
	Start string `json:"start,omitempty"`
	// +kubebuilder:validation:Optional
	Stop string `json:"stop,omitempty"`
}

// CiliumLoadBalancerIPPoolStatus is the operator's view of a pool.
type CiliumLoadBalancerIPPoolStatus struct {
	// Conditions are cilium.io/IPsTotal, cilium.io/IPsAvailable and
	// cilium.io/IPsUsed (the count in the message), cilium.io/PoolConflict
	// and cellium's cilium.io/PodCIDRConflict.
	//
	// +kubebuilder:validation:Optional
	// +patchMergeKey=type
	// +patchStrategy=merge
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty" patchStrategy:"merge" patchMergeKey:"type"`
}

// LB IPAM's condition types, reasons and annotations (Cilium's names).
const (
	// PoolIPsTotalCondition's message is the number of addresses of a pool.
	PoolIPsTotalCondition = "cilium.io/IPsTotal"
	// PoolIPsAvailableCondition's message is the number still free.
	PoolIPsAvailableCondition = "cilium.io/IPsAvailable"
	// PoolIPsUsedCondition's message is the number handed out.
	PoolIPsUsedCondition = "cilium.io/IPsUsed"
	// PoolConflictCondition is True on a pool that overlaps an older pool
	// (or itself); nothing is allocated from it until that is resolved.
	PoolConflictCondition = "cilium.io/PoolConflict"
	// PoolPodCIDRConflictCondition is True on a pool whose addresses
	// overlap a node's pod CIDR; the overlapping addresses are not handed
	// out. A cellium addition: Cilium does not check pod CIDRs.
	PoolPodCIDRConflictCondition = "cilium.io/PodCIDRConflict"
	// ServiceRequestSatisfiedCondition is set on the Services LB IPAM is
	// responsible for: True when they have their addresses, else False
	// with a reason (no_pool, out_of_ips, already_allocated,
	// already_allocated_incompatible_service, pool_selector_mismatch).
	ServiceRequestSatisfiedCondition = "cilium.io/IPAMRequestSatisfied"

	// LBIPAMIPsAnnotation requests specific addresses, separated by
	// commas; spec.loadBalancerIP is honoured too.
	LBIPAMIPsAnnotation = "lbipam.cilium.io/ips"
	// LBIPAMIPsAnnotationAlias is the older name of LBIPAMIPsAnnotation.
	LBIPAMIPsAnnotationAlias = "io.cilium/lb-ipam-ips"
	// LBIPAMSharingKeyAnnotation lets Services with the same key share an
	// address when their ports do not clash.
	LBIPAMSharingKeyAnnotation = "lbipam.cilium.io/sharing-key"
	// LBIPAMSharingKeyAnnotationAlias is the older name of
	// LBIPAMSharingKeyAnnotation.
	LBIPAMSharingKeyAnnotationAlias = "io.cilium/lb-ipam-sharing-key"
	// LBIPAMSharingCrossNamespaceAnnotation lists the other namespaces
	// (or "*") whose Services may share this Service's address.
	LBIPAMSharingCrossNamespaceAnnotation = "lbipam.cilium.io/sharing-cross-namespace"
	// LBIPAMSharingCrossNamespaceAnnotationAlias is the older name of
	// LBIPAMSharingCrossNamespaceAnnotation.
	LBIPAMSharingCrossNamespaceAnnotationAlias = "io.cilium/lb-ipam-sharing-cross-namespace"

	// ServiceNameLabel and ServiceNamespaceLabel are the labels a pool's
	// serviceSelector can match besides a Service's own.
	ServiceNameLabel      = "io.kubernetes.service.name"
	ServiceNamespaceLabel = "io.kubernetes.service.namespace"
)
