package policy

import (
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	"github.com/cellium/cellium/statedb/identity"
)

func cnpWorld(t *testing.T, mode Mode) *world {
	return newWorld(t, mode).
		ns("a", "team", "red").ns("b", "team", "blue").
		pod("a/web", "app=web", "http:8080/TCP").
		pod("a/cli", "app=cli").
		pod("a/db", "app=db", "tier=data").
		pod("b/cli", "app=cli").
		pod("b/web", "app=web")
}

func TestCNPEndpointsAndNamespaces(t *testing.T) {
	tests := []struct {
		name   string
		policy string
		checks []check
	}{
		{
			name: "fromEndpoints is scoped to the policy's namespace",
			policy: `
kind: CiliumNetworkPolicy
metadata: {name: p, namespace: a}
spec:
  endpointSelector: {matchLabels: {app: web}}
  ingress: [{fromEndpoints: [{matchLabels: {app: cli}}]}]`,
			checks: []check{
				{"a/cli", "a/web", tcp, 80, true},
				{"a/cli", "a/web", udp, 9, true}, // L3-only: every port
				{"b/cli", "a/web", tcp, 80, false},
				{"a/db", "a/web", tcp, 80, false},
				{"b/cli", "b/web", tcp, 80, true}, // b/web is not selected: the subject is scoped too
			},
		},
		{
			name: "k8s: and any: prefixes and a namespace key",
			policy: `
kind: CiliumNetworkPolicy
metadata: {name: p, namespace: a}
spec:
  endpointSelector: {matchLabels: {"k8s:app": web}}
  ingress:
  - fromEndpoints:
    - matchLabels: {"any:app": cli, "k8s:io.kubernetes.pod.namespace": b}`,
			checks: []check{
				{"b/cli", "a/web", tcp, 80, true},
				{"a/cli", "a/web", tcp, 80, false},
			},
		},
		{
			name: "namespace by label",
			policy: `
kind: CiliumNetworkPolicy
metadata: {name: p, namespace: a}
spec:
  endpointSelector: {matchLabels: {app: web}}
  ingress:
  - fromEndpoints:
    - matchLabels: {"k8s:io.cilium.k8s.namespace.labels.team": blue, "k8s:io.kubernetes.pod.namespace": b}`,
			checks: []check{
				{"b/cli", "a/web", tcp, 80, true},
				{"a/cli", "a/web", tcp, 80, false},
			},
		},
		{
			name: "matchExpressions",
			policy: `
kind: CiliumNetworkPolicy
metadata: {name: p, namespace: a}
spec:
  endpointSelector:
    matchExpressions: [{key: app, operator: In, values: [web, db]}]
  ingress:
  - fromEndpoints:
    - matchExpressions:
      - {key: tier, operator: DoesNotExist}
      - {key: app, operator: NotIn, values: [web]}`,
			checks: []check{
				{"a/cli", "a/web", tcp, 80, true},
				{"a/cli", "a/db", tcp, 80, true},
				{"a/db", "a/web", tcp, 80, false}, // has tier
				{"a/web", "a/db", tcp, 80, false}, // app=web
			},
		},
		{
			name: "an empty endpoint selector selects the namespace",
			policy: `
kind: CiliumNetworkPolicy
metadata: {name: p, namespace: a}
spec:
  endpointSelector: {}
  ingress: [{fromEndpoints: [{}]}]`,
			checks: []check{
				{"a/cli", "a/web", tcp, 80, true},
				{"a/web", "a/db", tcp, 80, true},
				{"b/cli", "a/web", tcp, 80, false},
				{"host", "a/web", tcp, 80, false},
				{"b/cli", "b/web", tcp, 80, true},
			},
		},
		{
			name: "the subject cannot reach into another namespace",
			policy: `
kind: CiliumNetworkPolicy
metadata: {name: p, namespace: a}
spec:
  endpointSelector: {matchLabels: {"k8s:io.kubernetes.pod.namespace": b}}
  ingress: [{}]`,
			checks: []check{
				{"a/cli", "b/web", tcp, 80, true},
				{"a/cli", "a/web", tcp, 80, false}, // the subject became "namespace a"
			},
		},
		{
			name: "CCNP peers select pods of every namespace",
			policy: `
kind: CiliumClusterwideNetworkPolicy
metadata: {name: p}
spec:
  endpointSelector: {matchLabels: {app: web}}
  ingress: [{fromEndpoints: [{matchLabels: {app: cli}}]}, {fromEndpoints: [{}], toPorts: [{ports: [{port: "7"}]}]}]`,
			checks: []check{
				{"a/cli", "a/web", tcp, 80, true},
				{"b/cli", "a/web", tcp, 80, true},
				{"a/cli", "b/web", tcp, 80, true},
				{"a/db", "b/web", tcp, 80, false},
				{"a/db", "b/web", tcp, 7, true},
				{"host", "b/web", tcp, 7, false}, // {} in a CCNP means pods only
			},
		},
		{
			name: "an empty fromEndpoints list selects nothing, a missing one anyone",
			policy: `
kind: CiliumNetworkPolicy
metadata: {name: p, namespace: a}
spec:
  endpointSelector: {matchLabels: {app: web}}
  ingress:
  - {fromEndpoints: [], toPorts: [{ports: [{port: "80", protocol: TCP}]}]}
  - {toPorts: [{ports: [{port: "443", protocol: TCP}]}]}`,
			checks: []check{
				{"a/cli", "a/web", tcp, 80, false},
				{"a/cli", "a/web", tcp, 443, true},
				{"world", "a/web", tcp, 443, true},
				{"host", "a/web", tcp, 443, true},
			},
		},
		{
			name: "ingress: [{}] denies all ingress",
			policy: `
kind: CiliumNetworkPolicy
metadata: {name: p, namespace: a}
spec:
  endpointSelector: {matchLabels: {app: web}}
  ingress: [{}]`,
			checks: []check{
				{"a/cli", "a/web", tcp, 80, false},
				{"host", "a/web", tcp, 80, false},
				{"a/web", "a/cli", tcp, 80, true}, // egress unaffected
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := cnpWorld(t, ModeDefault)
			w.apply(tt.policy)
			w.expect(tt.checks...)
		})
	}
}

