package policy

import (
	"testing"
)

// The examples of the Kubernetes NetworkPolicy documentation
// (concepts/services-networking/network-policies), as verdict matrices.

func TestNetworkPolicyDocExample(t *testing.T) {
	w := newWorld(t, ModeDefault).
		ns("default").ns("myproject", "project", "myproject").ns("other").
		pod("default/db", "role=db").
		pod("default/frontend", "role=frontend").
		pod("default/backend", "role=backend").
		pod("myproject/any", "app=x").
		pod("other/frontend", "role=frontend")
	w.apply(`
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: test-network-policy, namespace: default}
spec:
  podSelector: {matchLabels: {role: db}}
  policyTypes: [Ingress, Egress]
  ingress:
  - from:
    - ipBlock: {cidr: 172.17.0.0/16, except: [172.17.1.0/24]}
    - namespaceSelector: {matchLabels: {project: myproject}}
    - podSelector: {matchLabels: {role: frontend}}
    ports: [{protocol: TCP, port: 6379}]
  egress:
  - to: [{ipBlock: {cidr: 10.0.0.0/24}}]
    ports: [{protocol: TCP, port: 5978}]
`)
	w.expect(
		check{"default/frontend", "default/db", tcp, 6379, true},
		check{"default/frontend", "default/db", tcp, 6380, false},
		check{"default/frontend", "default/db", udp, 6379, false},
		check{"default/backend", "default/db", tcp, 6379, false},
		check{"myproject/any", "default/db", tcp, 6379, true},
		check{"other/frontend", "default/db", tcp, 6379, false}, // podSelector is namespace-local
		check{"ip:172.17.2.3", "default/db", tcp, 6379, true},
		check{"ip:172.17.1.3", "default/db", tcp, 6379, false}, // except
		check{"ip:8.8.8.8", "default/db", tcp, 6379, false},
		check{"world", "default/db", tcp, 6379, false},
		check{"host", "default/db", tcp, 6379, false},
		// Egress of db: only 10.0.0.0/24 on tcp/5978.
		check{"default/db", "ip:10.0.0.7", tcp, 5978, true},
		check{"default/db", "ip:10.0.1.7", tcp, 5978, false},
		check{"default/db", "ip:10.0.0.7", tcp, 5979, false},
		check{"default/db", "default/frontend", tcp, 5978, false},
		// Other pods are not selected: everything passes.
		check{"default/backend", "default/frontend", udp, 53, true},
		check{"default/frontend", "ip:8.8.8.8", tcp, 443, true},
	)
}

