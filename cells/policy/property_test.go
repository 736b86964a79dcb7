package policy

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/cellium/cellium/statedb/identity"
	"github.com/cellium/cellium/statedb/labels"
	statepolicy "github.com/cellium/cellium/statedb/policy"
)

// The property tests compare the engine with a reference evaluator that
// applies the rule semantics directly, packet by packet, without selector
// cache, keys or port prefixes.

// referenceVerdict decides one packet for endpoint ep in direction d from
// the peer (id, lbls) with the rules, by the documented semantics.
func referenceVerdict(e *Engine, rules []*Rule, ep Endpoint, d statepolicy.Direction, id identity.NumericIdentity, lbls labels.Labels, proto uint8, port uint16) bool {
	if e.mode == ModeNever {
		return true
	}
	selecting, defaultDeny, allowed := 0, false, false
	for _, r := range rules {
		if r.Subject == nil || !r.Subject.MatchesLabels(ep.Labels) || len(r.entries(d)) == 0 {
			continue
		}
		selecting++
		defaultDeny = defaultDeny || r.defaultDeny(d)
		for _, ent := range r.entries(d) {
			if !refPeer(ent, id, lbls) || !refPorts(e, ep, d, ent.Ports, proto, port) {
				continue
			}
			if ent.Deny {
				return false
			}
			allowed = true
		}
	}
	if selecting == 0 {
		return e.mode != ModeAlways
	}
	return allowed || !defaultDeny
}

func refPeer(ent *Entry, id identity.NumericIdentity, lbls labels.Labels) bool {
	if ent.AnyPeer {
		return true
	}
	for _, m := range ent.Peers {
		if m.Matches(id, lbls) {
			return true
		}
	}
	return false
}

func refPorts(e *Engine, ep Endpoint, d statepolicy.Direction, ports []PortSpec, proto uint8, port uint16) bool {
	if ports == nil {
		return true
	}
	l4 := func(want uint8) bool {
		if want == 0 {
			return proto == tcp || proto == udp || proto == sctp
		}
		return proto == want
	}
	for _, p := range ports {
		switch {
		case p.ICMP:
			if proto == p.Proto && port == p.Port {
				return true
			}
		case p.Name != "":
			named := ep.NamedPorts
			if d == statepolicy.Egress {
				named = e.egressNP
			}
			for _, np := range named[p.Name] {
				if p.Proto != 0 && np.Proto != 0 && np.Proto != p.Proto {
					continue
				}
				want := p.Proto
				if want == 0 {
					want = np.Proto
				}
				if l4(want) && port == np.Port {
					return true
				}
			}
		case p.Port == 0:
			if p.Proto == 0 || proto == p.Proto {
				return true
			}
		default:
			if l4(p.Proto) && port >= p.Port && port <= max(p.EndPort, p.Port) {
				return true
			}
		}
	}
	return false
}

// gen generates random identities and rules over a small label universe,
// so that selectors often overlap.
type gen struct {
	r *rand.Rand
}

var (
	genApps   = []string{"a", "b", "c"}
	genNS     = []string{"x", "y"}
	genCIDRs  = []string{"10.0.0.0/8", "10.1.0.0/16", "10.1.2.0/24", "192.168.0.0/16", "0.0.0.0/0", "10.1.2.3/32"}
	genPorts  = []uint16{0, 22, 53, 80, 81, 443, 1000, 8080, 65535}
	genProtos = []uint8{0, tcp, udp, sctp}
	genNames  = []string{"http", "dns"}
)

func (g *gen) pick(n int) int { return g.r.IntN(n) }

func (g *gen) podLabels() labels.Labels {
	pl := map[string]string{"app": genApps[g.pick(len(genApps))]}
	if g.pick(2) == 0 {
		pl["tier"] = fmt.Sprint(g.pick(2))
	}
	ns := genNS[g.pick(len(genNS))]
	all := labels.FromK8sPod(pl, ns, map[string]string{"kubernetes.io/metadata.name": ns, "env": ns + "env"}, "", "")
	id, _ := labels.DefaultFilter().Split(all)
	return id
}

func (g *gen) selector(peer bool) *Selector {
	var reqs []Requirement
	for range g.pick(3) {
		switch g.pick(5) {
		case 0:
			reqs = append(reqs, Requirement{Source: labels.SourceAny, Key: "app", Op: OpIn, Values: []string{genApps[g.pick(3)]}})
		case 1:
			reqs = append(reqs, Requirement{Source: labels.SourceK8s, Key: "app", Op: OpNotIn, Values: []string{genApps[g.pick(3)], genApps[g.pick(3)]}})
		case 2:
			reqs = append(reqs, Requirement{Source: labels.SourceAny, Key: "tier", Op: []Operator{OpExists, OpDoesNotExist}[g.pick(2)]})
		case 3:
			reqs = append(reqs, Requirement{Source: labels.SourceK8s, Key: labels.PodNamespaceLabel, Op: OpIn, Values: []string{genNS[g.pick(2)]}})
		case 4:
			if peer {
				reqs = append(reqs, Requirement{Source: labels.SourceReserved, Key: []string{"host", "world", "remote-node"}[g.pick(3)], Op: OpExists})
			}
		}
	}
	return NewSelector(reqs...)
}