func TestCNPEntities(t *testing.T) {
	tests := []struct {
		entity string
		allow  []string
		deny   []string
	}{
		{"world", []string{"world", "world-ipv4", "world-ipv6", "ip:8.8.8.8"}, []string{"host", "remote-node", "a/cli", "health"}},
		{"host", []string{"host"}, []string{"remote-node", "world", "a/cli"}},
		{"remote-node", []string{"remote-node", "kube-apiserver"}, []string{"host", "world"}},
		{"kube-apiserver", []string{"kube-apiserver"}, []string{"remote-node", "host"}},
		{"health", []string{"health"}, []string{"host"}},
		{"init", []string{"init"}, []string{"host"}},
		{"unmanaged", []string{"unmanaged"}, []string{"host"}},
		{"ingress", []string{"ingress"}, []string{"host"}},
		{"cluster", []string{"host", "remote-node", "kube-apiserver", "health", "init", "unmanaged", "ingress", "a/cli", "b/cli"}, []string{"world", "ip:8.8.8.8"}},
		{"all", []string{"host", "world", "a/cli", "b/cli", "ip:1.2.3.4", "remote-node"}, nil},
		{"none", nil, []string{"host", "world", "a/cli"}},
	}
	for _, tt := range tests {
		t.Run(tt.entity, func(t *testing.T) {
			w := cnpWorld(t, ModeDefault)
			w.apply(`
kind: CiliumNetworkPolicy
metadata: {name: p, namespace: a}
spec:
  endpointSelector: {matchLabels: {app: web}}
  ingress: [{fromEntities: [` + tt.entity + `]}]
  egress: [{toEntities: [` + tt.entity + `]}]`)
			for _, p := range tt.allow {
				if !w.ingress(p, "a/web", tcp, 80) || !w.egress("a/web", p, udp, 53) {
					t.Errorf("entity %s does not select %s", tt.entity, p)
				}
			}
			for _, p := range tt.deny {
				if w.ingress(p, "a/web", tcp, 80) || w.egress("a/web", p, udp, 53) {
					t.Errorf("entity %s selects %s", tt.entity, p)
				}
			}
		})
	}
}

