package v2

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/cellium/cellium/api/policy"
)

// The golden files in testdata are written by hand from Cilium's JSON keys
// (cilium-facts.md sections 1.3, 3.1, 4.2-4.3, 6.1-6.2), not produced by
// these types, so a wrong tag or a wrong omit rule shows up as a diff.

func ptr[T any](v T) *T { return &v }

func ts(s string) metav1.Time {
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		panic(err)
	}
	// metav1.Time decodes into the local zone; match it so values compare equal.
	return metav1.NewTime(t.Local())
}

func fullEndpoint() *CiliumEndpoint {
	return &CiliumEndpoint{
		TypeMeta: metav1.TypeMeta{APIVersion: "cilium.io/v2", Kind: "CiliumEndpoint"},
		ObjectMeta: metav1.ObjectMeta{
			Name:      "web-7d4b9c-x2k4p",
			Namespace: "shop",
			UID:       "0b6c1c5e-2f4a-4f57-9d0e-5c1f8a1e7b10",
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: "v1", Kind: "Pod", Name: "web-7d4b9c-x2k4p",
				UID: "6f1d2a9e-8c3b-4e1a-b7a2-2e9f4c7d1a30",
			}},
		},
		Status: EndpointStatus{
			ID: 1234,
			Controllers: ControllerList{{
				Configuration: &ControllerConfiguration{ErrorRetry: true, ErrorRetryBase: 2000000000, Interval: 10000000000},
				Name:          "sync-to-k8s-ciliumendpoint (1234)",
				Status: &ControllerStatusStatus{
					ConsecutiveFailureCount: 1,
					FailureCount:            3,
					LastFailureMsg:          "the object has been modified",
					LastFailureTimestamp:    "2026-01-02T03:04:05.000Z",
					LastSuccessTimestamp:    "2026-01-02T03:04:15.000Z",
					SuccessCount:            42,
				},
				UUID: "5e0f8e8a-1d7c-4a4b-9a53-0c0d2b7e9f11",
			}},
			ExternalIdentifiers: &EndpointIdentifiers{
				CNIAttachmentID:  "4f1c0ffee:eth0",
				ContainerID:      "4f1c0ffee",
				ContainerName:    "web",
				DockerEndpointID: "de-1",
				DockerNetworkID:  "dn-1",
				PodName:          "shop/web-7d4b9c-x2k4p",
			},
			Health: &EndpointHealth{
				Bpf: EndpointHealthOK, Connected: true, OverallHealth: EndpointHealthOK, Policy: EndpointHealthWarning,
			},
			Identity: &EndpointIdentity{
				ID:     40321,
				Labels: []string{"k8s:app=web", "k8s:io.kubernetes.pod.namespace=shop"},
			},
			Log: []*EndpointStatusChange{{
				Code: "ok", Message: "endpoint regenerated", State: "ready", Timestamp: "2026-01-02T03:04:05Z",
			}},
			Networking: &EndpointNetworking{
				Addressing: AddressPairList{{IPV4: "10.0.1.23", IPV6: "fd00::1:17"}},
				NodeIP:     "192.168.10.2",
			},
			Encryption: EncryptionSpec{Key: 3},
			Policy: &EndpointPolicy{
				Ingress: &EndpointPolicyDirection{
					Enforcing: true,
					Allowed: AllowedIdentityList{{
						Identity: 40322, IdentityLabels: map[string]string{"k8s:app": "frontend"}, DestPort: 8080, Protocol: 6,
					}},
					Denied:   DenyIdentityList{{Identity: 2, DestPort: 22, Protocol: 6}},
					Removing: AllowedIdentityList{{Identity: 40323}},
					Adding:   AllowedIdentityList{{Identity: 40324, Protocol: 17}},
					State:    EndpointPolicyStateEnforcing,
				},
				Egress: &EndpointPolicyDirection{State: EndpointPolicyStateNonEnforcing},
			},
			State:          EndpointStateReady,
			NamedPorts:     NamedPorts{{Name: "http", Port: 8080, Protocol: "TCP"}},
			ServiceAccount: "web",
		},
	}
}

