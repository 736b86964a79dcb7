package policy

import (
	"fmt"
	"net/netip"
	"testing"

	"github.com/cellium/cellium/statedb/identity"
	"github.com/cellium/cellium/statedb/labels"
)

// benchIdentities returns n pod identities spread over 50 namespaces and
// 100 apps.
func benchIdentities(n int) map[identity.NumericIdentity]labels.Labels {
	out := make(map[identity.NumericIdentity]labels.Labels, n)
	for i := range n {
		ns := fmt.Sprint("ns-", i%50)
		all := labels.FromK8sPod(map[string]string{"app": fmt.Sprint("app-", i%100), "replica": fmt.Sprint(i / 100)},
			ns, map[string]string{"kubernetes.io/metadata.name": ns}, "default", "")
		out[identity.NumericIdentity(1000+i)] = all
	}
	return out
}

// benchRule returns rule j: pods of app-j accept app-(j+1) on tcp/80 and
// 8000-8099, and send to app-(j+2) and to a /24 on tcp/443.
func benchRule(j int, gen int) (Source, []*Rule) {
	src := Source{Kind: KindCNP, Namespace: fmt.Sprint("ns-", j%50), Name: fmt.Sprint("r", j)}
	// Pods of app-k live in namespace ns-(k%50).
	sel := func(k int) *Selector {
		return NewSelector(Requirement{Source: labels.SourceAny, Key: "app", Op: OpIn, Values: []string{fmt.Sprint("app-", k%100)}},
			Requirement{Source: labels.SourceK8s, Key: labels.PodNamespaceLabel, Op: OpIn, Values: []string{fmt.Sprint("ns-", k%50)}})
	}
	r := &Rule{Source: src, Subject: sel(j), IngressDefaultDeny: true, EgressDefaultDeny: true,
		Ingress: []*Entry{{Peers: []Matcher{sel(j + 1)},
			Ports: []PortSpec{{Proto: tcp, Port: 80}, {Proto: tcp, Port: 8000, EndPort: 8099 + uint16(gen)}}}},
		Egress: []*Entry{
			{Peers: []Matcher{sel(j + 2)}},
			{Peers: []Matcher{NewCIDRSelector(netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(j >> 8), byte(j), 0}), 24))}, Ports: []PortSpec{{Proto: tcp, Port: 443}}},
		}}
	return src, []*Rule{r}
}

func benchEngine(b *testing.B, nIdentities, nRules int) (*Engine, map[identity.NumericIdentity]labels.Labels) {
	b.Helper()
	e := NewEngine(ModeDefault)
	ids := benchIdentities(nIdentities)
	e.UpdateIdentities(ids, nil)
	for j := range nRules {
		e.UpsertRules(benchRule(j, 0))
	}
	return e, ids
}

// BenchmarkFullComputation: 10,000 identities and 1,000 rules loaded, then
// the policy of 1,000 endpoints computed. One op is the whole thing.
func BenchmarkFullComputation(b *testing.B) {
	ids := benchIdentities(10000)
	b.ReportAllocs()
	for b.Loop() {
		e := NewEngine(ModeDefault)
		e.UpdateIdentities(ids, nil)
		for j := range 1000 {
			e.UpsertRules(benchRule(j, 0))
		}
		for i := range 1000 {
			id := identity.NumericIdentity(1000 + i)
			e.Compute(Endpoint{Identity: id, Labels: ids[id]})
		}
	}
}

// BenchmarkComputeAllEndpoints: only the computation of 1,000 endpoints,
// on a loaded engine.
func BenchmarkComputeAllEndpoints(b *testing.B) {
	e, ids := benchEngine(b, 10000, 1000)
	b.ReportAllocs()
	for b.Loop() {
		for i := range 1000 {
			id := identity.NumericIdentity(1000 + i)
			e.Compute(Endpoint{Identity: id, Labels: ids[id]})
		}
	}
}

// BenchmarkIdentityAdded: one identity appears; the op includes
// recomputing every endpoint (of the first 1,000) the change reports as
// affected. The metric affected/op counts them.
func BenchmarkIdentityAdded(b *testing.B) {
	e, ids := benchEngine(b, 10000, 1000)
	next := identity.NumericIdentity(20000)
	affected := 0
	b.ReportAllocs()
	for b.Loop() {
		lbls := ids[identity.NumericIdentity(1000+int(next)%10000)].Merge(labels.ParseLabels("k8s:extra=" + next.StringID()))
		ch := e.UpdateIdentities(map[identity.NumericIdentity]labels.Labels{next: lbls}, nil)
		for i := range 1000 {
			id := identity.NumericIdentity(1000 + i)
			if ch.Affects(id) {
				affected++
				e.Compute(Endpoint{Identity: id, Labels: ids[id]})
			}
		}
		next++
	}
	b.ReportMetric(float64(affected)/float64(b.N), "affected/op")
}

// BenchmarkRuleChanged: one rule's ports change; the op includes
// recomputing the affected endpoints.
func BenchmarkRuleChanged(b *testing.B) {
	e, ids := benchEngine(b, 10000, 1000)
	gen, affected := 1, 0
	b.ReportAllocs()
	for b.Loop() {
		ch := e.UpsertRules(benchRule(7, gen))
		for i := range 1000 {
			id := identity.NumericIdentity(1000 + i)
			if ch.Affects(id) {
				affected++
				e.Compute(Endpoint{Identity: id, Labels: ids[id]})
			}
		}
		gen = 1 - gen
	}
	b.ReportMetric(float64(affected)/float64(b.N), "affected/op")
}

// BenchmarkNoMatch20k: one endpoint against 20,000 rules none of which
// selects it (Cilium's own benchmark of this case takes about 1.6 ms).
func BenchmarkNoMatch20k(b *testing.B) {
	e := NewEngine(ModeDefault)
	for j := range 20000 {
		e.UpsertRules(benchRule(j, 0))
	}
	lbls := labels.FromK8sPod(map[string]string{"app": "lonely"}, "ns-0", map[string]string{"kubernetes.io/metadata.name": "ns-0"}, "default", "")
	e.UpdateIdentities(map[identity.NumericIdentity]labels.Labels{99999: lbls}, nil)
	ep := Endpoint{Identity: 99999, Labels: lbls}
	b.ReportAllocs()
	for b.Loop() {
		e.Compute(ep)
	}
}