func TestCNPCIDR(t *testing.T) {
	w := cnpWorld(t, ModeDefault)
	w.apply(`
kind: CiliumNetworkPolicy
metadata: {name: p, namespace: a}
spec:
  endpointSelector: {matchLabels: {app: web}}
  ingress:
  - fromCIDR: [192.168.0.0/16, 203.0.113.7]
  - fromCIDRSet: [{cidr: 10.0.0.0/8, except: [10.96.0.0/12, 10.1.2.0/24]}]
    toPorts: [{ports: [{port: "80"}]}]
  egress:
  - toCIDR: [0.0.0.0/0]
    toPorts: [{ports: [{port: "443", protocol: TCP}]}]
  - toCIDRSet: [{cidr: 0.0.0.0/0, except: [169.254.0.0/16]}]
    toPorts: [{ports: [{port: "53", protocol: UDP}]}]
`)
	w.expect(
		check{"ip:192.168.3.4", "a/web", tcp, 22, true},
		check{"ip:203.0.113.7", "a/web", udp, 1, true},
		check{"ip:203.0.113.8", "a/web", udp, 1, false},
		check{"ip:10.5.0.1", "a/web", tcp, 80, true},
		check{"ip:10.5.0.1", "a/web", udp, 80, true}, // port without protocol: TCP, UDP and SCTP
		check{"ip:10.5.0.1", "a/web", tcp, 81, false},
		check{"ip:10.97.0.1", "a/web", tcp, 80, false}, // except
		check{"ip:10.1.2.3", "a/web", tcp, 80, false},  // except
		check{"ip:10.1.3.3", "a/web", tcp, 80, true},
		check{"world", "a/web", tcp, 80, false},
		check{"a/cli", "a/web", tcp, 80, false}, // CIDR rules do not select pods
		check{"a/web", "world", tcp, 443, true},
		check{"a/web", "world-ipv4", tcp, 443, true},
		check{"a/web", "ip:192.168.1.1", tcp, 443, true}, // a CIDR identity of another rule is inside 0.0.0.0/0
		check{"a/web", "ip:169.254.1.1", udp, 53, false},
		check{"a/web", "ip:8.8.8.8", udp, 53, true},
		check{"a/web", "a/cli", tcp, 443, false},
	)
	ids := w.e.CIDRIdentities()
	if len(ids) != 6 { // 192.168/16, 203.0.113.7/32, 10/8, 10.96/12, 10.1.2/24, 169.254/16
		t.Errorf("CIDR identities = %v, want 6", ids)
	}
	for p, id := range ids {
		if !id.HasLocalScope() {
			t.Errorf("CIDR identity %d of %s is not node-local", id, p)
		}
	}
}

func TestCNPPorts(t *testing.T) {
	w := cnpWorld(t, ModeDefault)
	w.apply(`
kind: CiliumNetworkPolicy
metadata: {name: p, namespace: a}
spec:
  endpointSelector: {matchLabels: {app: web}}
  ingress:
  - fromEndpoints: [{matchLabels: {app: cli}}]
    toPorts:
    - ports:
      - {port: "80", protocol: TCP}
      - {port: "1000", endPort: 1999, protocol: UDP}
      - {port: "53", protocol: ANY}
      - {port: http}
      - {port: "0", protocol: SCTP}
  - fromEndpoints: [{matchLabels: {app: db}}]
    toPorts: [{ports: [{protocol: ANY}]}]
  - fromEntities: [world]
    icmps: [{fields: [{type: 8}, {type: EchoRequest, family: IPv6}]}]
`)
	w.expect(
		check{"a/cli", "a/web", tcp, 80, true},
		check{"a/cli", "a/web", udp, 80, false},
		check{"a/cli", "a/web", udp, 999, false},
		check{"a/cli", "a/web", udp, 1000, true},
		check{"a/cli", "a/web", udp, 1999, true},
		check{"a/cli", "a/web", udp, 2000, false},
		check{"a/cli", "a/web", tcp, 1500, false},
		check{"a/cli", "a/web", tcp, 53, true},
		check{"a/cli", "a/web", udp, 53, true},
		check{"a/cli", "a/web", sctp, 53, true},
		check{"a/cli", "a/web", tcp, 8080, true}, // named port of a/web
		check{"a/cli", "a/web", sctp, 9999, true},
		check{"a/db", "a/web", 47, 0, true}, // ANY without port: every protocol (GRE here)
		check{"world", "a/web", 1, 8, true},
		check{"world", "a/web", 1, 0, false},
		check{"world", "a/web", 58, 128, true},
		check{"world", "a/web", tcp, 8, false},
	)
}

