package install_test

import (
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
)

// pprof.* and operator.pprof.* (Cilium's values) give the agent and the
// operator Cilium's pprof flags; by default neither gets any.
func TestChartPprof(t *testing.T) {
	args := func(set ...string) (agent, operator []string) {
		objs := renderObjects(t, set...)
		var ds appsv1.DaemonSet
		if !find(t, objs, "DaemonSet", "cellium-agent", &ds) {
			t.Fatal("no DaemonSet cellium-agent")
		}
		var dep appsv1.Deployment
		if !find(t, objs, "Deployment", "cellium-operator", &dep) {
			t.Fatal("no Deployment cellium-operator")
		}
		return ds.Spec.Template.Spec.Containers[0].Args, dep.Spec.Template.Spec.Containers[0].Args
	}
	agent, operator := args()
	for _, a := range append(agent, operator...) {
		if strings.Contains(a, "pprof") {
			t.Errorf("default chart passes %s", a)
		}
	}
	agent, operator = args("pprof.enabled=true", "pprof.port=7060",
		"operator.pprof.enabled=true", "operator.pprof.address=0.0.0.0")
	for _, want := range []string{"--pprof=true", "--pprof-address=localhost", "--pprof-port=7060"} {
		if !slices.Contains(agent, want) {
			t.Errorf("agent args %v lack %s", agent, want)
		}
	}
	for _, want := range []string{"--operator-pprof=true", "--operator-pprof-address=0.0.0.0", "--operator-pprof-port=6061"} {
		if !slices.Contains(operator, want) {
			t.Errorf("operator args %v lack %s", operator, want)
		}
	}
}