func fullIdentity() *CiliumIdentity {
	return &CiliumIdentity{
		TypeMeta: metav1.TypeMeta{APIVersion: "cilium.io/v2", Kind: "CiliumIdentity"},
		ObjectMeta: metav1.ObjectMeta{
			Name:        "40321",
			Labels:      map[string]string{"io.kubernetes.pod.namespace": "shop"},
			Annotations: map[string]string{HeartbeatAnnotation: "2026-01-02T03:04:05.123456789Z"},
		},
		SecurityLabels: map[string]string{
			"k8s:app":                                 "web",
			"k8s:io.cilium.k8s.policy.cluster":        "default",
			"k8s:io.cilium.k8s.policy.serviceaccount": "web",
			"k8s:io.kubernetes.pod.namespace":         "shop",
		},
	}
}

func fullNode() *CiliumNode {
	return &CiliumNode{
		TypeMeta: metav1.TypeMeta{APIVersion: "cilium.io/v2", Kind: "CiliumNode"},
		ObjectMeta: metav1.ObjectMeta{
			Name:   "node-a",
			Labels: map[string]string{"kubernetes.io/hostname": "node-a"},
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: "v1", Kind: "Node", Name: "node-a", UID: "3c5a9e1b-7f2d-4b8e-a1c4-9d6e2f0b5a77",
			}},
		},
		Spec: NodeSpec{
			InstanceID: "i-0abc123",
			BootID:     "8d3e6a0c-4b1f-4d2e-9c7a-5f0e1b2c3d4e",
			Addresses: []NodeAddress{
				{Type: NodeInternalIP, IP: "192.168.10.2"},
				{Type: NodeCiliumInternalIP, IP: "10.0.1.1"},
			},
			HealthAddressing:  HealthAddressingSpec{IPv4: "10.0.1.7", IPv6: "fd00::1:7"},
			IngressAddressing: AddressPair{IPV4: "10.0.1.8", IPV6: "fd00::1:8"},
			Encryption:        EncryptionSpec{Key: 1},
			ENI:               CloudIPAMData{Raw: []byte(`{"vpc-id":"vpc-1","subnet-ids":["subnet-a"],"first-interface-index":1}`)},
			IPAM: IPAMSpec{
				Pool:     AllocationMap{"10.0.1.30": {Resource: "eni-1"}},
				IPv6Pool: AllocationMap{"fd00::1:30": {Owner: "shop/web-7d4b9c-x2k4p", Resource: "eni-1"}},
				Pools: IPAMPoolSpec{
					Requested: []IPAMPoolRequest{{Pool: "default", Needed: IPAMPoolDemand{IPv4Addrs: 16, IPv6Addrs: 16}}},
					Allocated: []IPAMPoolAllocation{{Pool: "default", CIDRs: []string{"10.10.0.0/27"}, AllowFirstIP: true, AllowLastIP: true}},
				},
				PodCIDRs:          []string{"10.0.1.0/24", "fd00::1:0/112"},
				MinAllocate:       4,
				MaxAllocate:       64,
				PreAllocate:       8,
				MaxAboveWatermark: 2,
				StaticIPTags:      map[string]string{"team": "net"},
			},
		},
		Status: NodeStatus{
			ENI: CloudIPAMData{Raw: []byte(`{"enis":{"eni-1":{"id":"eni-1"}}}`)},
			IPAM: IPAMStatus{
				Used:     AllocationMap{"10.0.1.23": {Owner: "shop/web-7d4b9c-x2k4p", Resource: "eni-1"}},
				IPv6Used: AllocationMap{"fd00::1:17": {Owner: "shop/web-7d4b9c-x2k4p"}},
				PodCIDRs: PodCIDRMap{
					"10.0.1.0/24": {Status: PodCIDRStatusInUse},
					"10.0.2.0/24": {Status: PodCIDRStatusReleased},
				},
				OperatorStatus:   IPAMOperatorStatus{Error: "pool exhausted"},
				ReleaseIPs:       map[string]IPReleaseStatus{"10.0.1.40": IPAMMarkForRelease},
				ReleaseIPv6s:     map[string]IPReleaseStatus{"fd00::1:40": IPAMReadyForRelease},
				AssignedStaticIP: "203.0.113.9",
			},
		},
	}
}