func TestCNPDeny(t *testing.T) {
	tests := []struct {
		name     string
		policies []string
		checks   []check
	}{
		{
			name: "deny wins over allow of the same rule",
			policies: []string{`
kind: CiliumNetworkPolicy
metadata: {name: p, namespace: a}
spec:
  endpointSelector: {matchLabels: {app: web}}
  ingress: [{fromEntities: [all]}]
  ingressDeny: [{fromEndpoints: [{matchLabels: {app: cli}}], toPorts: [{ports: [{port: "22", protocol: TCP}]}]}]`},
			checks: []check{
				{"a/cli", "a/web", tcp, 22, false},
				{"a/cli", "a/web", tcp, 23, true},
				{"a/db", "a/web", tcp, 22, true},
				{"world", "a/web", tcp, 22, true},
			},
		},
		{
			name: "an L3 deny beats an L4 allow",
			policies: []string{`
kind: CiliumNetworkPolicy
metadata: {name: p, namespace: a}
spec:
  endpointSelector: {matchLabels: {app: web}}
  ingress: [{fromEndpoints: [{matchLabels: {app: cli}}], toPorts: [{ports: [{port: "80", protocol: TCP}]}]}]
  ingressDeny: [{fromEndpoints: [{matchLabels: {app: cli}}]}]`},
			checks: []check{
				{"a/cli", "a/web", tcp, 80, false},
			},
		},
		{
			name: "a port-only deny beats an L3 allow",
			policies: []string{`
kind: CiliumNetworkPolicy
metadata: {name: p, namespace: a}
spec:
  endpointSelector: {matchLabels: {app: web}}
  ingress: [{fromEndpoints: [{matchLabels: {app: cli}}]}]
  ingressDeny: [{toPorts: [{ports: [{port: "1000", endPort: 1010, protocol: TCP}]}]}]`},
			checks: []check{
				{"a/cli", "a/web", tcp, 999, true},
				{"a/cli", "a/web", tcp, 1005, false},
				{"a/cli", "a/web", udp, 1005, true},
			},
		},
		{
			name: "a CNP deny beats a NetworkPolicy allow",
			policies: []string{`
kind: NetworkPolicy
apiVersion: networking.k8s.io/v1
metadata: {name: allow, namespace: a}
spec:
  podSelector: {}
  egress: [{}]
  policyTypes: [Egress]`, `
kind: CiliumClusterwideNetworkPolicy
metadata: {name: lockdown}
spec:
  endpointSelector: {}
  egressDeny: [{toEntities: [world]}]`},
			checks: []check{
				{"a/web", "ip:8.8.8.8", tcp, 443, false},
				{"a/web", "world", tcp, 443, false},
				{"a/web", "b/web", tcp, 443, true},
				{"b/web", "world", tcp, 443, false}, // the CCNP's deny-only rule switches b to default deny
				{"b/web", "a/web", tcp, 443, false},
			},
		},
		{
			name: "deny of a CIDR with except",
			policies: []string{`
kind: CiliumNetworkPolicy
metadata: {name: p, namespace: a}
spec:
  endpointSelector: {matchLabels: {app: web}}
  egress: [{toEntities: [world]}]
  egressDeny: [{toCIDRSet: [{cidr: 10.0.0.0/8, except: [10.1.0.0/16]}]}]`},
			checks: []check{
				{"a/web", "ip:10.2.0.1", tcp, 80, false},
				{"a/web", "ip:10.1.0.1", tcp, 80, true},
				{"a/web", "ip:11.0.0.1", tcp, 80, true},
			},
		},
		{
			name: "enableDefaultDeny false keeps the default allow",
			policies: []string{`
kind: CiliumClusterwideNetworkPolicy
metadata: {name: p}
spec:
  endpointSelector: {}
  enableDefaultDeny: {ingress: false, egress: false}
  ingressDeny: [{fromEntities: [world]}]
  egress: [{toEntities: [world], toPorts: [{ports: [{port: "80"}]}]}]`},
			checks: []check{
				{"world", "a/web", tcp, 80, false},
				{"a/cli", "a/web", tcp, 80, true},
				{"a/web", "world", tcp, 81, true},
			},
		},
		{
			name: "one default-deny rule is enough",
			policies: []string{`
kind: CiliumClusterwideNetworkPolicy
metadata: {name: p}
spec:
  endpointSelector: {}
  enableDefaultDeny: {ingress: false}
  ingress: [{fromEntities: [world]}]`, `
kind: CiliumNetworkPolicy
metadata: {name: q, namespace: a}
spec:
  endpointSelector: {matchLabels: {app: web}}
  ingress: [{fromEndpoints: [{matchLabels: {app: cli}}]}]`},
			checks: []check{
				{"a/cli", "a/web", tcp, 80, true},
				{"a/db", "a/web", tcp, 80, false},
				{"world", "a/web", tcp, 80, true},
				{"a/db", "a/cli", tcp, 80, true}, // only the non-default-deny rule selects a/cli
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := cnpWorld(t, ModeDefault)
			for _, p := range tt.policies {
				w.apply(p)
			}
			w.expect(tt.checks...)
		})
	}
}

