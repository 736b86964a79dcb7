package crds

import (
	"encoding/json"
	"os"
	"path"
	"slices"
	"strings"
	"testing"

	"k8s.io/apiextensions-apiserver/pkg/apis/apiextensions"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	structuralschema "k8s.io/apiextensions-apiserver/pkg/apiserver/schema"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/schema/pruning"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/kube-openapi/pkg/validation/spec"
	"k8s.io/kube-openapi/pkg/validation/strfmt"
	"k8s.io/kube-openapi/pkg/validation/validate"
)

type column struct {
	name, jsonPath, typ string
	priority            int32
}

// subresource describes the CRD's subresources: "none" means the field is
// absent, "empty" means `subresources: {}`, "status" means a status
// subresource.
type want struct {
	name         string
	kind         string
	plural       string
	singular     string
	scope        apiextensionsv1.ResourceScope
	version      string
	shortNames   []string
	categories   []string
	subresources string
	columns      []column
}

// expected is the compatibility surface of each CRD as Cilium defines it
// (cilium-facts.md sections 1.1-1.2, 3.1, 4.1, 5.1, 6.1).
var expected = []want{
	{
		name: CiliumEndpointName, kind: "CiliumEndpoint", plural: "ciliumendpoints", singular: "ciliumendpoint",
		scope: apiextensionsv1.NamespaceScoped, version: "v2",
		shortNames: []string{"cep", "ciliumep"}, categories: []string{"cilium"},
		subresources: "empty",
		columns: []column{
			{"Security Identity", ".status.identity.id", "integer", 0},
			{"Ingress Enforcement", ".status.policy.ingress.state", "string", 1},
			{"Egress Enforcement", ".status.policy.egress.state", "string", 1},
			{"Endpoint State", ".status.state", "string", 0},
			{"IPv4", ".status.networking.addressing[0].ipv4", "string", 0},
			{"IPv6", ".status.networking.addressing[0].ipv6", "string", 0},
		},
	},
	{
		name: CiliumIdentityName, kind: "CiliumIdentity", plural: "ciliumidentities", singular: "ciliumidentity",
		scope: apiextensionsv1.ClusterScoped, version: "v2",
		shortNames: []string{"ciliumid"}, categories: []string{"cilium"},
		subresources: "status",
		columns: []column{
			{"Namespace", `.metadata.labels.io\.kubernetes\.pod\.namespace`, "string", 0},
			{"Age", ".metadata.creationTimestamp", "date", 0},
		},
	},
	{
		name: CiliumNodeName, kind: "CiliumNode", plural: "ciliumnodes", singular: "ciliumnode",
		scope: apiextensionsv1.ClusterScoped, version: "v2",
		shortNames: []string{"cn", "ciliumn"}, categories: []string{"cilium"},
		subresources: "status",
		columns: []column{
			{"CiliumInternalIP", `.spec.addresses[?(@.type=="CiliumInternalIP")].ip`, "string", 0},
			{"InternalIP", `.spec.addresses[?(@.type=="InternalIP")].ip`, "string", 0},
			{"Age", ".metadata.creationTimestamp", "date", 0},
		},
	},
	{
		name: CiliumNetworkPolicyName, kind: "CiliumNetworkPolicy", plural: "ciliumnetworkpolicies", singular: "ciliumnetworkpolicy",
		scope: apiextensionsv1.NamespaceScoped, version: "v2",
		shortNames: []string{"cnp", "ciliumnp"}, categories: []string{"cilium", "ciliumpolicy"},
		subresources: "status",
		columns: []column{
			{"Age", ".metadata.creationTimestamp", "date", 0},
			{"Valid", ".status.conditions[?(@.type=='Valid')].status", "string", 0},
		},
	},
	{
		name: CiliumClusterwideNetworkPolicyName, kind: "CiliumClusterwideNetworkPolicy",
		plural: "ciliumclusterwidenetworkpolicies", singular: "ciliumclusterwidenetworkpolicy",
		scope: apiextensionsv1.ClusterScoped, version: "v2",
		shortNames: []string{"ccnp"}, categories: []string{"cilium", "ciliumpolicy"},
		subresources: "status",
		columns: []column{
			{"Valid", ".status.conditions[?(@.type=='Valid')].status", "string", 0},
		},
	},
	{
		name: CiliumEndpointSliceName, kind: "CiliumEndpointSlice", plural: "ciliumendpointslices", singular: "ciliumendpointslice",
		scope: apiextensionsv1.ClusterScoped, version: "v2alpha1",
		shortNames: []string{"ces"}, categories: []string{"cilium"},
		subresources: "none",
	},
	{
		// Cilium also serves v2alpha1 (deprecated, not stored); cellium
		// serves v2 only.
		name: CiliumLoadBalancerIPPoolName, kind: "CiliumLoadBalancerIPPool", plural: "ciliumloadbalancerippools", singular: "ciliumloadbalancerippool",
		scope: apiextensionsv1.ClusterScoped, version: "v2",
		shortNames: []string{"ippools", "ippool", "lbippool", "lbippools"}, categories: []string{"cilium"},
		subresources: "status",
		columns: []column{
			{"Disabled", ".spec.disabled", "boolean", 0},
			{"Conflicting", `.status.conditions[?(@.type=="cilium.io/PoolConflict")].status`, "string", 0},
			{"IPs Available", `.status.conditions[?(@.type=="cilium.io/IPsAvailable")].message`, "string", 0},
			{"Age", ".metadata.creationTimestamp", "date", 0},
		},
	},
}

