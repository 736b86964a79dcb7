package policy

import (
	"net/netip"
	"strings"
	"testing"

	networkingv1 "k8s.io/api/networking/v1"
	"sigs.k8s.io/yaml"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	"github.com/cellium/cellium/statedb/identity"
	"github.com/cellium/cellium/statedb/labels"
	statepolicy "github.com/cellium/cellium/statedb/policy"
)

// world is a small cluster for tests: namespaces with labels, pods with
// identities, an engine fed with policies.
type world struct {
	t      *testing.T
	e      *Engine
	nsLbls map[string]map[string]string
	pods   map[string]Endpoint // "ns/name"
	nextID identity.NumericIdentity
	byKey  map[string]identity.NumericIdentity // labels.SortedList -> id
}

func newWorld(t *testing.T, mode Mode) *world {
	t.Helper()
	return &world{t: t, e: NewEngine(mode), nsLbls: map[string]map[string]string{},
		pods: map[string]Endpoint{}, nextID: 1000, byKey: map[string]identity.NumericIdentity{}}
}

// ns declares a namespace with labels (kubernetes.io/metadata.name is
// added as Kubernetes does).
func (w *world) ns(name string, kv ...string) *world {
	m := map[string]string{"kubernetes.io/metadata.name": name}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	w.nsLbls[name] = m
	return w
}

// pod adds a pod "ns/name" with labels given as "k=v" and optional named
// ports "name:port/proto".
func (w *world) pod(key string, lbls ...string) *world {
	w.t.Helper()
	ns, _, _ := strings.Cut(key, "/")
	if _, ok := w.nsLbls[ns]; !ok {
		w.ns(ns)
	}
	pl := map[string]string{}
	named := map[string][]NamedPort{}
	for _, kv := range lbls {
		if name, rest, ok := strings.Cut(kv, ":"); ok {
			port, proto, _ := strings.Cut(rest, "/")
			n := mustAtoi(w.t, port)
			pr := map[string]uint8{"TCP": 6, "UDP": 17, "SCTP": 132}[proto]
			named[name] = append(named[name], NamedPort{Port: uint16(n), Proto: pr})
			continue
		}
		k, v, _ := strings.Cut(kv, "=")
		pl[k] = v
	}
	all := labels.FromK8sPod(pl, ns, w.nsLbls[ns], "default", "")
	idl, _ := labels.DefaultFilter().Split(all)
	id, ok := w.byKey[idl.SortedList()]
	if !ok {
		id = w.nextID
		w.nextID++
		w.byKey[idl.SortedList()] = id
		w.e.UpdateIdentities(map[identity.NumericIdentity]labels.Labels{id: idl}, nil)
	}
	w.pods[key] = Endpoint{Identity: id, Labels: idl, NamedPorts: named}
	return w
}

func mustAtoi(t *testing.T, s string) int {
	t.Helper()
	n := 0
	for _, c := range s {
		if c < '0' || c > '9' {
			t.Fatalf("not a number: %q", s)
		}
		n = n*10 + int(c-'0')
	}
	return n
}