func TestModes(t *testing.T) {
	policy := `
kind: CiliumNetworkPolicy
metadata: {name: p, namespace: a}
spec:
  endpointSelector: {matchLabels: {app: web}}
  ingress: [{fromEndpoints: [{matchLabels: {app: cli}}]}]`
	tests := []struct {
		mode   Mode
		checks []check
	}{
		{ModeDefault, []check{{"a/cli", "a/web", tcp, 80, true}, {"a/db", "a/web", tcp, 80, false}, {"a/web", "a/db", tcp, 80, true}}},
		{ModeAlways, []check{{"a/cli", "a/web", tcp, 80, false}, {"a/db", "a/web", tcp, 80, false}, {"a/web", "a/db", tcp, 80, false}}},
		{ModeNever, []check{{"a/cli", "a/web", tcp, 80, true}, {"a/db", "a/web", tcp, 80, true}, {"a/web", "a/db", tcp, 80, true}}},
	}
	for _, tt := range tests {
		t.Run(string(tt.mode), func(t *testing.T) {
			w := cnpWorld(t, tt.mode)
			w.apply(policy)
			w.expect(tt.checks...)
			// With always, a/web's ingress from a/cli passes its own
			// ingress; the connection fails at a/cli's egress.
			if tt.mode == ModeAlways && !w.ingress("a/cli", "a/web", tcp, 80) {
				t.Error("mode always: the rule's allow is missing")
			}
		})
	}
	if _, err := ParseMode("sometimes"); err == nil || !strings.Contains(err.Error(), "--enable-policy") {
		t.Errorf("ParseMode error = %v", err)
	}
}

