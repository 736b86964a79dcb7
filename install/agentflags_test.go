package install_test

import (
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
)

// agentArgs renders the chart with the values set and returns the agent
// container's arguments.
func agentArgs(t *testing.T, set ...string) []string {
	t.Helper()
	var ds appsv1.DaemonSet
	if !find(t, renderObjects(t, set...), "DaemonSet", "cellium-agent", &ds) {
		t.Fatal("no DaemonSet cellium-agent")
	}
	return ds.Spec.Template.Spec.Containers[0].Args
}

// valuesCase is chart values and agent arguments they must give.
type valuesCase struct {
	set  []string
	want []string
}

// checkAgentFlags checks that the chart's default values pass no agent
// argument starting with one of unset (the agent's defaults apply), and
// that each case's values give all of its arguments.
func checkAgentFlags(t *testing.T, unset []string, cases ...valuesCase) {
	t.Helper()
	for _, a := range agentArgs(t) {
		for _, p := range unset {
			if strings.HasPrefix(a, p) {
				t.Errorf("default values pass %s", a)
			}
		}
	}
	for _, c := range cases {
		args := agentArgs(t, c.set...)
		for _, want := range c.want {
			if !slices.Contains(args, want) {
				t.Errorf("values %v: agent args lack %s: %v", c.set, want, args)
			}
		}
	}
}
