package policy

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"

	"github.com/cellium/cellium/statedb/identity"
	"github.com/cellium/cellium/statedb/labels"
	statepolicy "github.com/cellium/cellium/statedb/policy"
)

// bruteSelecting returns the names of the rules whose subject selects
// lbls, by matching every rule: what the rule index must reproduce.
func bruteSelecting(e *Engine, lbls labels.Labels) []string {
	var out []string
	for _, crs := range e.sources {
		for _, cr := range crs {
			if cr.rule.Subject != nil && cr.rule.Subject.MatchesLabels(lbls) {
				out = append(out, cr.name)
			}
		}
	}
	slices.Sort(out)
	return out
}

func ruleNames(rs []*Rule) []string {
	var out []string
	for _, r := range rs {
		out = append(out, r.Name())
	}
	return out
}

// TestRuleIndexFindsEverySelectingRule: an endpoint known only by labels
// is selected by exactly the rules a full scan finds, whatever operators
// the subjects use (NotIn, DoesNotExist and Exists are not indexed by
// value, In with several values is filed under each), also after rules are
// replaced and deleted.
func TestRuleIndexFindsEverySelectingRule(t *testing.T) {
	pod := func(kv map[string]string, ns string) labels.Labels {
		return labels.FromK8sPod(kv, ns, map[string]string{"kubernetes.io/metadata.name": ns}, "default", "")
	}
	e := NewEngine(ModeDefault)
	subjects := map[string]*Selector{
		"in":         NewSelector(Requirement{Source: labels.SourceAny, Key: "app", Op: OpIn, Values: []string{"web"}}),
		"in-several": NewSelector(Requirement{Source: labels.SourceK8s, Key: "app", Op: OpIn, Values: []string{"db", "web"}}),
		"in-ns-only": NewSelector(Requirement{Source: labels.SourceK8s, Key: labels.PodNamespaceLabel, Op: OpIn, Values: []string{"prod"}}),
		"notin":      NewSelector(Requirement{Source: labels.SourceAny, Key: "app", Op: OpNotIn, Values: []string{"web"}}),
		"dne":        NewSelector(Requirement{Source: labels.SourceAny, Key: "tier", Op: OpDoesNotExist}),
		"exists":     NewSelector(Requirement{Source: labels.SourceAny, Key: "tier", Op: OpExists}),
		"wildcard":   WildcardSelector(),
		"notin-and-in": NewSelector(Requirement{Source: labels.SourceAny, Key: "app", Op: OpNotIn, Values: []string{"db"}},
			Requirement{Source: labels.SourceK8s, Key: labels.PodNamespaceLabel, Op: OpIn, Values: []string{"prod", "dev"}}),
		"wrong-source": NewSelector(Requirement{Source: labels.SourceReserved, Key: "app", Op: OpIn, Values: []string{"web"}}),
	}
	for name, sel := range subjects {
		src := Source{Kind: KindCCNP, Name: name}
		e.UpsertRules(src, []*Rule{{Source: src, Subject: sel, Ingress: []*Entry{{AnyPeer: true}}}})
	}
	pods := []labels.Labels{
		pod(map[string]string{"app": "web"}, "prod"),
		pod(map[string]string{"app": "web", "tier": "1"}, "dev"),
		pod(map[string]string{"app": "db"}, "prod"),
		pod(map[string]string{"app": "other", "tier": "x"}, "test"),
		pod(map[string]string{}, "prod"),
		pod(map[string]string{"tier": "2"}, "dev"),
	}
	check := func(when string) {
		t.Helper()
		for _, lbls := range pods {
			got := ruleNames(e.SelectingRules(Endpoint{Labels: lbls}))
			if want := bruteSelecting(e, lbls); !slices.Equal(got, want) {
				t.Errorf("%s: %s: index finds %v, a full scan %v", when, lbls, got, want)
			}
		}
	}
	check("all rules")
	// Each NotIn/DoesNotExist/wildcard rule is found for some pod: the
	// index does not merely agree on nothing.
	for _, name := range []string{"notin", "dne", "wildcard", "notin-and-in"} {
		found := false
		for _, lbls := range pods {
			found = found || slices.Contains(ruleNames(e.SelectingRules(Endpoint{Labels: lbls})), KindCCNP+"/"+name)
		}
		if !found {
			t.Errorf("rule %s selects no test pod", name)
		}
	}
	// Replace "in" with a NotIn subject and delete "dne": the index follows.
	src := Source{Kind: KindCCNP, Name: "in"}
	e.UpsertRules(src, []*Rule{{Source: src, Subject: subjects["notin"], Ingress: []*Entry{{AnyPeer: true}}}})
	e.DeleteRules(Source{Kind: KindCCNP, Name: "dne"})
	check("after replace and delete")
	for name := range subjects {
		e.DeleteRules(Source{Kind: KindCCNP, Name: name})
	}
	if len(e.subjects.byLabel) != 0 || len(e.subjects.other) != 0 {
		t.Errorf("after deleting every rule the index holds %v and %v", e.subjects.byLabel, e.subjects.other)
	}
}