func fullPolicy() *CiliumNetworkPolicy {
	sel := func(kv ...string) policy.EndpointSelector {
		m := map[string]string{}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return policy.EndpointSelector{MatchLabels: m}
	}
	tcp := func(port string) policy.PortProtocol {
		return policy.PortProtocol{Port: port, Protocol: policy.ProtoTCP}
	}
	return &CiliumNetworkPolicy{
		TypeMeta:   metav1.TypeMeta{APIVersion: "cilium.io/v2", Kind: "CiliumNetworkPolicy"},
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "shop"},
		Spec: &policy.Rule{
			EndpointSelector: &policy.EndpointSelector{
				MatchLabels: map[string]string{"app": "web"},
				MatchExpressions: []policy.LabelSelectorRequirement{
					{Key: "k8s:tier", Operator: policy.LabelSelectorOpIn, Values: []string{"front", "edge"}},
					{Key: "canary", Operator: policy.LabelSelectorOpDoesNotExist},
				},
			},
			Ingress: []policy.IngressRule{{
				IngressCommonRule: policy.IngressCommonRule{
					FromEndpoints: []policy.EndpointSelector{
						sel("app", "frontend", "k8s:io.kubernetes.pod.namespace", "shop"),
						{},
					},
					FromCIDR: policy.CIDRSlice{"10.0.0.0/8", "2001:db8::/32"},
					FromCIDRSet: policy.CIDRRuleSlice{
						{Cidr: "192.168.0.0/16", ExceptCIDRs: []policy.CIDR{"192.168.1.0/24"}},
						{CIDRGroupRef: "office-ranges"},
						{CIDRGroupSelector: ptr(sel("site", "hq"))},
					},
					FromEntities: policy.EntitySlice{policy.EntityHost, policy.EntityRemoteNode, policy.EntityKubeAPIServer},
					FromGroups: []policy.Groups{{AWS: &policy.AWSGroup{
						Labels:              map[string]string{"role": "bastion"},
						SecurityGroupsIds:   []string{"sg-1"},
						SecurityGroupsNames: []string{"bastion"},
						Region:              "eu-west-1",
					}}},
					FromNodes: []policy.EndpointSelector{sel("node-role.kubernetes.io/control-plane", "")},
				},
				ToPorts: policy.PortRules{{
					Ports: []policy.PortProtocol{
						tcp("8080"),
						{Port: "9000", EndPort: 9010, Protocol: policy.ProtoUDP},
						{Port: "http-alt"},
					},
					TerminatingTLS: &policy.TLSContext{
						Secret:      &policy.Secret{Namespace: "shop", Name: "web-tls"},
						Certificate: "tls.crt",
						PrivateKey:  "tls.key",
					},
					OriginatingTLS: &policy.TLSContext{
						Secret:    &policy.Secret{Name: "upstream-ca"},
						TrustedCA: "ca.crt",
					},
					ServerNames: []policy.ServerName{"web.shop.example"},
					Listener: &policy.Listener{
						EnvoyConfig: &policy.EnvoyConfig{Kind: "CiliumEnvoyConfig", Name: "web-lb"},
						Name:        "web-listener",
						Priority:    10,
					},
					Rules: &policy.L7Rules{HTTP: []policy.PortRuleHTTP{{
						Path:    "/api/.*",
						Method:  "GET|POST",
						Host:    `web\.shop\.example`,
						Headers: []string{"X-Team: shop"},
						HeaderMatches: []*policy.HeaderMatch{
							{Mismatch: policy.MismatchActionAdd, Name: "X-Token", Secret: &policy.Secret{Namespace: "shop", Name: "token"}},
							{Name: "X-Env", Value: "prod"},
						},
					}}},
				}},
				ICMPs: policy.ICMPRules{{Fields: []policy.ICMPField{
					{Family: policy.ICMPFamilyIPv4, Type: ptr(intstr.FromInt32(8))},
					{Family: policy.ICMPFamilyIPv6, Type: ptr(intstr.FromString("EchoRequest"))},
				}}},
				Authentication: &policy.Authentication{Mode: policy.AuthenticationModeRequired},
			}},
			IngressDeny: []policy.IngressDenyRule{{
				IngressCommonRule: policy.IngressCommonRule{FromEntities: policy.EntitySlice{policy.EntityWorld}},
				ToPorts:           policy.PortDenyRules{{Ports: []policy.PortProtocol{tcp("22")}}},
				ICMPs:             policy.ICMPRules{{Fields: []policy.ICMPField{{Type: ptr(intstr.FromInt32(13))}}}},
			}},
			Egress: []policy.EgressRule{
				{
					EgressCommonRule: policy.EgressCommonRule{
						ToEndpoints: []policy.EndpointSelector{sel("k8s:io.kubernetes.pod.namespace", "kube-system", "k8s:k8s-app", "kube-dns")},
					},
					ToPorts: policy.PortRules{{
						Ports: []policy.PortProtocol{{Port: "53", Protocol: policy.ProtoAny}},
						Rules: &policy.L7Rules{DNS: []policy.PortRuleDNS{
							{MatchPattern: "*.shop.example"},
							{MatchName: "api.example.com"},
						}},
					}},
				},
				{
					EgressCommonRule: policy.EgressCommonRule{
						ToCIDR:     policy.CIDRSlice{"203.0.113.0/24"},
						ToCIDRSet:  policy.CIDRRuleSlice{{Cidr: "198.51.100.0/24", ExceptCIDRs: []policy.CIDR{"198.51.100.128/25"}}},
						ToEntities: policy.EntitySlice{policy.EntityCluster},
						ToServices: []policy.Service{
							{K8sService: &policy.K8sServiceNamespace{ServiceName: "db", Namespace: "data"}},
							{K8sServiceSelector: &policy.K8sServiceSelectorNamespace{
								Selector:  policy.ServiceSelector(sel("tier", "cache")),
								Namespace: "data",
							}},
						},
						ToGroups: []policy.Groups{{AWS: &policy.AWSGroup{SecurityGroupsIds: []string{"sg-2"}}}},
						ToNodes:  []policy.EndpointSelector{{}},
					},
					ToFQDNs: policy.FQDNSelectorSlice{
						{MatchName: "api.example.com"},
						{MatchPattern: "**.cdn.example"},
					},
					ICMPs:          policy.ICMPRules{{Fields: []policy.ICMPField{{Type: ptr(intstr.FromInt32(0))}}}},
					Authentication: &policy.Authentication{Mode: policy.AuthenticationModeDisabled},
				},
			},
			EgressDeny: []policy.EgressDenyRule{{
				EgressCommonRule: policy.EgressCommonRule{ToEntities: policy.EntitySlice{policy.EntityWorld}},
				ToPorts:          policy.PortDenyRules{{Ports: []policy.PortProtocol{tcp("25")}}},
			}},
			Labels: policy.LabelArray{
				{Key: "owner", Value: "shop-team", Source: "unspec"},
				{Key: "audited", Source: "k8s"},
			},
			EnableDefaultDeny: policy.DefaultDenyConfig{Ingress: ptr(true), Egress: ptr(false)},
			Description:       "Let the web tier talk to what it needs.",
			Log:               policy.LogConfig{Value: "shop-web"},
		},
		Specs: policy.Rules{{
			EndpointSelector: ptr(sel("app", "queue")),
			Ingress: []policy.IngressRule{{
				IngressCommonRule: policy.IngressCommonRule{FromEndpoints: []policy.EndpointSelector{sel("app", "web")}},
				ToPorts: policy.PortRules{
					{
						Ports: []policy.PortProtocol{tcp("9092")},
						Rules: &policy.L7Rules{Kafka: []policy.PortRuleKafka{
							{Role: "produce", Topic: "orders"},
							{APIKey: "fetch", APIVersion: "12", ClientID: "shop", Topic: "orders"},
						}},
					},
					{
						Ports: []policy.PortProtocol{tcp("7000")},
						Rules: &policy.L7Rules{
							L7Proto: "envoy.filters.network.r2d2",
							L7:      []policy.PortRuleL7{{"cmd": "READ", "file": "/public/.*"}},
						},
					},
				},
			}},
			EnableDefaultDeny: policy.DefaultDenyConfig{Egress: ptr(false)},
		}},
		Status: CiliumNetworkPolicyStatus{
			DerivativePolicies: map[string]CiliumNetworkPolicyNodeStatus{
				"shop/web-togroups-1": {
					OK: true, LastUpdated: ts("2026-01-02T03:04:05Z"), Revision: 17, Enforcing: true,
					Annotations: map[string]string{"note": "derived"},
				},
				"shop/web-togroups-2": {Error: "cannot resolve group", LastUpdated: ts("2026-01-02T03:05:05Z")},
			},
			Conditions: []NetworkPolicyCondition{{
				Type: PolicyConditionValid, Status: corev1.ConditionTrue,
				LastTransitionTime: ts("2026-01-02T03:04:00Z"), Reason: "Valid", Message: "Policy validation succeeded",
			}},
		},
	}
}

