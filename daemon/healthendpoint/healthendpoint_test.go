package healthendpoint_test

import (
	"bytes"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/cellium/cellium/daemon"
	"github.com/cellium/cellium/daemon/healthendpoint"
	"github.com/cellium/cellium/daemon/hostlinks"
	"github.com/cellium/cellium/daemon/hostrouting"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func run(t *testing.T, args ...string) (string, error) {
	t.Helper()
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	var out bytes.Buffer
	cmd := daemon.NewCommand(daemon.Agent, hostlinks.Cell, hostrouting.Cell, healthendpoint.Cell)
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs(args)
	err := cmd.Execute()
	return out.String(), err
}

// The agent's whole graph with the health endpoint cell builds (as
// cellium-agent composes it), with both of Cilium's flags on by default,
// the tables and the jobs.
func TestAgentGraphWithHealthEndpoint(t *testing.T) {
	out, err := run(t, "hive")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"health-endpoint (Health endpoint namespace, veth and responder)",
		"--enable-endpoint-health-checking=true (default true)",
		"--enable-health-checking=true (default true)",
		"⇦ statedb.Table[*health.Netns]",
		"⇦ statedb.Table[*health.Interface]",
		"⇦ statedb.Table[*health.Probe]",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("agent hive output lacks %q:\n%s", want, out)
		}
	}
}

// With both flags off nothing of either cell is built, and the graph
// still does (the endpoint manager and the API take the tables as
// optional).
func TestAgentGraphWithoutHealthChecking(t *testing.T) {
	out, err := run(t, "hive", "--enable-endpoint-health-checking=false", "--enable-health-checking=false")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"--enable-endpoint-health-checking=false (default true): disabled: the cells below are not in the graph",
		"--enable-health-checking=false (default true): disabled: the cells below are not in the graph",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("agent hive output lacks %q:\n%s", want, out)
		}
	}
}
