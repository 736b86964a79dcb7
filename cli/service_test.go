package cli

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/cellium/cellium/statedb/lb"
	"github.com/cellium/cellium/statedb/reconciler"
)

// With kube-proxy replacement the list shows each frontend's type, a
// Local NodePort's external scope with this node's backend and its
// internal scope (/i) with every backend, and a frontend without backends.
func TestWriteServicesKubeProxyReplacement(t *testing.T) {
	a := func(s string, port uint16) lb.L4Addr {
		return lb.L4Addr{Addr: netip.MustParseAddr(s), Port: port, Proto: lb.TCP}
	}
	done := reconciler.Status{Kind: reconciler.StatusDone}
	fes := []*lb.Frontend{
		{Address: a("10.96.0.30", 443), Type: lb.TypeClusterIP, Service: "default/lb", PortName: "https",
			Backends: []lb.L4Addr{a("10.0.1.30", 8443), a("10.0.2.31", 8443)}, BackendIDs: []uint32{3, 4}, Status: done},
		{Address: a("172.16.0.10", 443), Type: lb.TypeLoadBalancer, Service: "default/lb", PortName: "https", Local: true, TwoScopes: true,
			Backends: []lb.L4Addr{a("10.0.1.30", 8443)}, BackendIDs: []uint32{3},
			IntBackends: []lb.L4Addr{a("10.0.1.30", 8443), a("10.0.2.31", 8443)}, IntBackendIDs: []uint32{3, 4}, Status: done},
		{Address: a("192.168.56.11", 30080), Type: lb.TypeNodePort, Service: "default/web", Status: done},
		{Address: a("198.51.100.7", 80), Type: lb.TypeExternalIP, Service: "default/web",
			Backends: []lb.L4Addr{a("10.0.1.20", 8080)}, BackendIDs: []uint32{1}, SessionAffinity: true, AffinityTimeout: 10800, Status: done},
	}
	var b strings.Builder
	if err := writeServices(&b, fes); err != nil {
		t.Fatal(err)
	}
	golden(t, "service-list-kpr", b.String())
}

// With kube-proxy replacement, `cellium service list` is headed by the
// backend selection of the agent's flags; without it (or from an agent
// without the flag) by nothing.
func TestServiceListBackendSelection(t *testing.T) {
	for _, c := range []struct {
		opts map[string]string
		want string
	}{
		{map[string]string{"kube-proxy-replacement": "true", "bpf-lb-algorithm": "maglev", "bpf-lb-maglev-table-size": "16381"},
			"Backend selection (external traffic): Maglev (table size 16381)\n"},
		{map[string]string{"kube-proxy-replacement": "true", "bpf-lb-algorithm": "random"},
			"Backend selection (external traffic): Random\n"},
		{map[string]string{"kube-proxy-replacement": "false", "bpf-lb-algorithm": "maglev"}, ""},
		{map[string]string{"kube-proxy-replacement": "true"}, ""},
	} {
		f := newFakeAgent()
		for k, v := range c.opts {
			f.Config.Options[k] = v
		}
		r := run(t, f.start(t), "service", "list")
		if r.code != 0 || r.stderr != "" {
			t.Fatalf("exit %d, stderr %q", r.code, r.stderr)
		}
		first, _, _ := strings.Cut(r.stdout, "FRONTEND")
		if first != c.want {
			t.Errorf("options %v: list headed by %q, want %q", c.opts, first, c.want)
		}
	}
}
