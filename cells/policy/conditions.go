package policy

import (
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
)

// ConditionSupported is cellium's condition beside Cilium's Valid: False
// when the policy has parts that are parsed but not enforced (L7 rules,
// toFQDNs, ...), each named by its field in the message; True otherwise.
const ConditionSupported ciliumv2.PolicyConditionType = "Supported"

// Reasons of the Supported condition.
const (
	// ReasonL7NotEnforced: some toPorts carry L7 rules (http, kafka, dns,
	// l7); their ports are allowed at L4.
	ReasonL7NotEnforced = "L7RulesNotEnforced"
	// ReasonNotSupported: other fields are not enforced.
	ReasonNotSupported = "FieldsNotSupported"
	// ReasonSupported: every field is enforced.
	ReasonSupported = "AllFieldsSupported"
)

// Message of a Valid=True condition (Cilium's words).
const validMessage = "Policy validation succeeded"

// CNPConditions returns the conditions a CiliumNetworkPolicy's status
// should carry, without transition times (see MergeConditions): Valid
// (True, or False with the parse error naming each bad field; the agent
// then rejects the whole policy) and, for a valid policy, Supported.
func CNPConditions(cnp *ciliumv2.CiliumNetworkPolicy, opts ParseOptions) []ciliumv2.NetworkPolicyCondition {
	rules, err := ParseCNP(cnp, opts)
	return conditions(rules, err)
}

// CCNPConditions is CNPConditions for a CiliumClusterwideNetworkPolicy.
func CCNPConditions(ccnp *ciliumv2.CiliumClusterwideNetworkPolicy, opts ParseOptions) []ciliumv2.NetworkPolicyCondition {
	rules, err := ParseCCNP(ccnp, opts)
	return conditions(rules, err)
}

func conditions(rules []*Rule, err error) []ciliumv2.NetworkPolicyCondition {
	if err != nil {
		return []ciliumv2.NetworkPolicyCondition{{Type: ciliumv2.PolicyConditionValid, Status: corev1.ConditionFalse, Message: err.Error()}}
	}
	out := []ciliumv2.NetworkPolicyCondition{{Type: ciliumv2.PolicyConditionValid, Status: corev1.ConditionTrue, Message: validMessage}}
	var warnings []string
	l7 := false
	for _, r := range rules {
		for _, w := range r.Warnings {
			warnings = append(warnings, w)
			l7 = l7 || strings.Contains(w, ".rules.")
		}
	}
	sup := ciliumv2.NetworkPolicyCondition{Type: ConditionSupported, Status: corev1.ConditionTrue, Reason: ReasonSupported,
		Message: "every field of the policy is enforced"}
	if len(warnings) > 0 {
		sup.Status, sup.Reason, sup.Message = corev1.ConditionFalse, ReasonNotSupported, strings.Join(warnings, "; ")
		if l7 {
			sup.Reason = ReasonL7NotEnforced
		}
	}
	return append(out, sup)
}

// MergeConditions returns cur with the conditions of want set (other
// types are kept): a condition whose status did not change keeps its
// transition time, a changed one gets now. It returns cur itself (and
// false) when nothing but times would change.
func MergeConditions(cur, want []ciliumv2.NetworkPolicyCondition, now metav1.Time) ([]ciliumv2.NetworkPolicyCondition, bool) {
	out := slices.Clone(cur)
	changed := false
	for _, w := range want {
		i := slices.IndexFunc(out, func(c ciliumv2.NetworkPolicyCondition) bool { return c.Type == w.Type })
		switch {
		case i < 0:
			w.LastTransitionTime = now
			out = append(out, w)
			changed = true
		case out[i].Status != w.Status:
			w.LastTransitionTime = now
			out[i] = w
			changed = true
		case out[i].Reason != w.Reason || out[i].Message != w.Message:
			w.LastTransitionTime = out[i].LastTransitionTime
			out[i] = w
			changed = true
		}
	}
	if !changed {
		return cur, false
	}
	return out, true
}
