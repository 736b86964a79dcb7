package v2

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// GroupName is the API group of all Cilium resources.
const GroupName = "cilium.io"

// Version is the API version of this package.
const Version = "v2"

// SchemeGroupVersion is the group and version of the types in this package.
// Generated clients refer to it by this name; treat it as a constant.
var SchemeGroupVersion = schema.GroupVersion{Group: GroupName, Version: Version}

// Resource qualifies a resource name (plural, lower case) with this group.
func Resource(resource string) schema.GroupResource {
	return SchemeGroupVersion.WithResource(resource).GroupResource()
}

// Kind qualifies a kind name with this group.
func Kind(kind string) schema.GroupKind {
	return SchemeGroupVersion.WithKind(kind).GroupKind()
}

// AddToScheme registers the types of this package, and the meta types every
// API version needs, with s.
func AddToScheme(s *runtime.Scheme) error {
	s.AddKnownTypes(SchemeGroupVersion,
		&CiliumEndpoint{}, &CiliumEndpointList{},
		&CiliumIdentity{}, &CiliumIdentityList{},
		&CiliumNode{}, &CiliumNodeList{},
		&CiliumNetworkPolicy{}, &CiliumNetworkPolicyList{},
		&CiliumClusterwideNetworkPolicy{}, &CiliumClusterwideNetworkPolicyList{},
		&CiliumLoadBalancerIPPool{}, &CiliumLoadBalancerIPPoolList{},
	)
	metav1.AddToGroupVersion(s, SchemeGroupVersion)
	return nil
}
