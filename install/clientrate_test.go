package install_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/cellium/cellium/cells/cesbatcher"
	"github.com/cellium/cellium/cells/hive/hivetest"
	"github.com/cellium/cellium/cells/k8s"
	"github.com/cellium/cellium/operator"
)

// operatorClientConfig parses args with the operator's own flags and
// returns the configuration its Kubernetes client is made with.
func operatorClientConfig(t *testing.T, args []string) k8s.Config {
	t.Helper()
	var cfg k8s.Config
	if err := hivetest.New(t, args, operator.Operator, hivetest.Capture(&cfg)).Populate(); err != nil {
		t.Fatalf("the operator refuses the chart's arguments %v: %v", args, err)
	}
	return cfg
}

// k8sClientRateLimit (Cilium's value) sets the agent's and the operator's
// client rate limits; unset, the operator's client allows Cilium's 100
// requests a second with bursts of 200, so that it never throttles the
// CiliumEndpointSlice writes below the chart's highest
// ciliumEndpointSlice.rateLimits step (it did at the agent's 10 and 20:
// the operator wrote 10 slices a second whatever the step).
func TestChartK8sClientRateLimit(t *testing.T) {
	checkAgentFlags(t, []string{"--k8s-client-qps", "--k8s-client-burst"},
		valuesCase{set: []string{"k8sClientRateLimit.qps=30", "k8sClientRateLimit.burst=60"},
			want: []string{"--k8s-client-qps=30", "--k8s-client-burst=60"}})

	args := operatorArgs(t, "ciliumEndpointSlice.enabled=true")
	if i := slices.IndexFunc(args, func(a string) bool { return strings.HasPrefix(a, "--operator-k8s-client") }); i >= 0 {
		t.Errorf("default values pass %s", args[i])
	}
	cfg := operatorClientConfig(t, args)
	if cfg.K8sClientQPS != 100 || cfg.K8sClientBurst != 200 {
		t.Errorf("operator client rate %v/s burst %d, want Cilium's 100/s and 200", cfg.K8sClientQPS, cfg.K8sClientBurst)
	}
	steps, err := cesbatcher.ParseRateLimits(cesbatcher.ChartRateLimits)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range steps {
		if float64(cfg.K8sClientQPS) < s.Limit || cfg.K8sClientBurst < s.Burst {
			t.Errorf("operator client rate %v/s burst %d is below the chart's slice write step %+v", cfg.K8sClientQPS, cfg.K8sClientBurst, s)
		}
	}

	args = operatorArgs(t, "k8sClientRateLimit.operator.qps=150", "k8sClientRateLimit.operator.burst=300")
	for _, want := range []string{"--operator-k8s-client-qps=150", "--operator-k8s-client-burst=300"} {
		if !slices.Contains(args, want) {
			t.Errorf("operator args lack %s: %v", want, args)
		}
	}
	if cfg := operatorClientConfig(t, args); cfg.K8sClientQPS != 150 || cfg.K8sClientBurst != 300 {
		t.Errorf("operator client rate %v/s burst %d, want 150/s and 300", cfg.K8sClientQPS, cfg.K8sClientBurst)
	}
}
