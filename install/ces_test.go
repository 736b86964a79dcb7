package install_test

import (
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"

	"github.com/cellium/cellium/cells/cesbatcher"
	"github.com/cellium/cellium/cells/hive/hivetest"
	"github.com/cellium/cellium/operator"
)

// operatorArgs renders the chart with the values set and returns the
// operator container's arguments.
func operatorArgs(t *testing.T, set ...string) []string {
	t.Helper()
	var dep appsv1.Deployment
	if !find(t, renderObjects(t, set...), "Deployment", "cellium-operator", &dep) {
		t.Fatal("no Deployment cellium-operator")
	}
	return dep.Spec.Template.Spec.Containers[0].Args
}

// operatorRateLimits parses args with the operator's own flags and
// returns the slice batcher's write-rate steps.
func operatorRateLimits(t *testing.T, args []string) (cesbatcher.RateLimits, error) {
	t.Helper()
	var cfg cesbatcher.Config
	if err := hivetest.New(t, args, operator.Operator, hivetest.Capture(&cfg)).Populate(); err != nil {
		return nil, err
	}
	return cfg.RateLimits()
}

// ciliumEndpointSlice.rateLimits (Cilium's value and default) becomes the
// operator's --ces-rate-limits when slices are on: with the chart's
// default the operator writes 10 slices a second below 100 CiliumNodes
// and 50 from 100 on.
func TestChartCESRateLimits(t *testing.T) {
	hasRateFlag := func(args []string) bool {
		return slices.ContainsFunc(args, func(a string) bool { return strings.HasPrefix(a, "--ces-rate-limits") })
	}
	if args := operatorArgs(t); hasRateFlag(args) {
		t.Errorf("slices off, the operator gets a rate: %v", args)
	}
	args := operatorArgs(t, "ciliumEndpointSlice.enabled=true")
	if want := "--ces-rate-limits=" + cesbatcher.ChartRateLimits; !slices.Contains(args, want) {
		t.Errorf("operator args %v lack %s", args, want)
	}
	steps, err := operatorRateLimits(t, args)
	if err != nil {
		t.Fatalf("the operator refuses the chart's arguments %v: %v", args, err)
	}
	if want := (cesbatcher.RateLimits{{Nodes: 0, Limit: 10, Burst: 20}, {Nodes: 100, Limit: 50, Burst: 100}}); !slices.Equal(steps, want) {
		t.Errorf("steps %v, want %v", steps, want)
	}
	for nodes, limit := range map[int]float64{0: 10, 99: 10, 100: 50, 1000: 50} {
		if got := steps.For(nodes).Limit; got != limit {
			t.Errorf("%d nodes: %v writes/s, want %v", nodes, got, limit)
		}
	}

	// A list of the user's.
	args = operatorArgs(t, "ciliumEndpointSlice.enabled=true", "ciliumEndpointSlice.rateLimits[0].nodes=0",
		"ciliumEndpointSlice.rateLimits[0].limit=5", "ciliumEndpointSlice.rateLimits[0].burst=10",
		"ciliumEndpointSlice.rateLimits[1].nodes=500", "ciliumEndpointSlice.rateLimits[1].limit=40",
		"ciliumEndpointSlice.rateLimits[1].burst=80")
	if steps, err := operatorRateLimits(t, args); err != nil || !slices.Equal(steps, cesbatcher.RateLimits{{Nodes: 0, Limit: 5, Burst: 10}, {Nodes: 500, Limit: 40, Burst: 80}}) {
		t.Errorf("user's steps from %v: %v, %v", args, steps, err)
	}
	// None: the operator's default.
	args = operatorArgs(t, "ciliumEndpointSlice.enabled=true", "ciliumEndpointSlice.rateLimits=null")
	if hasRateFlag(args) {
		t.Errorf("rateLimits=null still passes a rate: %v", args)
	}
	if steps, err := operatorRateLimits(t, args); err != nil || !slices.Equal(steps, cesbatcher.RateLimits{{Nodes: 0, Limit: 10, Burst: 20}}) {
		t.Errorf("without rateLimits: %v, %v; want the operator's default", steps, err)
	}
	// Above Cilium's documented maximum: the operator refuses to start.
	args = operatorArgs(t, "ciliumEndpointSlice.enabled=true", "ciliumEndpointSlice.rateLimits[0].limit=60")
	if _, err := operatorRateLimits(t, args); err == nil || !strings.Contains(err.Error(), "--ces-rate-limits") {
		t.Errorf("limit 60: err = %v, want one naming --ces-rate-limits", err)
	}
}