func fullClusterwidePolicy() *CiliumClusterwideNetworkPolicy {
	return &CiliumClusterwideNetworkPolicy{
		TypeMeta:   metav1.TypeMeta{APIVersion: "cilium.io/v2", Kind: "CiliumClusterwideNetworkPolicy"},
		ObjectMeta: metav1.ObjectMeta{Name: "host-fw"},
		Spec: &policy.Rule{
			NodeSelector: &policy.EndpointSelector{MatchLabels: map[string]string{"node-role.kubernetes.io/worker": ""}},
			Ingress: []policy.IngressRule{{
				IngressCommonRule: policy.IngressCommonRule{FromEntities: policy.EntitySlice{policy.EntityCluster}},
				ToPorts:           policy.PortRules{{Ports: []policy.PortProtocol{{Port: "10250", Protocol: policy.ProtoTCP}}}},
			}},
			Description: "Only the cluster reaches the kubelet.",
		},
		Specs: policy.Rules{{
			EndpointSelector: &policy.EndpointSelector{},
			Egress: []policy.EgressRule{{
				EgressCommonRule: policy.EgressCommonRule{ToEntities: policy.EntitySlice{policy.EntityKubeAPIServer}},
			}},
		}},
		Status: CiliumNetworkPolicyStatus{
			Conditions: []NetworkPolicyCondition{{
				Type: PolicyConditionValid, Status: corev1.ConditionFalse,
				LastTransitionTime: ts("2026-01-02T03:04:00Z"), Reason: "InvalidSpec",
				Message: "rule has no ingress or egress section",
			}},
		},
	}
}