func TestNetworkPolicyDefaults(t *testing.T) {
	const (
		denyIngress = `
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: default-deny-ingress, namespace: a}
spec:
  podSelector: {}
  policyTypes: [Ingress]
`
		allowAllIngress = `
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: allow-all-ingress, namespace: a}
spec:
  podSelector: {}
  ingress: [{}]
`
		denyEgress = `
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: default-deny-egress, namespace: a}
spec:
  podSelector: {}
  policyTypes: [Egress]
`
		allowAllEgress = `
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: allow-all-egress, namespace: a}
spec:
  podSelector: {}
  egress: [{}]
  policyTypes: [Egress]
`
		denyAll = `
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: default-deny-all, namespace: a}
spec:
  podSelector: {}
  policyTypes: [Ingress, Egress]
`
		noTypesNoRules = `
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: bare, namespace: a}
spec:
  podSelector: {}
`
		noTypesEgressRules = `
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: egress-only-rules, namespace: a}
spec:
  podSelector: {}
  egress: [{ports: [{port: 53, protocol: UDP}]}]
`
		egressTypeIgnoresIngress = `
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: egress-type, namespace: a}
spec:
  podSelector: {}
  policyTypes: [Egress]
  ingress: [{ports: [{port: 80}]}]
  egress: [{}]
`
	)
	tests := []struct {
		name     string
		policies []string
		in, out  bool // does b -> a/x tcp/80 pass; does a/x -> b tcp/80 pass
	}{
		{"none", nil, true, true},
		{"default-deny-ingress", []string{denyIngress}, false, true},
		{"allow-all-ingress", []string{allowAllIngress}, true, true},
		{"deny then allow all ingress add up", []string{denyIngress, allowAllIngress}, true, true},
		{"default-deny-egress", []string{denyEgress}, true, false},
		{"allow-all-egress", []string{allowAllEgress}, true, true},
		{"default-deny-all", []string{denyAll}, false, false},
		{"deny all plus allow all egress", []string{denyAll, allowAllEgress}, false, true},
		{"policyTypes missing: ingress only", []string{noTypesNoRules}, false, true},
		{"policyTypes missing, egress rules: both", []string{noTypesEgressRules}, false, false},
		{"policyTypes Egress ignores ingress rules", []string{egressTypeIgnoresIngress}, true, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := newWorld(t, ModeDefault).pod("a/x", "app=x").pod("b/y", "app=y")
			for _, p := range tt.policies {
				w.apply(p)
			}
			w.expect(
				check{"b/y", "a/x", tcp, 80, tt.in},
				check{"a/x", "b/y", tcp, 80, tt.out},
			)
		})
	}
	t.Run("egress rule allows udp/53 only", func(t *testing.T) {
		w := newWorld(t, ModeDefault).pod("a/x", "app=x").pod("b/y", "app=y")
		w.apply(noTypesEgressRules)
		w.expect(
			check{"a/x", "b/y", udp, 53, true},
			check{"a/x", "ip:1.1.1.1", udp, 53, true},
			check{"a/x", "b/y", tcp, 53, false},
		)
	})
}

func TestNetworkPolicySelectors(t *testing.T) {
	w := newWorld(t, ModeDefault).
		ns("prod", "env", "prod", "team", "a").ns("dev", "env", "dev", "team", "a").ns("web").
		pod("web/server", "app=server").
		pod("prod/client", "app=client").
		pod("prod/other", "app=other").
		pod("dev/client", "app=client").
		pod("web/client", "app=client")
	// AND: namespaceSelector and podSelector in one peer.
	w.apply(`
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: and, namespace: web}
spec:
  podSelector: {matchLabels: {app: server}}
  ingress:
  - from:
    - namespaceSelector: {matchLabels: {env: prod}}
      podSelector: {matchLabels: {app: client}}
    ports: [{port: 80}]
  - from:
    - namespaceSelector: {matchLabels: {env: dev}}
    - podSelector: {matchLabels: {app: client}}
    ports: [{port: 81}]
  - from:
    - namespaceSelector: {}
    ports: [{port: 82}]
  - from:
    - namespaceSelector:
        matchExpressions: [{key: kubernetes.io/metadata.name, operator: In, values: [dev]}]
    ports: [{port: 83}]
  - from:
    - podSelector:
        matchExpressions: [{key: app, operator: NotIn, values: [client]}]
    ports: [{port: 84}]
`)
	w.expect(
		check{"prod/client", "web/server", tcp, 80, true},
		check{"prod/other", "web/server", tcp, 80, false},
		check{"dev/client", "web/server", tcp, 80, false},
		check{"web/client", "web/server", tcp, 80, false},
		// OR: any pod of dev, or client pods of web.
		check{"dev/client", "web/server", tcp, 81, true},
		check{"web/client", "web/server", tcp, 81, true},
		check{"prod/client", "web/server", tcp, 81, false},
		// An empty namespaceSelector: every pod of every namespace, no host or world.
		check{"prod/other", "web/server", tcp, 82, true},
		check{"web/client", "web/server", tcp, 82, true},
		check{"host", "web/server", tcp, 82, false},
		check{"world", "web/server", tcp, 82, false},
		// By namespace name.
		check{"dev/client", "web/server", tcp, 83, true},
		check{"prod/client", "web/server", tcp, 83, false},
		// NotIn within the policy's namespace: the server itself matches.
		check{"web/server", "web/server", tcp, 84, true},
		check{"web/client", "web/server", tcp, 84, false},
		check{"prod/other", "web/server", tcp, 84, false},
	)
}

