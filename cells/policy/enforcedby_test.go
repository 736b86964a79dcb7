package policy

import (
	"slices"
	"testing"
)

// TestEnforcedBy checks that a direction names the rules that make it
// deny by default: a NetworkPolicy deny-all names the NetworkPolicy, a
// CNP allow names the CNP, a CNP with enableDefaultDeny false names
// nothing, and a direction no rule takes part in names nothing.
func TestEnforcedBy(t *testing.T) {
	w := newWorld(t, ModeDefault).ns("default").
		pod("default/web", "app=web").
		pod("default/client", "app=client")
	w.apply(`
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: deny-all, namespace: default}
spec:
  podSelector: {matchLabels: {app: web}}
  policyTypes: [Ingress]
`)
	w.apply(`
apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: allow-web, namespace: default}
spec:
  endpointSelector: {matchLabels: {app: web}}
  ingress:
  - fromEndpoints: [{matchLabels: {app: client}}]
    toPorts: [{ports: [{port: "80", protocol: TCP}]}]
`)
	w.apply(`
apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: audit-only, namespace: default}
spec:
  endpointSelector: {matchLabels: {app: client}}
  enableDefaultDeny: {egress: false}
  egress:
  - toEndpoints: [{matchLabels: {app: web}}]
`)
	web := w.e.Compute(w.pods["default/web"])
	if want := []string{"CiliumNetworkPolicy/default/allow-web", "NetworkPolicy/default/deny-all"}; !slices.Equal(web.Ingress.EnforcedBy, want) {
		t.Errorf("web ingress enforced by %v, want %v", web.Ingress.EnforcedBy, want)
	}
	if len(web.Egress.EnforcedBy) != 0 || web.Egress.Enforcing {
		t.Errorf("web egress: enforcing %v by %v, want neither", web.Egress.Enforcing, web.Egress.EnforcedBy)
	}
	client := w.e.Compute(w.pods["default/client"])
	if len(client.Egress.EnforcedBy) != 0 {
		t.Errorf("client egress (enableDefaultDeny false) enforced by %v, want none", client.Egress.EnforcedBy)
	}
	// A default-deny drop has no entry: EnforcedBy is what denied it.
	if ok, _, matched := web.Ingress.Decide(w.peer("default/client"), tcp, 81); ok || matched {
		t.Errorf("client -> web tcp/81: allowed %v matched %v, want a default-deny drop", ok, matched)
	}
}
