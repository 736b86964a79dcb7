package policy

import (
	"net/netip"
	"strings"
	"testing"
)

func TestTrace(t *testing.T) {
	w := cnpWorld(t, ModeDefault)
	w.apply(`
kind: CiliumNetworkPolicy
metadata: {name: web, namespace: a}
spec:
  endpointSelector: {matchLabels: {app: web}}
  ingress: [{fromEndpoints: [{matchLabels: {app: cli}}], toPorts: [{ports: [{port: "80", protocol: TCP}]}]}]
---`[:0] + `
kind: CiliumNetworkPolicy
metadata: {name: web, namespace: a}
spec:
  endpointSelector: {matchLabels: {app: web}}
  ingress: [{fromEndpoints: [{matchLabels: {app: cli}}], toPorts: [{ports: [{port: "80", protocol: TCP}]}]}]
  egressDeny: [{toEntities: [world]}]
  egress: [{toEntities: [all]}]`)
	end := func(pod string) TraceEnd { return TraceEnd{Identity: w.pods[pod].Identity} }

	tr := w.e.Trace(end("a/cli"), end("a/web"), tcp, 80)
	out := tr.Format()
	for _, want := range []string{
		"Egress of the source: not enforcing",
		"Ingress of the destination: enforcing, 1 rule(s) select it\n    CiliumNetworkPolicy/a/web\n",
		"decided by: ingress 1001 tcp/80 allow CiliumNetworkPolicy/a/web: ALLOWED",
		"Final verdict: ALLOWED\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("trace a/cli -> a/web tcp/80 lacks %q:\n%s", want, out)
		}
	}
	if tr := w.e.Trace(end("a/cli"), end("a/web"), tcp, 81); tr.Allowed || !strings.Contains(tr.Format(), "no entry matches: DENIED") ||
		!strings.HasSuffix(tr.Format(), "Final verdict: DENIED\n") {
		t.Errorf("trace tcp/81:\n%s", tr.Format())
	}
	// The source's egress deny decides, whatever the destination says.
	tr = w.e.Trace(end("a/web"), TraceEnd{Addr: netip.MustParseAddr("8.8.8.8")}, tcp, 443)
	if tr.Allowed || !strings.Contains(tr.Format(), "egress 2 any deny CiliumNetworkPolicy/a/web: DENIED") ||
		!strings.Contains(tr.Format(), "Ingress of the destination: not an endpoint") {
		t.Errorf("trace to world:\n%s", tr.Format())
	}
	// By labels only (no identity known).
	tr = w.e.Trace(TraceEnd{Labels: w.pods["a/cli"].Labels}, TraceEnd{Labels: w.pods["a/web"].Labels}, tcp, 80)
	if !tr.Allowed {
		t.Errorf("trace by labels:\n%s", tr.Format())
	}
}
