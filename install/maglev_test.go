package install_test

import (
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
)

// loadBalancer.algorithm and maglev.tableSize/hashSeed (Cilium's values)
// become the agent's --bpf-lb-algorithm and --bpf-lb-maglev-* flags; unset,
// the chart passes none (the agent's defaults, Cilium's).
func TestChartMaglev(t *testing.T) {
	agentArgs := func(set ...string) []string {
		var ds appsv1.DaemonSet
		if !find(t, renderObjects(t, set...), "DaemonSet", "cellium-agent", &ds) {
			t.Fatal("no DaemonSet cellium-agent")
		}
		return ds.Spec.Template.Spec.Containers[0].Args
	}
	for _, a := range agentArgs() {
		if strings.HasPrefix(a, "--bpf-lb-algorithm") || strings.HasPrefix(a, "--bpf-lb-maglev") {
			t.Errorf("default values pass %s", a)
		}
	}
	args := agentArgs("kubeProxyReplacement=true", "loadBalancer.algorithm=maglev", "maglev.tableSize=65521",
		"maglev.hashSeed=AAECAwQFBgcICQoL")
	for _, want := range []string{"--bpf-lb-algorithm=maglev", "--bpf-lb-maglev-table-size=65521",
		"--bpf-lb-maglev-hash-seed=AAECAwQFBgcICQoL"} {
		if !slices.Contains(args, want) {
			t.Errorf("agent args lack %s: %v", want, args)
		}
	}
}
