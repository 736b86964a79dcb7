package policy

import (
	"encoding/json"
	"math/rand/v2"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8slabels "k8s.io/apimachinery/pkg/labels"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	api "github.com/cellium/cellium/api/policy"
	"github.com/cellium/cellium/statedb/identity"
	"github.com/cellium/cellium/statedb/labels"
)

// FuzzSelectorMatchesKubernetes checks selector matching against
// Kubernetes' own label selector implementation: for keys without a source
// prefix and labels of source k8s, both must agree.
func FuzzSelectorMatchesKubernetes(f *testing.F) {
	f.Add("app", "web", uint8(0), "tier", "db,web", "app=web,tier=db")
	f.Add("app", "", uint8(2), "x", "", "app=,x=1")
	f.Add("a.b/c", "v", uint8(1), "a.b/c", "v,w", "a.b/c=w")
	f.Fuzz(func(t *testing.T, k1, v1 string, op uint8, k2, vals, lbls string) {
		ops := []metav1.LabelSelectorOperator{metav1.LabelSelectorOpIn, metav1.LabelSelectorOpNotIn, metav1.LabelSelectorOpExists, metav1.LabelSelectorOpDoesNotExist}
		ls := &metav1.LabelSelector{MatchLabels: map[string]string{k1: v1}}
		req := metav1.LabelSelectorRequirement{Key: k2, Operator: ops[int(op)%4]}
		if req.Operator == metav1.LabelSelectorOpIn || req.Operator == metav1.LabelSelectorOpNotIn {
			req.Values = strings.Split(vals, ",")
		}
		ls.MatchExpressions = []metav1.LabelSelectorRequirement{req}
		want, err := metav1.LabelSelectorAsSelector(ls)
		if err != nil {
			return // not a valid Kubernetes selector
		}
		set := k8slabels.Set{}
		for _, kv := range strings.Split(lbls, ",") {
			k, v, _ := strings.Cut(kv, "=")
			set[k] = v
		}
		if _, err := k8slabels.ValidatedSelectorFromSet(set); err != nil {
			return
		}
		sel, err := CompileSelector(api.NewEndpointSelector(ls))
		if err != nil {
			t.Fatalf("CompileSelector rejected a valid Kubernetes selector %v: %v", ls, err)
		}
		our := labels.FromMap(set, labels.SourceK8s)
		if got, exp := sel.MatchesLabels(our), want.Matches(set); got != exp {
			t.Fatalf("selector %s on %v: got %v, Kubernetes says %v", sel, set, got, exp)
		}
		// The canonical text identifies the selector.
		again, _ := CompileSelector(api.NewEndpointSelector(ls))
		if again.String() != sel.String() {
			t.Fatalf("String not stable: %q vs %q", again, sel)
		}
	})
}

// FuzzParseCNP feeds arbitrary JSON to the CNP parser and the engine: no
// panic, every returned rule named after its source, and every computed
// policy sorted with unique keys.
func FuzzParseCNP(f *testing.F) {
	for _, s := range []string{
		`{"metadata":{"name":"p","namespace":"a"},"spec":{"endpointSelector":{},"ingress":[{"fromEndpoints":[{}]}]}}`,
		`{"metadata":{"name":"p","namespace":"a"},"specs":[{"endpointSelector":{"matchLabels":{"k8s:app":"x"}},"egress":[{"toCIDRSet":[{"cidr":"10.0.0.0/8","except":["10.1.0.0/16"]}],"toPorts":[{"ports":[{"port":"80","endPort":90,"protocol":"TCP"}]}]}]}]}`,
		`{"metadata":{"name":"p","namespace":"a"},"spec":{"endpointSelector":{},"ingressDeny":[{"fromEntities":["world","cluster"]}],"ingress":[{"icmps":[{"fields":[{"type":8}]}]}]}}`,
		`{"metadata":{"name":"p","namespace":"a"},"spec":{"endpointSelector":{"matchExpressions":[{"key":"a","operator":"NotIn","values":["b"]}]},"egress":[{"toPorts":[{"ports":[{"port":"http"}]}]}]}}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var cnp ciliumv2.CiliumNetworkPolicy
		if err := json.Unmarshal(data, &cnp); err != nil {
			return
		}
		rules, _ := ParseCNP(&cnp, ParseOptions{})
		e := NewEngine(ModeDefault)
		for _, r := range rules {
			if r.Source.Kind != KindCNP || r.Source.Name != cnp.Name {
				t.Fatalf("rule source %v", r.Source)
			}
		}
		if len(rules) > 0 {
			e.UpsertRules(rules[0].Source, rules)
		}
		lbls := labels.ParseLabels("k8s:app=x", "k8s:io.kubernetes.pod.namespace=a", "k8s:io.cilium.k8s.policy.cluster=default")
		e.UpdateIdentities(map[identity.NumericIdentity]labels.Labels{1000: lbls}, nil)
		p := e.Compute(Endpoint{Identity: 1000, Labels: lbls, NamedPorts: map[string][]NamedPort{"http": {{Port: 80, Proto: tcp}}}})
		for i := 1; i < len(p.Ingress.Entries); i++ {
			if p.Ingress.Entries[i-1].Key.Compare(p.Ingress.Entries[i].Key) >= 0 {
				t.Fatalf("ingress entries not sorted and unique: %v", p.Ingress.Entries)
			}
		}
		for i := 1; i < len(p.Egress.Entries); i++ {
			if p.Egress.Entries[i-1].Key.Compare(p.Egress.Entries[i].Key) >= 0 {
				t.Fatalf("egress entries not sorted and unique: %v", p.Egress.Entries)
			}
		}
		if len(rules) > 0 {
			e.DeleteRules(rules[0].Source)
			if len(e.CIDRIdentities()) != 0 || len(e.Selectors()) != 0 {
				t.Fatalf("deleting the rules left CIDR identities %v or selectors %v", e.CIDRIdentities(), e.Selectors())
			}
		}
	})
}

// FuzzCompute drives the random rule generator from fuzz input and
// compares the engine with the reference evaluator.
func FuzzCompute(f *testing.F) {
	f.Add(uint64(1), uint64(2))
	f.Add(uint64(99), uint64(0))
	f.Fuzz(func(t *testing.T, s1, s2 uint64) {
		g := &gen{r: rand.New(rand.NewPCG(s1, s2))}
		e := NewEngine(ModeDefault)
		e.SetEgressNamedPorts(g.namedPorts())
		var eps []Endpoint
		for i := range 4 {
			id := identity.NumericIdentity(1000 + i)
			lbls := g.podLabels()
			e.UpdateIdentities(map[identity.NumericIdentity]labels.Labels{id: lbls}, nil)
			eps = append(eps, Endpoint{Identity: id, Labels: lbls, NamedPorts: g.namedPorts()})
		}
		var rules []*Rule
		for i := range 1 + g.pick(4) {
			src := Source{Kind: KindCCNP, Name: string(rune('a' + i))}
			r := g.rule(src, 0)
			rules = append(rules, r)
			e.UpsertRules(src, []*Rule{r})
		}
		checkAgainstReference(t, e, rules, eps)
	})
}
