package bpfmaps_test

import (
	"bytes"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/cellium/cellium/daemon"
	"github.com/cellium/cellium/daemon/bpfmaps"
	"github.com/cellium/cellium/daemon/hostlinks"
	"github.com/cellium/cellium/daemon/hostrouting"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func run(t *testing.T, args ...string) (string, error) {
	t.Helper()
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	var out bytes.Buffer
	cmd := daemon.NewCommand(daemon.Agent, hostlinks.Cell, hostrouting.Cell, bpfmaps.Cell)
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs(args)
	err := cmd.Execute()
	return out.String(), err
}

// The agent's whole graph with the map cell builds: on by default with
// its flag, config and tables, and nothing of it in the graph when off.
// (cellium-agent composes Maps with the loader: daemon/bpfdatapath.)
func TestAgentGraphWithBPFMaps(t *testing.T) {
	out, err := run(t, "hive", "--enable-bpf-datapath=false")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if !strings.Contains(out, "--enable-bpf-datapath=false (default true): disabled: the cells below are not in the graph") {
		t.Errorf("the map cell is not shown disabled with --enable-bpf-datapath=false:\n%s", out)
	}
	out, err = run(t, "hive")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	for _, want := range []string{
		"bpf-maps (Reconciles the ipcache, endpoint and policy tables into BPF maps)",
		"--enable-bpf-datapath=true (default true)",
		"--bpf-root=/sys/fs/bpf",
		"--conntrack-gc-interval=0s",
		"⇦ statedb.Table[*mapstate.PolicyMap]",
		"⇦ statedb.Table[*mapstate.Endpoint]",
		"⇦ statedb.Table[*ipcache.Entry]",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("agent hive output lacks %q:\n%s", want, out)
		}
	}
}