func TestCNPParse(t *testing.T) {
	doc := `
kind: CiliumNetworkPolicy
metadata: {name: p, namespace: a}
specs:
- endpointSelector: {matchLabels: {app: web}}
  ingress:
  - fromEndpoints: [{matchLabels: {app: cli}}]
    toPorts: [{ports: [{port: "80", protocol: TCP}], rules: {http: [{method: GET}]}}]
- endpointSelector: {matchLabels: {app: web}}
  ingress: [{fromCIDR: [10.0.0.0/40]}]
- endpointSelector: {matchLabels: {app: db}}
  egress: [{toFQDNs: [{matchName: example.com}]}, {toServices: [{k8sService: {serviceName: s, namespace: a}}]}]
- endpointSelector: {matchLabels: {app: db}}
- nodeSelector: {}
  ingress: [{}]
- endpointSelector: {matchLabels: {app: db}}
  ingress: [{fromEntities: [galaxy]}]
- endpointSelector: {matchLabels: {app: db}}
  ingress: [{toPorts: [{ports: [{port: "70000"}]}]}]
`
	var cnp ciliumv2.CiliumNetworkPolicy
	if err := yaml.UnmarshalStrict([]byte(doc), &cnp); err != nil {
		t.Fatal(err)
	}
	rules, err := ParseCNP(&cnp, ParseOptions{})
	if len(rules) != 2 {
		t.Fatalf("got %d rules, want 2 (specs[0], specs[2]); err %v", len(rules), err)
	}
	for _, want := range []string{
		`CiliumNetworkPolicy/a/p: specs[1]: ingress[0].fromCIDR[0]: invalid CIDR "10.0.0.0/40"`,
		"CiliumNetworkPolicy/a/p: specs[3]: the rule has no ingress, ingressDeny, egress or egressDeny section",
		"specs[4]: nodeSelector: only clusterwide policies may select nodes",
		`specs[5]: ingress[0].fromEntities[0]: unknown entity "galaxy"`,
		`specs[6]: ingress[0].toPorts[0].ports[0]: port "70000"`,
	} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v\ndoes not contain %q", err, want)
		}
	}
	if w := strings.Join(rules[0].Warnings, "\n"); !strings.Contains(w, "specs[0].ingress[0].toPorts[0].rules.http: L7 rules are not enforced") {
		t.Errorf("specs[0] warnings = %q", w)
	}
	if w := strings.Join(rules[1].Warnings, "\n"); !strings.Contains(w, "specs[2].egress[0].toFQDNs: not supported") || !strings.Contains(w, "egress[1].toServices: not supported") {
		t.Errorf("specs[2] warnings = %q", w)
	}
	if rules[1].Name() != "CiliumNetworkPolicy/a/p[2]" {
		t.Errorf("rule name %q", rules[1].Name())
	}

	// The rules that parsed are enforced; unsupported peers select nothing
	// (an FQDN-only egress section must not turn into "allow all").
	w := cnpWorld(t, ModeDefault)
	w.e.UpsertRules(rules[0].Source, rules)
	w.expect(
		check{"a/cli", "a/web", tcp, 80, true}, // L7 parsed, allowed at L4
		check{"a/db", "a/web", tcp, 80, false},
		check{"a/db", "ip:1.2.3.4", tcp, 443, false},
		check{"a/db", "a/web", tcp, 443, false},
	)
}

func TestSelectorCacheIncremental(t *testing.T) {
	w := cnpWorld(t, ModeDefault)
	w.apply(`
kind: CiliumNetworkPolicy
metadata: {name: p, namespace: a}
spec:
  endpointSelector: {matchLabels: {app: web}}
  ingress: [{fromEndpoints: [{matchLabels: {app: cli}}]}]`)
	before := w.e.Compute(w.pods["a/web"])
	// A new identity that the peer selector selects.
	w.pod("a/cli2", "app=cli", "version=2")
	after := w.e.Compute(w.pods["a/web"])
	if before.Equal(after) {
		t.Fatal("a new selected identity did not change a/web's policy")
	}
	if ok, _ := after.Ingress.Verdict(w.pods["a/cli2"].Identity, tcp, 1); !ok {
		t.Error("the new identity is not allowed")
	}
	sels := w.e.Selectors()
	found := false
	for _, s := range sels {
		if strings.Contains(s.Selector, "any:app=cli") {
			found = true
			if len(s.Identities) != 2 {
				t.Errorf("selector %s selects %v, want the two cli identities of a", s.Selector, s.Identities)
			}
		}
	}
	if !found {
		t.Errorf("peer selector missing from %v", sels)
	}
	// Deleting the identity removes it again, and reports a/web as affected.
	ch := w.e.UpdateIdentities(nil, []identity.NumericIdentity{w.pods["a/cli2"].Identity})
	if !ch.Affects(w.pods["a/web"].Identity) {
		t.Error("deleting a selected identity does not affect the selecting endpoint")
	}
	if ch.Affects(w.pods["b/web"].Identity) {
		t.Error("deleting an identity affects an unrelated endpoint")
	}
	if !w.e.Compute(w.pods["a/web"]).Equal(before) {
		t.Error("after deleting the identity the policy differs from before")
	}
}