func byName(t *testing.T) map[string]*apiextensionsv1.CustomResourceDefinition {
	t.Helper()
	all := mustAll(t)
	m := make(map[string]*apiextensionsv1.CustomResourceDefinition, len(all))
	for _, crd := range all {
		if _, dup := m[crd.Name]; dup {
			t.Fatalf("CRD %s embedded twice", crd.Name)
		}
		m[crd.Name] = crd
	}
	return m
}

func TestAllHasExactlyTheExpectedCRDs(t *testing.T) {
	got := byName(t)
	if len(got) != len(expected) {
		names := make([]string, 0, len(got))
		for n := range got {
			names = append(names, n)
		}
		slices.Sort(names)
		t.Fatalf("All returned %d CRDs %v, want %d", len(got), names, len(expected))
	}
	for _, w := range expected {
		if got[w.name] == nil {
			t.Errorf("CRD %s missing", w.name)
		}
	}
}

func TestAllReturnsFreshObjects(t *testing.T) {
	a, err := All()
	if err != nil {
		t.Fatal(err)
	}
	a[0].Spec.Names.ShortNames = append(a[0].Spec.Names.ShortNames, "changed")
	b, err := All()
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(b[0].Spec.Names.ShortNames, "changed") {
		t.Fatal("a change to one result of All shows in the next")
	}
}

func TestCRDCompatibilitySurface(t *testing.T) {
	got := byName(t)
	for _, w := range expected {
		t.Run(w.kind, func(t *testing.T) {
			crd := got[w.name]
			if crd == nil {
				t.Fatalf("CRD %s missing", w.name)
			}
			s := crd.Spec
			if s.Group != "cilium.io" {
				t.Errorf("group = %q, want cilium.io", s.Group)
			}
			n := s.Names
			if n.Kind != w.kind || n.ListKind != w.kind+"List" || n.Plural != w.plural || n.Singular != w.singular {
				t.Errorf("names = %s/%s/%s/%s, want %s/%sList/%s/%s",
					n.Kind, n.ListKind, n.Plural, n.Singular, w.kind, w.kind, w.plural, w.singular)
			}
			if !slices.Equal(n.ShortNames, w.shortNames) {
				t.Errorf("shortNames = %v, want %v", n.ShortNames, w.shortNames)
			}
			if !slices.Equal(n.Categories, w.categories) {
				t.Errorf("categories = %v, want %v", n.Categories, w.categories)
			}
			if s.Scope != w.scope {
				t.Errorf("scope = %s, want %s", s.Scope, w.scope)
			}
			if len(s.Versions) != 1 {
				t.Fatalf("%d versions, want 1", len(s.Versions))
			}
			v := s.Versions[0]
			if v.Name != w.version || !v.Served || !v.Storage {
				t.Errorf("version %s served=%v storage=%v, want %s served and stored", v.Name, v.Served, v.Storage, w.version)
			}
			switch sub := v.Subresources; w.subresources {
			case "none":
				if sub != nil {
					t.Errorf("subresources = %+v, want none", sub)
				}
			case "empty":
				if sub == nil || sub.Status != nil || sub.Scale != nil {
					t.Errorf("subresources = %+v, want {}", sub)
				}
			case "status":
				if sub == nil || sub.Status == nil {
					t.Errorf("subresources = %+v, want a status subresource", sub)
				}
			}
			var cols []column
			for _, c := range v.AdditionalPrinterColumns {
				cols = append(cols, column{c.Name, c.JSONPath, c.Type, c.Priority})
			}
			if !slices.Equal(cols, w.columns) {
				t.Errorf("printer columns:\n got %q\nwant %q", cols, w.columns)
			}
		})
	}
}

