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
	cmd := daemon.NewCommand(daemon.Agent, hostlinks.Cell, hostrouting.Cell, bpfmaps.ConfigCell, bpfmaps.Cell)
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs(args)
	err := cmd.Execute()
	return out.String(), err
}

// The agent's whole graph with the map cell builds as cellium-agent
// composes it, with the flags and the tables, with the BPF datapath off
// (the default) and on.
func TestAgentGraphWithBPFMaps(t *testing.T) {
	for _, args := range [][]string{{"hive"}, {"hive", "--enable-bpf-datapath"}} {
		out, err := run(t, args...)
		if err != nil {
			t.Fatalf("%v: %v\n%s", args, err, out)
		}
		for _, want := range []string{
			"bpf-maps (Reconciles the ipcache, endpoint and policy tables into BPF maps)",
			"--enable-bpf-datapath=",
			"--bpf-root=/sys/fs/bpf",
			"⇦ statedb.Table[*mapstate.PolicyMap]",
			"⇦ statedb.Table[*mapstate.Endpoint]",
			"⇦ statedb.Table[*ipcache.Entry]",
		} {
			if !strings.Contains(out, want) {
				t.Errorf("%v: agent hive output lacks %q", args, want)
			}
		}
	}
}
