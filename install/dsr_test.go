package install_test

import (
	"strings"
	"testing"

	"github.com/cellium/cellium/install"
)

// loadBalancer.mode and loadBalancer.dsrDispatch (Cilium's values) become
// the agent's --bpf-lb-mode and --bpf-lb-dsr-dispatch; unset, the chart
// passes neither (the agent's defaults, snat and opt); DSR with tunnel
// routing fails the render naming routingMode native.
func TestChartLBMode(t *testing.T) {
	native := []string{"kubeProxyReplacement=true", "routingMode=native", "ipv4NativeRoutingCIDR=10.0.0.0/8"}
	checkAgentFlags(t, []string{"--bpf-lb-mode", "--bpf-lb-dsr-dispatch"},
		valuesCase{
			set:  append(native, "loadBalancer.mode=dsr", "loadBalancer.dsrDispatch=opt"),
			want: []string{"--bpf-lb-mode=dsr", "--bpf-lb-dsr-dispatch=opt", "--routing-mode=native"},
		},
		// snat is allowed with tunnel routing.
		valuesCase{set: []string{"loadBalancer.mode=snat"}, want: []string{"--bpf-lb-mode=snat"}},
	)
	_, err := install.RenderWith(t.Context(), helm(t), repoRoot(t), "kubeProxyReplacement=true", "loadBalancer.mode=hybrid")
	if err == nil || !strings.Contains(err.Error(), "routingMode=native") {
		t.Errorf("hybrid with tunnel routing: %v, want the render refused naming routingMode=native", err)
	}
}
