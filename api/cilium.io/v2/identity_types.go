package v2

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// CiliumIdentity is one cluster-wide security identity. Its name is the
// identity's number in decimal and its only payload is the set of security
// labels the number stands for.
//
// The object's metadata labels are a copy of a few security labels (the
// pod's namespace) for `kubectl get -l`; they do not define the identity.
//
// +genclient
// +genclient:nonNamespaced
// +genclient:noStatus
// +kubebuilder:object:root=true
// +kubebuilder:resource:path=ciliumidentities,singular=ciliumidentity,scope=Cluster,shortName={ciliumid},categories={cilium}
// +kubebuilder:printcolumn:name="Namespace",type=string,JSONPath=`.metadata.labels.io\.kubernetes\.pod\.namespace`,description="Namespace of the pods with this identity"
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:subresource:status
// +kubebuilder:storageversion
type CiliumIdentity struct {
	metav1.TypeMeta `json:",inline"`
	// +kubebuilder:validation:Required
	metav1.ObjectMeta `json:"metadata"`

	// SecurityLabels are the labels the identity stands for, keyed with their
	// source, such as `k8s:app`.
	SecurityLabels map[string]string `json:"security-labels"`
}

// CiliumIdentityList is a list of CiliumIdentity objects.
//
// +kubebuilder:object:root=true
type CiliumIdentityList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata"`

	// Items are the identities.
	Items []CiliumIdentity `json:"items"`
}

// HeartbeatAnnotation is set by the operator on a CiliumIdentity it found
// unused, with the time (RFC 3339, nanoseconds) it did so. An agent that
// starts using the identity again removes it.
const HeartbeatAnnotation = "io.cilium.heartbeat"