// apply parses a YAML policy (NetworkPolicy, CNP or CCNP by kind) and
// upserts it.
func (w *world) apply(doc string) []*Rule {
	w.t.Helper()
	var meta struct{ Kind string }
	if err := yaml.Unmarshal([]byte(doc), &meta); err != nil {
		w.t.Fatalf("policy YAML: %v", err)
	}
	var (
		rules []*Rule
		src   Source
		err   error
	)
	switch meta.Kind {
	case "NetworkPolicy":
		var np networkingv1.NetworkPolicy
		if err := yaml.UnmarshalStrict([]byte(doc), &np); err != nil {
			w.t.Fatalf("NetworkPolicy YAML: %v", err)
		}
		var r *Rule
		r, err = ParseNetworkPolicy(&np, ParseOptions{})
		if r != nil {
			rules, src = []*Rule{r}, r.Source
		}
	case "CiliumNetworkPolicy":
		var cnp ciliumv2.CiliumNetworkPolicy
		if err := yaml.UnmarshalStrict([]byte(doc), &cnp); err != nil {
			w.t.Fatalf("CNP YAML: %v", err)
		}
		rules, err = ParseCNP(&cnp, ParseOptions{})
		src = Source{Kind: KindCNP, Namespace: cnp.Namespace, Name: cnp.Name}
	case "CiliumClusterwideNetworkPolicy":
		var ccnp ciliumv2.CiliumClusterwideNetworkPolicy
		if err := yaml.UnmarshalStrict([]byte(doc), &ccnp); err != nil {
			w.t.Fatalf("CCNP YAML: %v", err)
		}
		rules, err = ParseCCNP(&ccnp, ParseOptions{})
		src = Source{Kind: KindCCNP, Name: ccnp.Name}
	default:
		w.t.Fatalf("unknown kind %q", meta.Kind)
	}
	if err != nil {
		w.t.Fatalf("parse policy: %v", err)
	}
	w.e.UpsertRules(src, rules)
	return rules
}

// peer resolves a traffic end: "ns/pod", "ip:A.B.C.D" (through the CIDR
// identities, else world), or a reserved name ("host", "world", ...).
func (w *world) peer(s string) identity.NumericIdentity {
	w.t.Helper()
	if ip, ok := strings.CutPrefix(s, "ip:"); ok {
		a := netip.MustParseAddr(ip)
		best, bits := identity.ReservedIdentityWorld, -1
		for p, id := range w.e.CIDRIdentities() {
			if p.Contains(a) && p.Bits() > bits {
				best, bits = id, p.Bits()
			}
		}
		return best
	}
	if id, ok := identity.LookupReservedByName(s); ok {
		return id
	}
	ep, ok := w.pods[s]
	if !ok {
		w.t.Fatalf("no pod %q", s)
	}
	return ep.Identity
}

// ingress reports whether dst (a pod) accepts proto/port from src.
func (w *world) ingress(src, dst string, proto uint8, port uint16) bool {
	w.t.Helper()
	p := w.e.Compute(w.pods[dst])
	ok, _ := p.Ingress.Verdict(w.peer(src), proto, port)
	return ok
}

// egress reports whether src (a pod) may send proto/port to dst.
func (w *world) egress(src, dst string, proto uint8, port uint16) bool {
	w.t.Helper()
	p := w.e.Compute(w.pods[src])
	ok, _ := p.Egress.Verdict(w.peer(dst), proto, port)
	return ok
}

// conn reports whether a connection passes both src's egress (when src is
// a pod) and dst's ingress (when dst is a pod).
func (w *world) conn(src, dst string, proto uint8, port uint16) bool {
	w.t.Helper()
	if _, ok := w.pods[src]; ok && !w.egress(src, dst, proto, port) {
		return false
	}
	if _, ok := w.pods[dst]; ok && !w.ingress(src, dst, proto, port) {
		return false
	}
	return true
}

const (
	tcp  = statepolicy.ProtoTCP
	udp  = statepolicy.ProtoUDP
	sctp = statepolicy.ProtoSCTP
)

// check is one expected verdict: "src -> dst proto/port".
type check struct {
	src, dst string
	proto    uint8
	port     uint16
	want     bool
}

func (w *world) expect(checks ...check) {
	w.t.Helper()
	for _, c := range checks {
		if got := w.conn(c.src, c.dst, c.proto, c.port); got != c.want {
			w.t.Errorf("%s -> %s %s/%d: allowed=%v, want %v", c.src, c.dst, statepolicy.ProtoName(c.proto), c.port, got, c.want)
		}
	}
}

func parseNPYAML(t *testing.T, doc string) (*Rule, error) {
	t.Helper()
	var np networkingv1.NetworkPolicy
	if err := yaml.Unmarshal([]byte(doc), &np); err != nil {
		t.Fatalf("NetworkPolicy YAML: %v", err)
	}
	return ParseNetworkPolicy(&np, ParseOptions{})
}

func contains(s, sub string) bool { return strings.Contains(s, sub) }
