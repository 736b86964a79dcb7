package bpfloader_test

import (
	"bytes"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/cellium/cellium/daemon"
	"github.com/cellium/cellium/daemon/bpfloader"
	"github.com/cellium/cellium/daemon/hostlinks"
	"github.com/cellium/cellium/daemon/hostrouting"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func run(t *testing.T, args ...string) (string, error) {
	t.Helper()
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	var out bytes.Buffer
	cmd := daemon.NewCommand(daemon.Agent, hostlinks.Cell, hostrouting.Cell, bpfloader.Cell)
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs(args)
	err := cmd.Execute()
	return out.String(), err
}

// The agent's whole graph with the loader cell builds (as cellium-agent
// composes it), shows the flags and the table, and the endpoint manager
// and the CEP synchronizer read the table.
func TestAgentGraphWithLoader(t *testing.T) {
	out, err := run(t, "hive")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"bpf-loader (Per-endpoint eBPF programs on the pod veths)",
		"--enable-bpf-datapath=true (default true)",
		"--bpf-root=/sys/fs/bpf (default /sys/fs/bpf)",
		"--policy-audit-mode=false (default false)",
		"⇦ statedb.Table[*bpfprog.Program]",
		"statedb.Table[*bpfprog.Program] (optional)", // the endpoint manager and cep-sync
	} {
		if !strings.Contains(out, want) {
			t.Errorf("agent hive output lacks %q", want)
		}
	}
	if t.Failed() {
		t.Log(out)
	}
}

// With the flag off nothing of the cell is built, and the graph still
// does (the endpoint manager then makes endpoints ready without programs).
func TestAgentGraphWithoutLoader(t *testing.T) {
	out, err := run(t, "hive", "--enable-bpf-datapath=false")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "--enable-bpf-datapath=false (default true): disabled: the cells below are not in the graph") {
		t.Errorf("the loader cell is not shown disabled with --enable-bpf-datapath=false:\n%s", out)
	}
}

// An empty --bpf-root is refused with a message naming the flag.
func TestEmptyBPFRootRefused(t *testing.T) {
	_, err := run(t, "hive", "--bpf-root=")
	if err == nil || !strings.Contains(err.Error(), "--bpf-root") {
		t.Fatalf("hive with --bpf-root= : %v, want an error naming --bpf-root", err)
	}
}