// goldenCases pairs each golden file with the Go value it must encode.
func goldenCases() []struct {
	file  string
	value runtime.Object
	empty func() runtime.Object
} {
	return []struct {
		file  string
		value runtime.Object
		empty func() runtime.Object
	}{
		{"ciliumendpoint.json", fullEndpoint(), func() runtime.Object { return &CiliumEndpoint{} }},
		{"ciliumidentity.json", fullIdentity(), func() runtime.Object { return &CiliumIdentity{} }},
		{"ciliumnode.json", fullNode(), func() runtime.Object { return &CiliumNode{} }},
		{"ciliumnetworkpolicy.json", fullPolicy(), func() runtime.Object { return &CiliumNetworkPolicy{} }},
		{"ciliumclusterwidenetworkpolicy.json", fullClusterwidePolicy(), func() runtime.Object { return &CiliumClusterwideNetworkPolicy{} }},
	}
}

// requireSameJSON fails unless got and want encode the same JSON value (key
// order and white space aside).
func requireSameJSON(t *testing.T, got, want []byte) {
	t.Helper()
	var g, w any
	if err := json.Unmarshal(got, &g); err != nil {
		t.Fatalf("decode got: %v\n%s", err, got)
	}
	if err := json.Unmarshal(want, &w); err != nil {
		t.Fatalf("decode want: %v\n%s", err, want)
	}
	if !reflect.DeepEqual(g, w) {
		gi, _ := json.MarshalIndent(g, "", "  ")
		wi, _ := json.MarshalIndent(w, "", "  ")
		t.Fatalf("JSON differs\n--- got\n%s\n--- want\n%s", gi, wi)
	}
}

