package policy

import (
	"encoding/json"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8slabels "k8s.io/apimachinery/pkg/labels"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	api "github.com/cellium/cellium/api/policy"
	"github.com/cellium/cellium/statedb/identity"
	"github.com/cellium/cellium/statedb/labels"
	statepolicy "github.com/cellium/cellium/statedb/policy"
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

// FuzzParsePolicy feeds arbitrary JSON to the three parsers (the same
// bytes as a CiliumNetworkPolicy, a CiliumClusterwideNetworkPolicy and a
// NetworkPolicy) and their rules to the engine: no panic, every rule named
// after its source, computed policies equal to the reference evaluator's
// (sorted, unique keys), and deleting the rules releases every selector
// and CIDR identity.
func FuzzParsePolicy(f *testing.F) {
	for _, s := range []string{
		`{"metadata":{"name":"p","namespace":"a"},"spec":{"endpointSelector":{},"ingress":[{"fromEndpoints":[{}]}]}}`,
		`{"metadata":{"name":"p","namespace":"a"},"specs":[{"endpointSelector":{"matchLabels":{"k8s:app":"x"}},"egress":[{"toCIDRSet":[{"cidr":"10.0.0.0/8","except":["10.1.0.0/16"]}],"toPorts":[{"ports":[{"port":"80","endPort":90,"protocol":"TCP"}]}]}]}]}`,
		`{"metadata":{"name":"p","namespace":"a"},"spec":{"endpointSelector":{},"ingressDeny":[{"fromEntities":["world","cluster"]}],"ingress":[{"icmps":[{"fields":[{"type":8}]}]}]}}`,
		`{"metadata":{"name":"p","namespace":"a"},"spec":{"endpointSelector":{"matchExpressions":[{"key":"a","operator":"NotIn","values":["b"]}]},"egress":[{"toPorts":[{"ports":[{"port":"http"}]}]}]}}`,
		`{"metadata":{"name":"p","namespace":"a"},"spec":{"endpointSelector":{"matchLabels":{"app":"x"}},"ingress":[{"fromEndpoints":[{"matchLabels":{"k8s:io.kubernetes.pod.namespace":"b","app":"y"}}],"toPorts":[{"ports":[{"port":"443","protocol":"ANY"}],"rules":{"http":[{"method":"GET"}]}}]}],"egressDeny":[{"toCIDR":["192.168.0.0/16"]}]}}`,
		`{"metadata":{"name":"p"},"spec":{"nodeSelector":{},"ingress":[{"fromEntities":["host"]}]}}`,
		`{"metadata":{"name":"np","namespace":"a"},"spec":{"podSelector":{"matchLabels":{"app":"x"}},"policyTypes":["Ingress","Egress"],"ingress":[{"from":[{"namespaceSelector":{"matchLabels":{"team":"t"}},"podSelector":{"matchExpressions":[{"key":"role","operator":"In","values":["fe"]}]}},{"ipBlock":{"cidr":"172.17.0.0/16","except":["172.17.1.0/24"]}}],"ports":[{"protocol":"TCP","port":6379},{"port":"http"},{"protocol":"UDP","port":1000,"endPort":2000}]}],"egress":[{"to":[{"ipBlock":{"cidr":"10.0.0.0/24"}}],"ports":[{"protocol":"TCP","port":5978}]}]}}`,
		`{"metadata":{"name":"np","namespace":"a"},"spec":{"podSelector":{},"ingress":[{}],"policyTypes":["Ingress"]}}`,
		`{"metadata":{"name":"np","namespace":"a"},"spec":{"podSelector":{},"policyTypes":["Egress"]}}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var (
			cnp  ciliumv2.CiliumNetworkPolicy
			ccnp ciliumv2.CiliumClusterwideNetworkPolicy
			np   networkingv1.NetworkPolicy
		)
		type parsed struct {
			src   Source
			rules []*Rule
		}
		var all []parsed
		if json.Unmarshal(data, &cnp) == nil {
			rules, _ := ParseCNP(&cnp, ParseOptions{})
			all = append(all, parsed{Source{Kind: KindCNP, Namespace: cnp.Namespace, Name: cnp.Name, UID: string(cnp.UID)}, rules})
		}
		if json.Unmarshal(data, &ccnp) == nil {
			rules, _ := ParseCCNP(&ccnp, ParseOptions{})
			all = append(all, parsed{Source{Kind: KindCCNP, Name: ccnp.Name, UID: string(ccnp.UID)}, rules})
		}
		if json.Unmarshal(data, &np) == nil {
			r, err := ParseNetworkPolicy(&np, ParseOptions{})
			if (r == nil) == (err == nil) {
				t.Fatalf("ParseNetworkPolicy returned rule %v and error %v", r, err)
			}
			if r != nil {
				all = append(all, parsed{Source{Kind: KindNetworkPolicy, Namespace: np.Namespace, Name: np.Name, UID: string(np.UID)}, []*Rule{r}})
			}
		}
		for _, p := range all {
			for _, r := range p.rules {
				if r.Source != p.src {
					t.Fatalf("rule source %v, want %v", r.Source, p.src)
				}
			}
			e := NewEngine(ModeDefault)
			e.SetEgressNamedPorts(map[string][]NamedPort{"http": {{Port: 8080, Proto: tcp}}, "dns": {{Port: 53}}})
			e.UpsertRules(p.src, p.rules)
			var eps []Endpoint
			for i, ls := range [][]string{
				{"k8s:app=x", "k8s:io.kubernetes.pod.namespace=a", "k8s:io.cilium.k8s.policy.cluster=default"},
				{"k8s:app=y", "k8s:role=fe", "k8s:io.kubernetes.pod.namespace=b", "k8s:io.cilium.k8s.namespace.labels.team=t", "k8s:io.cilium.k8s.policy.cluster=default"},
			} {
				lbls := labels.ParseLabels(ls...)
				id := identity.NumericIdentity(1000 + i)
				e.UpdateIdentities(map[identity.NumericIdentity]labels.Labels{id: lbls}, nil)
				eps = append(eps, Endpoint{Identity: id, Labels: lbls, NamedPorts: map[string][]NamedPort{"http": {{Port: 80, Proto: tcp}}}})
			}
			// The same pod known only by its labels.
			eps = append(eps, Endpoint{Labels: eps[0].Labels, NamedPorts: eps[0].NamedPorts})
			checkAgainstReference(t, e, p.rules, eps)
			for _, ep := range eps {
				pol := e.Compute(ep)
				for _, d := range []statepolicy.Direction{statepolicy.Ingress, statepolicy.Egress} {
					ents := pol.Direction(d).Entries
					for i := 1; i < len(ents); i++ {
						if ents[i-1].Key.Compare(ents[i].Key) >= 0 {
							t.Fatalf("%s entries not sorted and unique: %v", d, ents)
						}
					}
				}
			}
			e.DeleteRules(p.src)
			if len(e.CIDRIdentities()) != 0 || len(e.Selectors()) != 0 {
				t.Fatalf("deleting the rules left CIDR identities %v or selectors %v", e.CIDRIdentities(), e.Selectors())
			}
		}
	})
}

// FuzzCompute drives the random rule generator from fuzz input: a random
// repository (several rules per source), identities and endpoints (one
// known only by labels) in a random mode, compared with the reference
// evaluator; then random churn of identities and rules, after each step of
// which the incremental engine must equal one built from scratch and the
// endpoints the step does not report must keep their policy; at the end
// the reference is consulted again.
func FuzzCompute(f *testing.F) {
	f.Add(uint64(1), uint64(2), uint8(0))
	f.Add(uint64(99), uint64(0), uint8(3))
	f.Add(uint64(7), uint64(7), uint8(8))
	f.Fuzz(func(t *testing.T, s1, s2 uint64, steps uint8) {
		g := &gen{r: rand.New(rand.NewPCG(s1, s2))}
		mode := []Mode{ModeDefault, ModeDefault, ModeAlways, ModeNever}[g.pick(4)]
		e := NewEngine(mode)
		e.SetEgressNamedPorts(g.namedPorts())
		idents := map[identity.NumericIdentity]labels.Labels{}
		ports := map[identity.NumericIdentity]map[string][]NamedPort{}
		for i := range 2 + g.pick(4) {
			id := identity.NumericIdentity(1000 + i)
			idents[id], ports[id] = g.podLabels(), g.namedPorts()
			e.UpdateIdentities(map[identity.NumericIdentity]labels.Labels{id: idents[id]}, nil)
		}
		srcRules := map[Source][]*Rule{}
		for i := range 1 + g.pick(4) {
			src := Source{Kind: KindCCNP, Name: string(rune('a' + i))}
			for j := range 1 + g.pick(2) {
				srcRules[src] = append(srcRules[src], g.rule(src, j))
			}
			e.UpsertRules(src, srcRules[src])
		}
		endpoints := func() []Endpoint {
			var eps []Endpoint
			for _, id := range slices.Sorted(maps.Keys(idents)) {
				eps = append(eps, Endpoint{Identity: id, Labels: idents[id], NamedPorts: ports[id]})
			}
			return eps
		}
		allRules := func() []*Rule {
			var out []*Rule
			for _, rs := range srcRules {
				out = append(out, rs...)
			}
			return out
		}
		eps := append(endpoints(), Endpoint{Labels: g.podLabels(), NamedPorts: g.namedPorts()})
		checkAgainstReference(t, e, allRules(), eps)

		for step := range int(steps % 8) {
			before := map[identity.NumericIdentity]string{}
			for _, ep := range endpoints() {
				before[ep.Identity] = normalized(e, e.Compute(ep))
			}
			var ch Changes
			switch op := g.pick(4); {
			case op == 0:
				id := identity.NumericIdentity(1000 + g.pick(8))
				idents[id] = g.podLabels()
				ch = e.UpdateIdentities(map[identity.NumericIdentity]labels.Labels{id: idents[id]}, nil)
				ch.add(id) // it may be new, and keeps its ports
				if _, ok := ports[id]; !ok {
					ports[id] = g.namedPorts()
				}
			case op == 1 && len(idents) > 1:
				ids := slices.Sorted(maps.Keys(idents))
				id := ids[g.pick(len(ids))]
				delete(idents, id)
				ch = e.UpdateIdentities(nil, []identity.NumericIdentity{id})
			case op == 2 && len(srcRules) > 0:
				srcs := slices.SortedFunc(maps.Keys(srcRules), func(a, b Source) int { return strings.Compare(a.Name, b.Name) })
				src := srcs[g.pick(len(srcs))]
				delete(srcRules, src)
				ch = e.DeleteRules(src)
			default:
				src := Source{Kind: KindCCNP, Name: string(rune('a' + g.pick(5)))}
				var rs []*Rule
				for j := range 1 + g.pick(2) {
					rs = append(rs, g.rule(src, j))
				}
				srcRules[src] = rs
				ch = e.UpsertRules(src, rs)
			}
			fresh := NewEngine(mode)
			fresh.SetEgressNamedPorts(e.egressNP)
			for src, rs := range srcRules {
				fresh.UpsertRules(src, rs)
			}
			fresh.UpdateIdentities(idents, nil)
			for _, ep := range endpoints() {
				got := normalized(e, e.Compute(ep))
				if b, ok := before[ep.Identity]; ok && b != got && !ch.Affects(ep.Identity) {
					t.Fatalf("step %d: identity %d's policy changed but the change does not report it\nbefore:\n%s\nafter:\n%s", step, ep.Identity, b, got)
				}
				if want := normalized(fresh, fresh.Compute(ep)); got != want {
					t.Fatalf("step %d: identity %d: incremental\n%s\nfrom scratch\n%s", step, ep.Identity, got, want)
				}
			}
		}
		if steps%8 > 0 {
			checkAgainstReference(t, e, allRules(), endpoints())
		}
	})
}