func (g *gen) ports() []PortSpec {
	if g.pick(3) == 0 {
		return nil
	}
	var out []PortSpec
	for range 1 + g.pick(2) {
		p := PortSpec{Proto: genProtos[g.pick(len(genProtos))]}
		switch g.pick(6) {
		case 0:
		case 1:
			p.Name = genNames[g.pick(2)]
		case 2:
			p.Port = genPorts[1+g.pick(len(genPorts)-1)]
			p.EndPort = p.Port + uint16(g.pick(1000))
			if p.EndPort < p.Port {
				p.EndPort = 65535
			}
		case 3:
			p = PortSpec{Proto: statepolicy.ProtoICMP, Port: uint16(g.pick(2) * 8), ICMP: true}
		default:
			p.Port = genPorts[1+g.pick(len(genPorts)-1)]
		}
		out = append(out, p)
	}
	return out
}

func (g *gen) entry(deny bool) *Entry {
	e := &Entry{Deny: deny, Ports: g.ports()}
	switch g.pick(6) {
	case 0:
		e.AnyPeer = true
	case 1:
		pfx := netip.MustParsePrefix(genCIDRs[g.pick(len(genCIDRs))])
		var except []netip.Prefix
		if g.pick(2) == 0 {
			except = append(except, netip.MustParsePrefix(genCIDRs[g.pick(len(genCIDRs))]))
		}
		e.Peers = append(e.Peers, NewCIDRSelector(pfx, except...))
	default:
		for range 1 + g.pick(2) {
			e.Peers = append(e.Peers, g.selector(true))
		}
	}
	return e
}

func (g *gen) rule(src Source, idx int) *Rule {
	r := &Rule{Source: src, Index: idx, Subject: g.selector(false),
		IngressDefaultDeny: g.pick(5) != 0, EgressDefaultDeny: g.pick(5) != 0}
	for range g.pick(3) {
		r.Ingress = append(r.Ingress, g.entry(g.pick(4) == 0))
	}
	for range g.pick(3) {
		r.Egress = append(r.Egress, g.entry(g.pick(4) == 0))
	}
	return r
}

func (g *gen) namedPorts() map[string][]NamedPort {
	m := map[string][]NamedPort{}
	for _, n := range genNames {
		if g.pick(2) == 0 {
			m[n] = append(m[n], NamedPort{Port: genPorts[1+g.pick(len(genPorts)-1)], Proto: genProtos[1+g.pick(3)]})
		}
	}
	return m
}

// probePorts are the ports checked per protocol: the generator's ports and
// their neighbours (range edges).
func probePorts() []uint16 {
	var out []uint16
	for _, p := range genPorts {
		out = append(out, p, p+1, p-1, p+999, p+1000)
	}
	return slices.Compact(slices.Sorted(slices.Values(out)))
}

// checkAgainstReference compares the engine's computed policies with the
// reference for every endpoint identity, peer identity, protocol and probe
// port.
func checkAgainstReference(t *testing.T, e *Engine, rules []*Rule, eps []Endpoint) {
	t.Helper()
	peers := map[identity.NumericIdentity]labels.Labels{}
	for id, l := range e.sc.identities {
		peers[id] = l
	}
	ports := probePorts()
	fails := 0
	for _, ep := range eps {
		pol := e.Compute(ep)
		for _, d := range []statepolicy.Direction{statepolicy.Ingress, statepolicy.Egress} {
			dp := pol.Direction(d)
			for id, lbls := range peers {
				for _, proto := range []uint8{tcp, udp, sctp, statepolicy.ProtoICMP, 47} {
					for _, port := range ports {
						if proto == statepolicy.ProtoICMP && port > 255 {
							continue
						}
						got, ent := dp.Verdict(id, proto, port)
						want := referenceVerdict(e, rules, ep, d, id, lbls, proto, port)
						if got != want {
							fails++
							if fails <= 5 {
								t.Errorf("endpoint %d (%s) %s peer %d (%s) %s/%d: engine %v (entry %v), reference %v\n%s",
									ep.Identity, ep.Labels, d, id, lbls, statepolicy.ProtoName(proto), port, got, ent, want, pol.Format())
							}
						}
					}
				}
			}
		}
	}
	if fails > 5 {
		t.Errorf("... %d mismatches in all", fails)
	}
}

func TestComputeMatchesReference(t *testing.T) {
	for seed := range uint64(60) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			g := &gen{r: rand.New(rand.NewPCG(seed, 7))}
			mode := []Mode{ModeDefault, ModeDefault, ModeDefault, ModeAlways, ModeNever}[g.pick(5)]
			e := NewEngine(mode)
			e.SetEgressNamedPorts(g.namedPorts())
			var eps []Endpoint
			for i := range 6 {
				id := identity.NumericIdentity(1000 + i)
				lbls := g.podLabels()
				e.UpdateIdentities(map[identity.NumericIdentity]labels.Labels{id: lbls}, nil)
				eps = append(eps, Endpoint{Identity: id, Labels: lbls, NamedPorts: g.namedPorts()})
			}
			var rules []*Rule
			for i := range 1 + g.pick(5) {
				src := Source{Kind: KindCNP, Namespace: "x", Name: fmt.Sprint("r", i)}
				r := g.rule(src, 0)
				rules = append(rules, r)
				e.UpsertRules(src, []*Rule{r})
			}
			// An endpoint the engine knows only by labels.
			eps = append(eps, Endpoint{Labels: g.podLabels()})
			checkAgainstReference(t, e, rules, eps)
		})
	}
}