func decodeStrict(data []byte, into any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	return dec.Decode(into)
}

func TestGoldenEncode(t *testing.T) {
	for _, tc := range goldenCases() {
		t.Run(tc.file, func(t *testing.T) {
			want, err := os.ReadFile(filepath.Join("testdata", tc.file))
			if err != nil {
				t.Fatal(err)
			}
			got, err := json.Marshal(tc.value)
			if err != nil {
				t.Fatal(err)
			}
			requireSameJSON(t, got, want)
		})
	}
}

func TestGoldenDecode(t *testing.T) {
	for _, tc := range goldenCases() {
		t.Run(tc.file, func(t *testing.T) {
			data, err := os.ReadFile(filepath.Join("testdata", tc.file))
			if err != nil {
				t.Fatal(err)
			}
			got := tc.empty()
			if err := decodeStrict(data, got); err != nil {
				t.Fatalf("golden has keys the type does not know: %v", err)
			}
			if !reflect.DeepEqual(got, tc.value) {
				gi, _ := json.MarshalIndent(got, "", "  ")
				t.Fatalf("decoded value differs from the fixture; decoded:\n%s", gi)
			}
			again, err := json.Marshal(got)
			if err != nil {
				t.Fatal(err)
			}
			requireSameJSON(t, again, data)
		})
	}
}