// TestRuleIndexRandom compares the index with a full scan on the property
// test's random rules and pods.
func TestRuleIndexRandom(t *testing.T) {
	for seed := range uint64(40) {
		g := &gen{r: rand.New(rand.NewPCG(seed, 3))}
		e := NewEngine(ModeDefault)
		for i := range 1 + g.pick(12) {
			src := Source{Kind: KindCNP, Namespace: "x", Name: fmt.Sprint("r", i)}
			e.UpsertRules(src, []*Rule{g.rule(src, 0)})
		}
		for range 20 {
			lbls := g.podLabels()
			got := ruleNames(e.SelectingRules(Endpoint{Labels: lbls}))
			if want := bruteSelecting(e, lbls); !slices.Equal(got, want) {
				t.Fatalf("seed %d: %s: index finds %v, a full scan %v", seed, lbls, got, want)
			}
		}
	}
}

// checkSelections verifies that every cached selector selects exactly the
// identities its matcher matches.
func checkSelections(t *testing.T, sc *SelectorCache) {
	t.Helper()
	for key, cs := range sc.selectors {
		var want []identity.NumericIdentity
		for id, l := range sc.identities {
			if cs.m.Matches(id, l) {
				want = append(want, id)
			}
		}
		slices.Sort(want)
		if !slices.Equal(cs.selections(), want) {
			t.Errorf("selector %s selects %v, want %v", key, cs.selections(), want)
		}
	}
}

// TestSelectorCacheCIDRIndex: CIDR selectors added after, and before, the
// CIDR identities (IPv4 and IPv6, nested, with exceptions) select exactly
// the identities inside them, also after identities are relabelled and
// deleted; the prefix index holds only live identities.
func TestSelectorCacheCIDRIndex(t *testing.T) {
	sc := NewSelectorCache()
	pfx := netip.MustParsePrefix
	prefixes := []string{"10.0.0.0/8", "10.1.0.0/16", "10.1.2.0/24", "10.1.2.3/32", "10.2.0.0/16", "11.0.0.0/8",
		"192.168.1.0/24", "2001:db8::/32", "2001:db8:1::/48", "2001:db9::/32", "0.0.0.0/1", "128.0.0.0/1"}
	next := identity.MinLocalIdentity
	ids := map[string]identity.NumericIdentity{}
	add := func(ps ...string) {
		up := map[identity.NumericIdentity]labels.Labels{}
		for _, p := range ps {
			ids[p] = next
			up[next] = CIDRIdentityLabels(pfx(p))
			next++
		}
		sc.update(up, nil)
	}
	add(prefixes[:6]...)
	for _, s := range []*CIDRSelector{
		NewCIDRSelector(pfx("10.0.0.0/8")),
		NewCIDRSelector(pfx("10.1.0.0/16"), pfx("10.1.2.0/24")),
		NewCIDRSelector(pfx("0.0.0.0/0")),
		NewCIDRSelector(pfx("::/0"), pfx("2001:db8::/32")),
		NewCIDRSelector(pfx("2001:db8::/32")),
		NewCIDRSelector(pfx("10.1.2.3/32")),
		NewCIDRSelector(pfx("12.0.0.0/8")),
	} {
		sc.add(s)
	}
	checkSelections(t, sc)
	add(prefixes[6:]...)
	checkSelections(t, sc)
	// Relabel one identity to another prefix and delete two.
	sc.update(map[identity.NumericIdentity]labels.Labels{ids["10.1.2.3/32"]: CIDRIdentityLabels(pfx("2001:db8:1:2::/64"))},
		[]identity.NumericIdentity{ids["10.0.0.0/8"], ids["2001:db9::/32"]})
	checkSelections(t, sc)
	if got, want := len(sc.cidrIDs), len(prefixes)-2; got != want {
		t.Errorf("prefix index holds %d identities, want %d: %v", got, want, sc.cidrIDs)
	}
	// A selector added now sees the current identities.
	cs := sc.add(NewCIDRSelector(pfx("2001:db8::/32")))
	if len(cs.selections()) != 3 {
		t.Errorf("2001:db8::/32 selects %v, want itself, the /48 and the relabelled /64", cs.selections())
	}
	checkSelections(t, sc)
}

