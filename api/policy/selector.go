package policy

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// EndpointSelector selects endpoints (or nodes, CIDR groups, services) by
// their labels, with the same shape as a Kubernetes label selector. Keys may
// carry a source prefix such as `k8s:` or `reserved:`; a key without one
// matches labels of any source.
//
// An empty selector selects everything it is matched against.
type EndpointSelector struct {
	// MatchLabels requires each key to be present with exactly the given value.
	//
	// +optional
	MatchLabels map[string]string `json:"matchLabels,omitempty"`

	// MatchExpressions are further requirements; all of them must hold.
	//
	// +optional
	MatchExpressions []LabelSelectorRequirement `json:"matchExpressions,omitempty"`
}

// LabelSelectorRequirement is one condition of a selector: a key, an operator
// and, for In and NotIn, the values to compare with.
type LabelSelectorRequirement struct {
	// Key is the label key the condition is about.
	Key string `json:"key"`

	// Operator relates the key to Values.
	Operator LabelSelectorOperator `json:"operator"`

	// Values must be non-empty for In and NotIn and empty for Exists and
	// DoesNotExist.
	//
	// +optional
	Values []string `json:"values,omitempty"`
}

// LabelSelectorOperator is the relation of a LabelSelectorRequirement.
//
// +kubebuilder:validation:Enum=In;NotIn;Exists;DoesNotExist
type LabelSelectorOperator string

// The operators a selector requirement may use.
const (
	LabelSelectorOpIn           LabelSelectorOperator = "In"
	LabelSelectorOpNotIn        LabelSelectorOperator = "NotIn"
	LabelSelectorOpExists       LabelSelectorOperator = "Exists"
	LabelSelectorOpDoesNotExist LabelSelectorOperator = "DoesNotExist"
)

// LabelSelector returns the selector as a Kubernetes label selector, sharing
// nothing with s. A nil selector gives nil.
func (s *EndpointSelector) LabelSelector() *metav1.LabelSelector {
	if s == nil {
		return nil
	}
	out := &metav1.LabelSelector{}
	if s.MatchLabels != nil {
		out.MatchLabels = make(map[string]string, len(s.MatchLabels))
		for k, v := range s.MatchLabels {
			out.MatchLabels[k] = v
		}
	}
	for _, r := range s.MatchExpressions {
		out.MatchExpressions = append(out.MatchExpressions, metav1.LabelSelectorRequirement{
			Key:      r.Key,
			Operator: metav1.LabelSelectorOperator(r.Operator),
			Values:   append([]string(nil), r.Values...),
		})
	}
	return out
}

// NewEndpointSelector copies a Kubernetes label selector into an
// EndpointSelector. A nil selector gives nil.
func NewEndpointSelector(ls *metav1.LabelSelector) *EndpointSelector {
	if ls == nil {
		return nil
	}
	out := &EndpointSelector{}
	if ls.MatchLabels != nil {
		out.MatchLabels = make(map[string]string, len(ls.MatchLabels))
		for k, v := range ls.MatchLabels {
			out.MatchLabels[k] = v
		}
	}
	for _, r := range ls.MatchExpressions {
		out.MatchExpressions = append(out.MatchExpressions, LabelSelectorRequirement{
			Key:      r.Key,
			Operator: LabelSelectorOperator(r.Operator),
			Values:   append([]string(nil), r.Values...),
		})
	}
	return out
}