// TestEncodeEmptyFields pins which empty fields are still written, the part
// of Cilium's encoding a client is most likely to trip over.
func TestEncodeEmptyFields(t *testing.T) {
	for _, tc := range []struct {
		name  string
		value any
		want  string
	}{
		{"endpoint status always carries encryption", EndpointStatus{}, `{"encryption":{}}`},
		{"endpoint without spec", &CiliumEndpoint{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns"}},
			`{"metadata":{"name":"p","namespace":"ns"},"status":{"encryption":{}}}`},
		{"policy direction always carries enforcing", EndpointPolicyDirection{}, `{"enforcing":false}`},
		{"endpoint policy omits unset directions", EndpointPolicy{}, `{}`},
		{"networking always carries addressing", EndpointNetworking{}, `{"addressing":null}`},
		{"identity always carries security-labels", &CiliumIdentity{ObjectMeta: metav1.ObjectMeta{Name: "256"}},
			`{"metadata":{"name":"256"},"security-labels":null}`},
		{"node struct sections are always written", &CiliumNode{ObjectMeta: metav1.ObjectMeta{Name: "n"}},
			`{"metadata":{"name":"n"},
			  "spec":{"health":{},"ingress":{},"encryption":{},"eni":{},"azure":{},"alibaba-cloud":{},"ipam":{"pools":{}}},
			  "status":{"eni":{},"azure":{},"alibaba-cloud":{},"ipam":{"operator-status":{}}}}`},
		{"policy always carries status", &CiliumNetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns"}},
			`{"metadata":{"name":"p","namespace":"ns"},"status":{}}`},
		{"clusterwide policy always carries status", &CiliumClusterwideNetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: "p"}},
			`{"metadata":{"name":"p"},"status":{}}`},
		{"zero timestamps are written as null", CiliumNetworkPolicyNodeStatus{}, `{"lastUpdated":null}`},
		{"condition type and status are always written", NetworkPolicyCondition{}, `{"type":"","status":"","lastTransitionTime":null}`},
		{"pool request always carries needed", IPAMPoolRequest{Pool: "default"}, `{"pool":"default","needed":{}}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := json.Marshal(tc.value)
			if err != nil {
				t.Fatal(err)
			}
			requireSameJSON(t, got, []byte(tc.want))
		})
	}
}

func TestCloudIPAMData(t *testing.T) {
	for _, tc := range []struct {
		in      string
		wantRaw string
		wantErr bool
	}{
		{in: `null`},
		{in: `{}`},
		{in: ` { } `},
		{in: `{"vpc-id": "vpc-1"}`, wantRaw: `{"vpc-id":"vpc-1"}`},
		{in: `[]`, wantErr: true},
		{in: `"x"`, wantErr: true},
		{in: `{"a":`, wantErr: true},
	} {
		var d CloudIPAMData
		err := d.UnmarshalJSON([]byte(tc.in))
		if (err != nil) != tc.wantErr {
			t.Errorf("UnmarshalJSON(%s) error = %v, want error %v", tc.in, err, tc.wantErr)
			continue
		}
		if string(d.Raw) != tc.wantRaw {
			t.Errorf("UnmarshalJSON(%s) kept %q, want %q", tc.in, d.Raw, tc.wantRaw)
		}
	}
}

func TestDeepCopyIsIndependent(t *testing.T) {
	ep := fullEndpoint()
	cp := ep.DeepCopy()
	if !reflect.DeepEqual(ep, cp) {
		t.Fatal("endpoint copy differs")
	}
	cp.Status.Networking.Addressing[0].IPV4 = "10.9.9.9"
	cp.Status.Policy.Ingress.Allowed[0].IdentityLabels["k8s:app"] = "changed"
	cp.Status.NamedPorts[0].Port = 1
	if !reflect.DeepEqual(ep, fullEndpoint()) {
		t.Fatal("changing the endpoint copy changed the original")
	}

	cnp := fullPolicy()
	pc := cnp.DeepCopy()
	pc.Spec.Ingress[0].FromEndpoints[0].MatchLabels["app"] = "changed"
	*pc.Spec.EnableDefaultDeny.Ingress = false
	pc.Specs[0].Ingress[0].ToPorts[1].Rules.L7[0]["cmd"] = "WRITE"
	pc.Spec.Ingress[0].ICMPs[0].Fields[0].Type.IntVal = 99
	if !reflect.DeepEqual(cnp, fullPolicy()) {
		t.Fatal("changing the policy copy changed the original")
	}

	cn := fullNode()
	nc := cn.DeepCopy()
	nc.Spec.ENI.Raw[2] = 'X'
	if !reflect.DeepEqual(cn, fullNode()) {
		t.Fatal("changing the node copy changed the original")
	}
}

func TestSchemeDecodesGolden(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	decoder := serializer.NewCodecFactory(scheme).UniversalDeserializer()
	for _, tc := range goldenCases() {
		t.Run(tc.file, func(t *testing.T) {
			data, err := os.ReadFile(filepath.Join("testdata", tc.file))
			if err != nil {
				t.Fatal(err)
			}
			obj, gvk, err := decoder.Decode(data, nil, nil)
			if err != nil {
				t.Fatal(err)
			}
			if gvk.GroupVersion() != SchemeGroupVersion || reflect.TypeOf(obj) != reflect.TypeOf(tc.value) {
				t.Fatalf("decoded %s as %T", gvk, obj)
			}
			if !reflect.DeepEqual(obj, tc.value) {
				t.Fatal("scheme decoding differs from plain JSON decoding")
			}
		})
	}
	for _, list := range []runtime.Object{
		&CiliumEndpointList{}, &CiliumIdentityList{}, &CiliumNodeList{},
		&CiliumNetworkPolicyList{}, &CiliumClusterwideNetworkPolicyList{},
	} {
		if _, _, err := scheme.ObjectKinds(list); err != nil {
			t.Errorf("%T not registered: %v", list, err)
		}
	}
}