func TestNetworkPolicyPorts(t *testing.T) {
	w := newWorld(t, ModeDefault).
		pod("a/srv", "app=srv", "http:8080/TCP", "dns:5353/UDP", "metrics:9090/TCP").
		pod("a/srv2", "app=srv", "http:9000/TCP").
		pod("a/cli", "app=cli")
	w.apply(`
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: ports, namespace: a}
spec:
  podSelector: {matchLabels: {app: srv}}
  ingress:
  - ports:
    - {port: http}
    - {port: dns, protocol: UDP}
    - {port: metrics, protocol: UDP}
    - {port: 32000, endPort: 32768}
    - {protocol: SCTP}
`)
	w.expect(
		check{"a/cli", "a/srv", tcp, 8080, true},   // named port of this pod
		check{"a/cli", "a/srv2", tcp, 9000, true},  // same name, other number on another pod
		check{"a/cli", "a/srv2", tcp, 8080, false}, // not srv2's http
		check{"a/cli", "a/srv", udp, 5353, true},
		check{"a/cli", "a/srv", tcp, 5353, false},
		check{"a/cli", "a/srv", udp, 9090, false}, // metrics is TCP
		check{"a/cli", "a/srv", tcp, 9090, false},
		check{"a/cli", "a/srv", tcp, 31999, false},
		check{"a/cli", "a/srv", tcp, 32000, true},
		check{"a/cli", "a/srv", tcp, 32500, true},
		check{"a/cli", "a/srv", tcp, 32768, true},
		check{"a/cli", "a/srv", tcp, 32769, false},
		check{"a/cli", "a/srv", udp, 32000, false}, // protocol defaults to TCP
		check{"a/cli", "a/srv", sctp, 1, true},     // every SCTP port
		check{"world", "a/srv", sctp, 65535, true}, // from anywhere
	)
}

func TestNetworkPolicyParseErrors(t *testing.T) {
	for _, tt := range []struct{ name, doc, want string }{
		{"bad cidr", `{kind: NetworkPolicy, metadata: {name: p, namespace: a}, spec: {podSelector: {}, ingress: [{from: [{ipBlock: {cidr: 10.0.0.0/33}}]}]}}`, "spec.ingress[0]: peers[0]: ipBlock.cidr"},
		{"except outside", `{kind: NetworkPolicy, metadata: {name: p, namespace: a}, spec: {podSelector: {}, ingress: [{from: [{ipBlock: {cidr: 10.0.0.0/8, except: [11.0.0.0/8]}}]}]}}`, "ipBlock.except[0]: 11.0.0.0/8 is not inside 10.0.0.0/8"},
		{"endPort below port", `{kind: NetworkPolicy, metadata: {name: p, namespace: a}, spec: {podSelector: {}, egress: [{ports: [{port: 80, endPort: 79}]}]}}`, "spec.egress[0]: ports[0]: endPort 79"},
		{"bad operator", `{kind: NetworkPolicy, metadata: {name: p, namespace: a}, spec: {podSelector: {matchExpressions: [{key: a, operator: Foo}]}}}`, "spec.podSelector: matchExpressions[0]: unknown operator"},
		{"empty peer", `{kind: NetworkPolicy, metadata: {name: p, namespace: a}, spec: {podSelector: {}, ingress: [{from: [{}]}]}}`, "needs podSelector, namespaceSelector or ipBlock"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := parseNPYAML(t, tt.doc)
			if err == nil || !contains(err.Error(), tt.want) || !contains(err.Error(), "NetworkPolicy/a/p") {
				t.Errorf("error = %v, want one containing %q and the policy's name", err, tt.want)
			}
		})
	}
}
