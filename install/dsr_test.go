package install_test

import (
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"

	"github.com/cellium/cellium/install"
)

// loadBalancer.mode and loadBalancer.dsrDispatch (Cilium's values) become
// the agent's --bpf-lb-mode and --bpf-lb-dsr-dispatch; unset, the chart
// passes neither (the agent's defaults, snat and opt); DSR with tunnel
// routing fails the render naming routingMode native.
func TestChartLBMode(t *testing.T) {
	agentArgs := func(set ...string) []string {
		var ds appsv1.DaemonSet
		if !find(t, renderObjects(t, set...), "DaemonSet", "cellium-agent", &ds) {
			t.Fatal("no DaemonSet cellium-agent")
		}
		return ds.Spec.Template.Spec.Containers[0].Args
	}
	for _, a := range agentArgs() {
		if strings.HasPrefix(a, "--bpf-lb-mode") || strings.HasPrefix(a, "--bpf-lb-dsr-dispatch") {
			t.Errorf("default values pass %s", a)
		}
	}
	native := []string{"kubeProxyReplacement=true", "routingMode=native", "ipv4NativeRoutingCIDR=10.0.0.0/8"}
	args := agentArgs(append(native, "loadBalancer.mode=dsr", "loadBalancer.dsrDispatch=opt")...)
	for _, want := range []string{"--bpf-lb-mode=dsr", "--bpf-lb-dsr-dispatch=opt", "--routing-mode=native"} {
		if !slices.Contains(args, want) {
			t.Errorf("agent args lack %s: %v", want, args)
		}
	}
	if args := agentArgs("loadBalancer.mode=snat"); !slices.Contains(args, "--bpf-lb-mode=snat") {
		t.Errorf("snat with tunnel routing: args %v lack --bpf-lb-mode=snat", args)
	}
	_, err := install.RenderWith(t.Context(), helm(t), repoRoot(t), "kubeProxyReplacement=true", "loadBalancer.mode=hybrid")
	if err == nil || !strings.Contains(err.Error(), "routingMode=native") {
		t.Errorf("hybrid with tunnel routing: %v, want the render refused naming routingMode=native", err)
	}
}
