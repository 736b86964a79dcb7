package policy

import (
	"encoding/json"
	"reflect"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

func ptr[T any](v T) *T { return &v }

// TestEncode pins the omit behaviour of rule fields that Cilium writes with
// omitzero or custom marshalling.
func TestEncode(t *testing.T) {
	for _, tc := range []struct {
		name  string
		value any
		want  string
	}{
		{"empty rule", Rule{}, `{}`},
		{"empty default-deny config is omitted", Rule{EnableDefaultDeny: DefaultDenyConfig{}}, `{}`},
		{"a set default-deny direction is written, even false",
			Rule{EnableDefaultDeny: DefaultDenyConfig{Egress: ptr(false)}}, `{"enableDefaultDeny":{"egress":false}}`},
		{"empty log config is omitted", Rule{Log: LogConfig{}}, `{}`},
		{"an empty selector is written as {}", Rule{EndpointSelector: &EndpointSelector{}}, `{"endpointSelector":{}}`},
		{"node selector", Rule{NodeSelector: &EndpointSelector{MatchLabels: map[string]string{"a": "b"}}},
			`{"nodeSelector":{"matchLabels":{"a":"b"}}}`},
		{"empty peer lists are omitted", IngressRule{IngressCommonRule: IngressCommonRule{FromEndpoints: []EndpointSelector{}}}, `{}`},
		{"common rule fields are inlined", EgressRule{EgressCommonRule: EgressCommonRule{ToEntities: EntitySlice{EntityWorld}}},
			`{"toEntities":["world"]}`},
		{"port is a string", PortProtocol{Port: "80"}, `{"port":"80"}`},
		{"ICMP type is always written", ICMPField{Type: ptr(intstr.FromInt32(0))}, `{"type":0}`},
		{"ICMP type by name", ICMPField{Family: ICMPFamilyIPv6, Type: ptr(intstr.FromString("EchoReply"))},
			`{"family":"IPv6","type":"EchoReply"}`},
		{"label value is optional", Label{Key: "k", Source: "unspec"}, `{"key":"k","source":"unspec"}`},
		{"TLS secret is always written", TLSContext{}, `{"secret":null}`},
		{"service selector is always written", K8sServiceSelectorNamespace{}, `{"selector":{}}`},
		{"authentication mode is always written", Authentication{}, `{"mode":""}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := json.Marshal(tc.value)
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != tc.want {
				t.Fatalf("got %s, want %s", got, tc.want)
			}
		})
	}
}

func TestDecodeKeepsNilAndEmptyApart(t *testing.T) {
	var unset, empty IngressRule
	if err := json.Unmarshal([]byte(`{"toPorts":[{"ports":[{"port":"80"}]}]}`), &unset); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(`{"fromEndpoints":[]}`), &empty); err != nil {
		t.Fatal(err)
	}
	if unset.FromEndpoints != nil {
		t.Error("absent fromEndpoints decoded as non-nil")
	}
	if empty.FromEndpoints == nil || len(empty.FromEndpoints) != 0 {
		t.Error("empty fromEndpoints did not decode as an empty non-nil list")
	}
}

func TestLabelSelectorConversion(t *testing.T) {
	if (*EndpointSelector)(nil).LabelSelector() != nil || NewEndpointSelector(nil) != nil {
		t.Fatal("nil selector did not convert to nil")
	}
	es := &EndpointSelector{
		MatchLabels: map[string]string{"k8s:app": "web"},
		MatchExpressions: []LabelSelectorRequirement{
			{Key: "tier", Operator: LabelSelectorOpNotIn, Values: []string{"db"}},
			{Key: "canary", Operator: LabelSelectorOpExists},
		},
	}
	want := &metav1.LabelSelector{
		MatchLabels: map[string]string{"k8s:app": "web"},
		MatchExpressions: []metav1.LabelSelectorRequirement{
			{Key: "tier", Operator: metav1.LabelSelectorOpNotIn, Values: []string{"db"}},
			{Key: "canary", Operator: metav1.LabelSelectorOpExists},
		},
	}
	ls := es.LabelSelector()
	if !reflect.DeepEqual(ls, want) {
		t.Fatalf("LabelSelector() = %+v, want %+v", ls, want)
	}
	back := NewEndpointSelector(ls)
	if !reflect.DeepEqual(back, es) {
		t.Fatalf("round trip = %+v, want %+v", back, es)
	}
	ls.MatchLabels["k8s:app"] = "changed"
	ls.MatchExpressions[0].Values[0] = "changed"
	if es.MatchLabels["k8s:app"] != "web" || es.MatchExpressions[0].Values[0] != "db" {
		t.Fatal("LabelSelector shares memory with its receiver")
	}
	if got := (&EndpointSelector{}).LabelSelector(); !reflect.DeepEqual(got, &metav1.LabelSelector{}) {
		t.Fatalf("empty selector converted to %+v", got)
	}
}
