package install_test

import "testing"

// loadBalancer.algorithm and maglev.tableSize/hashSeed (Cilium's values)
// become the agent's --bpf-lb-algorithm and --bpf-lb-maglev-* flags; unset,
// the chart passes none (the agent's defaults, Cilium's).
func TestChartMaglev(t *testing.T) {
	checkAgentFlags(t, []string{"--bpf-lb-algorithm", "--bpf-lb-maglev"},
		valuesCase{
			set: []string{"kubeProxyReplacement=true", "loadBalancer.algorithm=maglev", "maglev.tableSize=65521",
				"maglev.hashSeed=AAECAwQFBgcICQoL"},
			want: []string{"--bpf-lb-algorithm=maglev", "--bpf-lb-maglev-table-size=65521",
				"--bpf-lb-maglev-hash-seed=AAECAwQFBgcICQoL"},
		})
}
