package policy

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
)

func cnpFromYAML(t *testing.T, doc string) *ciliumv2.CiliumNetworkPolicy {
	t.Helper()
	var cnp ciliumv2.CiliumNetworkPolicy
	if err := yaml.UnmarshalStrict([]byte(doc), &cnp); err != nil {
		t.Fatal(err)
	}
	return &cnp
}

func condition(cs []ciliumv2.NetworkPolicyCondition, typ ciliumv2.PolicyConditionType) (ciliumv2.NetworkPolicyCondition, bool) {
	for _, c := range cs {
		if c.Type == typ {
			return c, true
		}
	}
	return ciliumv2.NetworkPolicyCondition{}, false
}

// TestCNPConditions: an invalid field gives Valid=False naming the field
// (and no Supported condition); L7 rules give Valid=True and
// Supported=False with reason L7RulesNotEnforced naming each field; a
// plain policy is Valid and Supported.
func TestCNPConditions(t *testing.T) {
	invalid := CNPConditions(cnpFromYAML(t, `
metadata: {name: p, namespace: a}
specs:
- endpointSelector: {matchLabels: {app: web}}
  ingress: [{fromEndpoints: [{matchLabels: {app: cli}}]}]
- endpointSelector: {matchLabels: {app: web}}
  ingress: [{fromCIDR: ["10.0.0.0/40"]}]`), ParseOptions{})
	v, ok := condition(invalid, ciliumv2.PolicyConditionValid)
	if !ok || v.Status != corev1.ConditionFalse || !strings.Contains(v.Message, "specs[1]: ingress[0].fromCIDR[0]") {
		t.Errorf("invalid policy: Valid = %+v, want False naming specs[1]: ingress[0].fromCIDR[0]", v)
	}
	if _, ok := condition(invalid, ConditionSupported); ok || len(invalid) != 1 {
		t.Errorf("invalid policy: conditions %+v, want only Valid", invalid)
	}

	l7 := CNPConditions(cnpFromYAML(t, `
metadata: {name: p, namespace: a}
spec:
  endpointSelector: {matchLabels: {app: web}}
  ingress:
  - toPorts: [{ports: [{port: "80", protocol: TCP}], rules: {http: [{method: GET, path: /}]}}]
  egress:
  - toPorts: [{ports: [{port: "53", protocol: UDP}], rules: {dns: [{matchPattern: "*"}]}}]`), ParseOptions{})
	if v, _ := condition(l7, ciliumv2.PolicyConditionValid); v.Status != corev1.ConditionTrue || v.Message != validMessage {
		t.Errorf("L7 policy: Valid = %+v, want True", v)
	}
	s, ok := condition(l7, ConditionSupported)
	if !ok || s.Status != corev1.ConditionFalse || s.Reason != ReasonL7NotEnforced ||
		!strings.Contains(s.Message, "spec.ingress[0].toPorts[0].rules.http") || !strings.Contains(s.Message, "spec.egress[0].toPorts[0].rules.dns") {
		t.Errorf("L7 policy: Supported = %+v, want False, L7RulesNotEnforced, naming rules.http and rules.dns", s)
	}

	plain := CNPConditions(cnpFromYAML(t, `
metadata: {name: p, namespace: a}
spec:
  endpointSelector: {}
  ingress: [{fromEndpoints: [{}]}]`), ParseOptions{})
	if s, _ := condition(plain, ConditionSupported); s.Status != corev1.ConditionTrue || s.Reason != ReasonSupported {
		t.Errorf("plain policy: Supported = %+v, want True", s)
	}
}

// TestMergeConditions: transition times move only with the status, other
// condition types are kept, and no change reports false.
func TestMergeConditions(t *testing.T) {
	t0 := metav1.NewTime(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	t1 := metav1.NewTime(t0.Add(time.Hour))
	cur := []ciliumv2.NetworkPolicyCondition{
		{Type: "Other", Status: corev1.ConditionTrue, LastTransitionTime: t0},
		{Type: ciliumv2.PolicyConditionValid, Status: corev1.ConditionTrue, Message: validMessage, LastTransitionTime: t0},
	}
	if got, changed := MergeConditions(cur, []ciliumv2.NetworkPolicyCondition{{Type: ciliumv2.PolicyConditionValid, Status: corev1.ConditionTrue, Message: validMessage}}, t1); changed || len(got) != 2 {
		t.Errorf("same conditions: changed=%v %+v", changed, got)
	}
	got, changed := MergeConditions(cur, []ciliumv2.NetworkPolicyCondition{{Type: ciliumv2.PolicyConditionValid, Status: corev1.ConditionFalse, Message: "bad"}}, t1)
	if v, _ := condition(got, ciliumv2.PolicyConditionValid); !changed || v.Status != corev1.ConditionFalse || !v.LastTransitionTime.Equal(&t1) {
		t.Errorf("status change: changed=%v %+v", changed, got)
	}
	if o, ok := condition(got, "Other"); !ok || !o.LastTransitionTime.Equal(&t0) {
		t.Errorf("other condition lost or changed: %+v", got)
	}
	got, changed = MergeConditions(got, []ciliumv2.NetworkPolicyCondition{{Type: ciliumv2.PolicyConditionValid, Status: corev1.ConditionFalse, Message: "worse"}}, metav1.NewTime(t1.Add(time.Hour)))
	if v, _ := condition(got, ciliumv2.PolicyConditionValid); !changed || v.Message != "worse" || !v.LastTransitionTime.Equal(&t1) {
		t.Errorf("message change keeps the transition time: changed=%v %+v", changed, got)
	}
}
