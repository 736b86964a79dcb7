package daemon_test

import (
	"bytes"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/cellium/cellium/daemon"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func run(t *testing.T, args ...string) (string, error) {
	t.Helper()
	t.Setenv("KUBERNETES_SERVICE_HOST", "") // never in-cluster here
	var out bytes.Buffer
	cmd := daemon.NewCommand(daemon.Agent)
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs(args)
	err := cmd.Execute()
	return out.String(), err
}

// The whole agent graph builds: a wiring mistake fails here.
func TestHiveCommandPrintsModuleTree(t *testing.T) {
	out, err := run(t, "hive")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"Ⓜ️ agent (Cellium Agent):",
		"Ⓜ️ k8s-client (Kubernetes client):",
		"--k8s-client-qps=10 (default 10)",
		"--prometheus-serve-addr=\"\" (default \"\")",
		"Ⓜ️ pods (Pods of this node):",
		"⇦ statedb.Table[*v1.Pod]",
		"Start hooks:",
		"• agent-api-server (agent.infra.agent-api)",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("agent hive output lacks %q", want)
		}
	}
}

func TestDotGraph(t *testing.T) {
	out, err := run(t, "hive", "dot-graph")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(out, "digraph {") || !strings.Contains(out, "k8s.Clientset") {
		t.Fatalf("not a DOT graph of the agent:\n%.300s", out)
	}
}

func TestHelpGroupsFlagsByModule(t *testing.T) {
	out, err := run(t, "--help")
	if err != nil {
		t.Fatal(err)
	}
	client := strings.Index(out, "Flags of agent.infra.k8s-client (Kubernetes client):")
	metrics := strings.Index(out, "Flags of agent.infra.metrics (Prometheus metrics):")
	if client < 0 || metrics < 0 {
		t.Fatalf("help lacks module groups:\n%s", out)
	}
	if section := out[client:metrics]; !strings.Contains(section, "--k8s-kubeconfig-path") || strings.Contains(section, "--prometheus-serve-addr") {
		t.Fatalf("k8s-client group holds the wrong flags:\n%s", section)
	}
}

func TestInvalidFlagValueNamesFlag(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"hive", "--k8s-client-qps=fast"}, "--k8s-client-qps"},
		{[]string{"hive", "--k8s-client-burst=0"}, "--k8s-client-burst"},
		{[]string{"hive", "--no-such-flag"}, "--no-such-flag"},
	} {
		_, err := run(t, tc.args...)
		if err == nil || !strings.Contains(err.Error(), strings.TrimPrefix(tc.want, "--")) {
			t.Errorf("%v: want an error naming %s, got %v", tc.args, tc.want, err)
		}
	}
}

// With --enable-cilium-endpoint-slice the agent's CiliumEndpoint table is
// filled from the slices: it watches slices, not CiliumEndpoints.
func TestCiliumEndpointSliceMode(t *testing.T) {
	out, err := run(t, "hive")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "--enable-cilium-endpoint-slice=false (default false)") ||
		!strings.Contains(out, "job-reflect-k8s-cilium-endpoints (") || strings.Contains(out, "job-reflect-k8s-cilium-endpoint-slices") {
		t.Errorf("default agent: want the flag off and a CiliumEndpoint watch only:\n%s", out)
	}
	out, err = run(t, "hive", "--enable-cilium-endpoint-slice")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(out, "job-reflect-k8s-cilium-endpoints (") || !strings.Contains(out, "job-reflect-k8s-cilium-endpoint-slices (") {
		t.Errorf("slice mode: want a slice watch instead of the CiliumEndpoint watch:\n%s", out)
	}
}