// TestPolicyCacheSharing: endpoints the same rules select share one
// computed policy, except where their named ports differ; a change of the
// peers' selections is seen at once.
func TestPolicyCacheSharing(t *testing.T) {
	e := NewEngine(ModeDefault)
	web := NewSelector(Requirement{Source: labels.SourceAny, Key: "app", Op: OpIn, Values: []string{"web"}})
	client := NewSelector(Requirement{Source: labels.SourceAny, Key: "app", Op: OpIn, Values: []string{"client"}})
	src := Source{Kind: KindCCNP, Name: "p"}
	e.UpsertRules(src, []*Rule{{Source: src, Subject: web, IngressDefaultDeny: true,
		Ingress: []*Entry{{Peers: []Matcher{client}, Ports: []PortSpec{{Proto: tcp, Name: "http"}, {Proto: tcp, Port: 22}}}}}})
	lbl := func(app string) labels.Labels { return labels.ParseLabels("k8s:app=" + app) }
	e.UpdateIdentities(map[identity.NumericIdentity]labels.Labels{1000: lbl("web"), 1001: lbl("web"), 1002: lbl("client")}, nil)
	http80 := map[string][]NamedPort{"http": {{Port: 80, Proto: tcp}}}
	a := e.Compute(Endpoint{Identity: 1000, Labels: lbl("web"), NamedPorts: http80})
	b := e.Compute(Endpoint{Identity: 1001, Labels: lbl("web"), NamedPorts: map[string][]NamedPort{"http": {{Port: 80, Proto: tcp}}}})
	if !a.Equal(b) || len(a.Ingress.Entries) != 2 || &a.Ingress.Entries[0] != &b.Ingress.Entries[0] {
		t.Errorf("two endpoints with the same rules and ports do not share their policy:\n%s\n%s", a.Format(), b.Format())
	}
	c := e.Compute(Endpoint{Identity: 1000, Labels: lbl("web"), NamedPorts: map[string][]NamedPort{"http": {{Port: 8080, Proto: tcp}}}})
	if _, ok := c.Ingress.Get(statepolicy.NewKey(1002, statepolicy.Ingress, tcp, 8080, 16)); !ok || a.Equal(c) {
		t.Errorf("an endpoint with its own named port got another's policy:\n%s", c.Format())
	}
	// A new client: both web endpoints' policies include it.
	e.UpdateIdentities(map[identity.NumericIdentity]labels.Labels{1003: lbl("client")}, nil)
	d := e.Compute(Endpoint{Identity: 1001, Labels: lbl("web"), NamedPorts: http80})
	if _, ok := d.Ingress.Get(statepolicy.NewKey(1003, statepolicy.Ingress, tcp, 22, 16)); !ok {
		t.Errorf("the new client is missing after the identity change:\n%s", d.Format())
	}
	// An identity no selector selects keeps the cache.
	n := e.cache.len()
	e.UpdateIdentities(map[identity.NumericIdentity]labels.Labels{1004: lbl("unrelated")}, nil)
	if e.cache.len() != n || n == 0 {
		t.Errorf("cache held %d policies, %d after an identity no selector selects", n, e.cache.len())
	}
}
