package v2

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cellium/cellium/api/policy"
)

// CiliumNetworkPolicy is a namespaced network policy in Cilium's rule
// language. It holds one rule in Spec, a list in Specs, or both; every rule
// applies only to endpoints of the policy's namespace.
//
// +genclient
// +kubebuilder:object:root=true
// +kubebuilder:resource:path=ciliumnetworkpolicies,singular=ciliumnetworkpolicy,scope=Namespaced,shortName={cnp,ciliumnp},categories={cilium,ciliumpolicy}
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:printcolumn:name="Valid",type=string,JSONPath=`.status.conditions[?(@.type=='Valid')].status`,description="Whether the policy passed validation"
// +kubebuilder:subresource:status
// +kubebuilder:storageversion
// +kubebuilder:validation:XValidation:rule="has(self.spec) || has(self.specs)",message="a policy needs spec or specs"
type CiliumNetworkPolicy struct {
	metav1.TypeMeta `json:",inline"`
	// +kubebuilder:validation:Required
	metav1.ObjectMeta `json:"metadata"`

	// Spec is a single rule.
	//
	// +optional
	Spec *policy.Rule `json:"spec,omitempty"`

	// Specs is a list of rules.
	//
	// +optional
	Specs policy.Rules `json:"specs,omitempty"`

	// Status reports whether the policy is valid and, per node, how it was
	// applied. Always written.
	//
	// +kubebuilder:validation:Optional
	Status CiliumNetworkPolicyStatus `json:"status"`
}

// CiliumNetworkPolicyList is a list of CiliumNetworkPolicy objects.
//
// +kubebuilder:object:root=true
type CiliumNetworkPolicyList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata"`

	// Items are the policies.
	Items []CiliumNetworkPolicy `json:"items"`
}

// CiliumClusterwideNetworkPolicy is a cluster-scoped network policy in
// Cilium's rule language. Unlike a CiliumNetworkPolicy its rules select
// endpoints of every namespace, and they may select nodes (host policies).
//
// +genclient
// +genclient:nonNamespaced
// +kubebuilder:object:root=true
// +kubebuilder:resource:path=ciliumclusterwidenetworkpolicies,singular=ciliumclusterwidenetworkpolicy,scope=Cluster,shortName={ccnp},categories={cilium,ciliumpolicy}
// +kubebuilder:printcolumn:name="Valid",type=string,JSONPath=`.status.conditions[?(@.type=='Valid')].status`,description="Whether the policy passed validation"
// +kubebuilder:subresource:status
// +kubebuilder:storageversion
// +kubebuilder:validation:XValidation:rule="has(self.spec) || has(self.specs)",message="a policy needs spec or specs"
type CiliumClusterwideNetworkPolicy struct {
	metav1.TypeMeta `json:",inline"`
	// +kubebuilder:validation:Required
	metav1.ObjectMeta `json:"metadata"`

	// Spec is a single rule.
	//
	// +optional
	Spec *policy.Rule `json:"spec,omitempty"`

	// Specs is a list of rules.
	//
	// +optional
	Specs policy.Rules `json:"specs,omitempty"`

	// Status reports whether the policy is valid and, per node, how it was
	// applied. Always written.
	//
	// +kubebuilder:validation:Optional
	Status CiliumNetworkPolicyStatus `json:"status"`
}

// CiliumClusterwideNetworkPolicyList is a list of
// CiliumClusterwideNetworkPolicy objects.
//
// +kubebuilder:object:root=true
type CiliumClusterwideNetworkPolicyList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata"`

	// Items are the policies.
	Items []CiliumClusterwideNetworkPolicy `json:"items"`
}

// CiliumNetworkPolicyStatus is the status of a CiliumNetworkPolicy or
// CiliumClusterwideNetworkPolicy.
type CiliumNetworkPolicyStatus struct {
	// DerivativePolicies reports, per policy derived from this one (for
	// example by resolving cloud groups), how it was applied.
	//
	// +optional
	DerivativePolicies map[string]CiliumNetworkPolicyNodeStatus `json:"derivativePolicies,omitempty"`

	// Conditions describe the policy's state; the operator sets `Valid`.
	//
	// +optional
	Conditions []NetworkPolicyCondition `json:"conditions,omitempty"`
}

// CiliumNetworkPolicyNodeStatus is how a policy was applied in one place.
type CiliumNetworkPolicyNodeStatus struct {
	// OK is true when the policy was applied without error.
	//
	// +optional
	OK bool `json:"ok,omitempty"`

	// Error is the reason when OK is false.
	//
	// +optional
	Error string `json:"error,omitempty"`

	// LastUpdated is when this entry was written.
	//
	// +optional
	LastUpdated metav1.Time `json:"lastUpdated,omitempty"`

	// Revision is the agent's policy revision that included the policy.
	//
	// +optional
	Revision uint64 `json:"localPolicyRevision,omitempty"`

	// Enforcing is true when the policy is enforced.
	//
	// +optional
	Enforcing bool `json:"enforcing,omitempty"`

	// Annotations are the policy's annotations at the time.
	//
	// +optional
	Annotations map[string]string `json:"annotations,omitempty"`
}

// PolicyConditionType is the type of a policy condition.
type PolicyConditionType string

// PolicyConditionValid is the condition the operator's validator sets: True
// when every rule parsed, False with the error as message otherwise.
const PolicyConditionValid PolicyConditionType = "Valid"

// NetworkPolicyCondition is one condition of a policy.
type NetworkPolicyCondition struct {
	// Type of the condition.
	Type PolicyConditionType `json:"type"`

	// Status of the condition: True, False or Unknown.
	Status corev1.ConditionStatus `json:"status"`

	// LastTransitionTime is when Status last changed.
	//
	// +optional
	LastTransitionTime metav1.Time `json:"lastTransitionTime,omitempty"`

	// Reason is a one-word CamelCase cause of the last change.
	//
	// +optional
	Reason string `json:"reason,omitempty"`

	// Message explains the last change.
	//
	// +optional
	Message string `json:"message,omitempty"`
}
