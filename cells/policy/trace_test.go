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

// An endpoint end with its address: a CIDR rule naming the address (an
// ipBlock naming a pod) decides as well as rules on the identity, as in
// the datapath; without the address only the identity counts.
func TestTracePodAddressInCIDR(t *testing.T) {
	w := cnpWorld(t, ModeDefault)
	w.apply(`
kind: CiliumNetworkPolicy
metadata: {name: cli, namespace: a}
spec:
  endpointSelector: {matchLabels: {app: cli}}
  egress: [{toCIDR: [10.9.0.7/32], toPorts: [{ports: [{port: "80", protocol: TCP}]}]}]`)
	cli := TraceEnd{Identity: w.pods["a/cli"].Identity}
	web := TraceEnd{Identity: w.pods["a/web"].Identity, Addr: netip.MustParseAddr("10.9.0.7")}
	if tr := w.e.Trace(cli, web, tcp, 80); !tr.Allowed {
		t.Errorf("a/cli -> a/web at 10.9.0.7 (the CIDR's address):\n%s", tr.Format())
	}
	if tr := w.e.Trace(cli, TraceEnd{Identity: web.Identity}, tcp, 80); tr.Allowed {
		t.Errorf("a/cli -> a/web without its address must be denied:\n%s", tr.Format())
	}
	other := TraceEnd{Identity: web.Identity, Addr: netip.MustParseAddr("10.9.0.8")}
	if tr := w.e.Trace(cli, other, tcp, 80); tr.Allowed {
		t.Errorf("a/cli -> a/web at another address must be denied:\n%s", tr.Format())
	}
	if _, err := ParseTraceEnd("dst", "1234", "", "10.9.0.7"); err != nil {
		t.Errorf("identity with its address: %v", err)
	}
	if _, err := ParseTraceEnd("dst", "", "app=x", "10.9.0.7"); err == nil {
		t.Error("labels with an address must be refused")
	}
}