// TestSchemasAreStructural applies the structural-schema rules kube-apiserver
// enforces on apiextensions.k8s.io/v1 CRDs.
func TestSchemasAreStructural(t *testing.T) {
	for _, crd := range mustAll(t) {
		t.Run(crd.Spec.Names.Kind, func(t *testing.T) {
			s := structural(t, crd)
			for _, e := range structuralschema.ValidateStructural(field.NewPath("openAPIV3Schema"), s) {
				t.Error(e)
			}
		})
	}
}

// goldenFiles are the hand-written objects of the type packages' tests, in
// Cilium's JSON; the CRD schemas must accept them and keep every field.
var goldenFiles = []string{
	"../cilium.io/v2/testdata/ciliumendpoint.json",
	"../cilium.io/v2/testdata/ciliumidentity.json",
	"../cilium.io/v2/testdata/ciliumnode.json",
	"../cilium.io/v2/testdata/ciliumnetworkpolicy.json",
	"../cilium.io/v2/testdata/ciliumclusterwidenetworkpolicy.json",
	"../cilium.io/v2alpha1/testdata/ciliumendpointslice.json",
}

func TestSchemasAcceptAndKeepGoldenObjects(t *testing.T) {
	byKind := map[string]*apiextensionsv1.CustomResourceDefinition{}
	for _, crd := range mustAll(t) {
		byKind[crd.Spec.Names.Kind] = crd
	}
	for _, file := range goldenFiles {
		t.Run(path.Base(file), func(t *testing.T) {
			data, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			var obj map[string]any
			if err := json.Unmarshal(data, &obj); err != nil {
				t.Fatal(err)
			}
			kind, _ := obj["kind"].(string)
			crd := byKind[kind]
			if crd == nil {
				t.Fatalf("no CRD for kind %q", kind)
			}
			if want := crd.Spec.Group + "/" + crd.Spec.Versions[0].Name; obj["apiVersion"] != want {
				t.Fatalf("apiVersion %v, CRD serves %s", obj["apiVersion"], want)
			}

			// Value validation (types, enums, patterns, formats, bounds).
			raw, err := json.Marshal(crd.Spec.Versions[0].Schema.OpenAPIV3Schema)
			if err != nil {
				t.Fatal(err)
			}
			var sch spec.Schema
			if err := json.Unmarshal(raw, &sch); err != nil {
				t.Fatal(err)
			}
			res := validate.NewSchemaValidator(&sch, nil, "", strfmt.Default).Validate(obj)
			for _, e := range res.Errors {
				t.Errorf("schema rejects golden object: %v", e)
			}

			// Pruning: the API server drops fields the schema does not know.
			var pruned map[string]any
			if err := json.Unmarshal(data, &pruned); err != nil {
				t.Fatal(err)
			}
			dropped := pruning.PruneWithOptions(pruned, structural(t, crd), true,
				structuralschema.UnknownFieldPathOptions{TrackUnknownFieldPaths: true})
			if len(dropped) > 0 {
				t.Errorf("the API server would drop %v", dropped)
			}
		})
	}
}