// normalized prints a policy with local (CIDR) identities replaced by their
// labels, so that engines that numbered prefixes differently compare equal.
func normalized(e *Engine, p *statepolicy.EndpointPolicy) string {
	var b strings.Builder
	for _, d := range []statepolicy.Direction{statepolicy.Ingress, statepolicy.Egress} {
		dp := p.Direction(d)
		fmt.Fprintf(&b, "%s %v\n", d, dp.Enforcing)
		var lines []string
		for _, en := range dp.Entries {
			id := en.Identity.StringID()
			if en.Identity.HasLocalScope() {
				l, _ := e.IdentityLabels(en.Identity)
				id = l.String()
			}
			k := en.Key
			k.Identity = 0
			lines = append(lines, fmt.Sprintf("%s %s deny=%v %v", id, k, en.Deny, en.DerivedFrom))
		}
		slices.Sort(lines)
		b.WriteString(strings.Join(lines, "\n"))
		b.WriteString("\n")
	}
	return b.String()
}

// TestIncrementalMatchesScratch applies random churn (identities appearing,
// disappearing and changing labels; rules added, changed and deleted) to
// one engine and checks after every step that (1) the endpoints the step
// reports as unaffected kept their policy, and (2) the policies equal those
// of an engine built from scratch from the same state.
func TestIncrementalMatchesScratch(t *testing.T) {
	for seed := range uint64(25) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			g := &gen{r: rand.New(rand.NewPCG(seed, 11))}
			e := NewEngine(ModeDefault)
			idents := map[identity.NumericIdentity]labels.Labels{}
			rules := map[Source][]*Rule{}
			ports := map[identity.NumericIdentity]map[string][]NamedPort{}
			ep := func(id identity.NumericIdentity) Endpoint {
				return Endpoint{Identity: id, Labels: idents[id], NamedPorts: ports[id]}
			}
			snapshot := func() map[identity.NumericIdentity]string {
				m := map[identity.NumericIdentity]string{}
				for id := range idents {
					m[id] = normalized(e, e.Compute(ep(id)))
				}
				return m
			}
			for step := range 40 {
				before := snapshot()
				var ch Changes
				var what string
				switch op := g.pick(5); {
				case op == 0 || len(idents) < 3:
					id := identity.NumericIdentity(1000 + g.pick(12))
					idents[id] = g.podLabels()
					ports[id] = g.namedPorts()
					ch = e.UpdateIdentities(map[identity.NumericIdentity]labels.Labels{id: idents[id]}, nil)
					ch.add(id) // its named ports changed too: the caller recomputes it
					what = fmt.Sprintf("upsert identity %d %s", id, idents[id])
				case op == 1:
					ids := slices.Sorted(func(yield func(identity.NumericIdentity) bool) {
						for id := range idents {
							if !yield(id) {
								return
							}
						}
					})
					id := ids[g.pick(len(ids))]
					delete(idents, id)
					ch = e.UpdateIdentities(nil, []identity.NumericIdentity{id})
					what = fmt.Sprintf("delete identity %d", id)
				case op == 2 && len(rules) > 0:
					var srcs []Source
					for s := range rules {
						srcs = append(srcs, s)
					}
					slices.SortFunc(srcs, func(a, b Source) int { return strings.Compare(a.Name, b.Name) })
					src := srcs[g.pick(len(srcs))]
					delete(rules, src)
					ch = e.DeleteRules(src)
					what = "delete " + src.String()
				default:
					src := Source{Kind: KindCCNP, Name: fmt.Sprint("p", g.pick(6))}
					var rs []*Rule
					for i := range 1 + g.pick(2) {
						rs = append(rs, g.rule(src, i))
					}
					rules[src] = rs
					ch = e.UpsertRules(src, rs)
					what = "upsert " + src.String()
				}
				after := snapshot()
				for id, p := range after {
					if b, ok := before[id]; ok && b != p && !ch.Affects(id) {
						t.Fatalf("step %d (%s): identity %d's policy changed but the change does not report it\nbefore:\n%s\nafter:\n%s", step, what, id, b, p)
					}
				}
				// From scratch, rules first this time.
				fresh := NewEngine(ModeDefault)
				for src, rs := range rules {
					fresh.UpsertRules(src, rs)
				}
				fresh.UpdateIdentities(idents, nil)
				for id := range idents {
					if got, want := after[id], normalized(fresh, fresh.Compute(ep(id))); got != want {
						t.Fatalf("step %d (%s): identity %d: incremental\n%s\nfrom scratch\n%s", step, what, id, got, want)
					}
				}
			}
		})
	}
}
