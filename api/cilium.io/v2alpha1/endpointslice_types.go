package v2alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	v2 "github.com/cellium/cellium/api/cilium.io/v2"
)

// CiliumEndpointSlice groups the essentials of several CiliumEndpoints of one
// namespace, so that agents watch a few slices instead of every endpoint. The
// object is cluster-scoped even though its endpoints share a namespace, which
// is given by the Namespace field.
//
// +genclient
// +genclient:nonNamespaced
// +genclient:noStatus
// +kubebuilder:object:root=true
// +kubebuilder:resource:path=ciliumendpointslices,singular=ciliumendpointslice,scope=Cluster,shortName={ces},categories={cilium}
// +kubebuilder:storageversion
type CiliumEndpointSlice struct {
	metav1.TypeMeta `json:",inline"`
	// +kubebuilder:validation:Required
	metav1.ObjectMeta `json:"metadata"`

	// Namespace is the namespace of every endpoint in the slice.
	//
	// +optional
	Namespace string `json:"namespace,omitempty"`

	// Endpoints are the endpoints in the slice.
	Endpoints []CoreCiliumEndpoint `json:"endpoints"`
}

// CiliumEndpointSliceList is a list of CiliumEndpointSlice objects.
//
// +kubebuilder:object:root=true
type CiliumEndpointSliceList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata"`

	// Items are the slices.
	Items []CiliumEndpointSlice `json:"items"`
}

// CoreCiliumEndpoint is the part of a CiliumEndpoint that other nodes need:
// name, security identity, addresses, encryption key and named ports.
type CoreCiliumEndpoint struct {
	// Name is the CiliumEndpoint's (and the pod's) name.
	//
	// +optional
	Name string `json:"name,omitempty"`

	// IdentityID is the endpoint's security identity (not its endpoint ID).
	//
	// +optional
	IdentityID int64 `json:"id,omitempty"`

	// PodUID is the UID of the pod that owns the CiliumEndpoint.
	//
	// +optional
	PodUID types.UID `json:"pod-uid,omitempty"`

	// Networking holds the endpoint's addresses and node.
	//
	// +optional
	Networking *v2.EndpointNetworking `json:"networking,omitempty"`

	// Encryption is the endpoint's encryption key index. A struct, so it is
	// always written.
	//
	// +optional
	Encryption v2.EncryptionSpec `json:"encryption,omitempty"`

	// NamedPorts are the pod's named ports.
	//
	// +optional
	NamedPorts v2.NamedPorts `json:"named-ports,omitempty"`

	// ServiceAccount is the pod's service account name.
	//
	// +optional
	ServiceAccount string `json:"service-account,omitempty"`
}