func TestSchemaRejectsWhatCiliumRejects(t *testing.T) {
	byKind := map[string]*apiextensionsv1.CustomResourceDefinition{}
	for _, crd := range mustAll(t) {
		byKind[crd.Spec.Names.Kind] = crd
	}
	for _, tc := range []struct {
		name, kind, obj string
	}{
		{"unknown endpoint state", "CiliumEndpoint", `{"status":{"state":"sleeping"}}`},
		{"networking without addressing", "CiliumEndpoint", `{"status":{"networking":{"node":"10.0.0.1"}}}`},
		{"policy direction without enforcing", "CiliumEndpoint", `{"status":{"policy":{"ingress":{"state":"enforcing"}}}}`},
		{"identity without security labels", "CiliumIdentity", `{"metadata":{"name":"256"}}`},
		{"entity outside the enum", "CiliumNetworkPolicy", `{"spec":{"ingress":[{"fromEntities":["world-ipv4"]}]}}`},
		{"bad protocol", "CiliumNetworkPolicy", `{"spec":{"ingress":[{"toPorts":[{"ports":[{"port":"80","protocol":"ICMP"}]}]}]}}`},
		{"port out of range", "CiliumNetworkPolicy", `{"spec":{"ingress":[{"toPorts":[{"ports":[{"port":"65536"}]}]}]}}`},
		{"endPort out of range", "CiliumNetworkPolicy", `{"spec":{"ingress":[{"toPorts":[{"ports":[{"port":"1","endPort":70000}]}]}]}}`},
		{"deprecated fromRequires", "CiliumNetworkPolicy", `{"spec":{"ingress":[{"fromRequires":[{}]}]}}`},
		{"bad CIDR", "CiliumClusterwideNetworkPolicy", `{"spec":{"egress":[{"toCIDR":["10.0.0.300/8"]}]}}`},
		{"bad selector operator", "CiliumClusterwideNetworkPolicy", `{"spec":{"endpointSelector":{"matchExpressions":[{"key":"a","operator":"Gt"}]}}}`},
		{"bad authentication mode", "CiliumNetworkPolicy", `{"spec":{"ingress":[{"authentication":{"mode":"maybe"}}]}}`},
		{"too many ports", "CiliumNetworkPolicy", `{"spec":{"ingress":[{"toPorts":[{"ports":[` + strings.Repeat(`{"port":"1"},`, 40) + `{"port":"2"}]}]}]}}`},
		{"unknown pod CIDR status", "CiliumNode", `{"spec":{},"status":{"ipam":{"pod-cidrs":{"10.0.0.0/24":{"status":"busy"}}}}}`},
		{"slice without endpoints", "CiliumEndpointSlice", `{"namespace":"ns"}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			crd := byKind[tc.kind]
			raw, err := json.Marshal(crd.Spec.Versions[0].Schema.OpenAPIV3Schema)
			if err != nil {
				t.Fatal(err)
			}
			var sch spec.Schema
			if err := json.Unmarshal(raw, &sch); err != nil {
				t.Fatal(err)
			}
			var obj map[string]any
			if err := json.Unmarshal([]byte(tc.obj), &obj); err != nil {
				t.Fatal(err)
			}
			if _, ok := obj["metadata"]; !ok {
				obj["metadata"] = map[string]any{"name": "x"}
			}
			if res := validate.NewSchemaValidator(&sch, nil, "", strfmt.Default).Validate(obj); res.IsValid() {
				t.Errorf("schema accepts %s", tc.obj)
			}
		})
	}
}

func mustAll(t *testing.T) []*apiextensionsv1.CustomResourceDefinition {
	t.Helper()
	all, err := All()
	if err != nil {
		t.Fatal(err)
	}
	return all
}

func structural(t *testing.T, crd *apiextensionsv1.CustomResourceDefinition) *structuralschema.Structural {
	t.Helper()
	var internal apiextensions.JSONSchemaProps
	if err := apiextensionsv1.Convert_v1_JSONSchemaProps_To_apiextensions_JSONSchemaProps(
		crd.Spec.Versions[0].Schema.OpenAPIV3Schema, &internal, nil); err != nil {
		t.Fatalf("convert schema: %v", err)
	}
	s, err := structuralschema.NewStructural(&internal)
	if err != nil {
		t.Fatalf("schema is not structural: %v", err)
	}
	return s
}
