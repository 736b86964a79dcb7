package bpfloader_test

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/cellium/cellium/daemon"
	"github.com/cellium/cellium/daemon/bpfloader"
	"github.com/cellium/cellium/daemon/hostlinks"
	"github.com/cellium/cellium/daemon/hostrouting"
	"github.com/cellium/cellium/datapath/bpf"
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
		"--monitor-aggregation=medium (default medium)",
		"--monitor-aggregation-interval=5s (default 5s)",
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

// TestMonitorFlags: the aggregation flags parse into what the programs
// get, with Cilium's defaults; a bad value is refused naming the flag.
func TestMonitorFlags(t *testing.T) {
	m, err := bpfloader.DefaultConfig.Monitor()
	if err != nil || m != bpf.DefaultMonitor {
		t.Errorf("defaults: %+v, %v; want %+v", m, err, bpf.DefaultMonitor)
	}
	c := bpfloader.DefaultConfig
	c.MonitorAggregation, c.MonitorAggregationInterval, c.MonitorAggregationFlags = "none", 10*time.Second, []string{"all"}
	if m, err = c.Monitor(); err != nil || m != (bpf.Monitor{Aggregation: bpf.AggregationNone, ReportInterval: 10 * time.Second, ReportFlags: 0xff}) {
		t.Errorf("none/10s/all: %+v, %v", m, err)
	}
	for _, bad := range []struct {
		mod  func(*bpfloader.Config)
		want string
	}{
		{func(c *bpfloader.Config) { c.MonitorAggregation = "high" }, "--monitor-aggregation"},
		{func(c *bpfloader.Config) { c.MonitorAggregationInterval = 100 * time.Millisecond }, "--monitor-aggregation-interval"},
		{func(c *bpfloader.Config) { c.MonitorAggregationFlags = []string{"syn", "bogus"} }, "--monitor-aggregation-flags"},
	} {
		c := bpfloader.DefaultConfig
		bad.mod(&c)
		if _, err := c.Monitor(); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("%+v: %v, want an error naming %s", c, err, bad.want)
		}
	}
	// The agent refuses to start with one.
	if _, err := run(t, "--monitor-aggregation=high", "hive"); err == nil || !strings.Contains(err.Error(), "monitor aggregation level") {
		t.Errorf("agent with --monitor-aggregation=high: %v", err)
	}
}
