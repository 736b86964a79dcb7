package bpfdatapath_test

import (
	"bytes"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/cellium/cellium/daemon"
	"github.com/cellium/cellium/daemon/bpfdatapath"
	"github.com/cellium/cellium/daemon/datapathmonitor"
	"github.com/cellium/cellium/daemon/healthendpoint"
	"github.com/cellium/cellium/daemon/hostlinks"
	"github.com/cellium/cellium/daemon/hostrouting"
	"github.com/cellium/cellium/datapath/bpf"
	"github.com/cellium/cellium/datapath/lbmode"
	"github.com/cellium/cellium/datapath/maglev"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// run runs the agent command composed as cellium-agent's main composes it.
func run(t *testing.T, args ...string) (string, error) {
	t.Helper()
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	var out bytes.Buffer
	cmd := daemon.NewCommand(daemon.Agent, hostlinks.Cell, hostrouting.Cell, healthendpoint.Cell, bpfdatapath.Cell, datapathmonitor.Cell)
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs(args)
	err := cmd.Execute()
	return out.String(), err
}

// The loader and the map reconcilers share one switch and one --bpf-root
// (a flag registered twice would fail the graph), and both their tables
// are in the graph.
func TestAgentGraph(t *testing.T) {
	out, err := run(t, "hive")
	if err != nil {
		t.Fatalf("agent graph: %v\n%s", err, out)
	}
	for _, want := range []string{
		"bpf-datapath (eBPF programs on the pod veths and the maps they read)",
		"--enable-bpf-datapath=true (default true)",
		"--bpf-root=/sys/fs/bpf (default /sys/fs/bpf)",
		"--policy-audit-mode=false (default false)",
		"⇦ statedb.Table[*bpfprog.Program]",
		"⇦ statedb.Table[*mapstate.PolicyMap]",
		"socket-lb (Socket load balancer: Service ClusterIPs translated at connect and sendmsg)",
		"--bpf-lb-sock=true (default true)",
		"--cgroup-root=/run/cellium/cgroupv2",
		"⇦ statedb.Table[*lb.Frontend]",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("agent hive output lacks %q", want)
		}
	}
	for _, once := range []string{"--enable-bpf-datapath=", "--bpf-root="} {
		if n := strings.Count(out, once); n != 1 {
			t.Errorf("%s appears %d times in the graph, want once", once, n)
		}
	}
	if t.Failed() {
		t.Log(out)
	}
}

// With the switch off neither the loader nor the map reconcilers are built.
func TestAgentGraphOff(t *testing.T) {
	out, err := run(t, "hive", "--enable-bpf-datapath=false")
	if err != nil {
		t.Fatalf("agent graph: %v\n%s", err, out)
	}
	if !strings.Contains(out, "--enable-bpf-datapath=false (default true): disabled: the cells below are not in the graph") {
		t.Errorf("the BPF datapath is not shown disabled with --enable-bpf-datapath=false:\n%s", out)
	}
}

// A relative --bpf-root is refused with a message naming the flag.
func TestRelativeBPFRootRefused(t *testing.T) {
	_, err := run(t, "hive", "--bpf-root=relative")
	if err == nil || !strings.Contains(err.Error(), "--bpf-root") {
		t.Fatalf("hive with --bpf-root=relative: %v, want an error naming --bpf-root", err)
	}
}

// The uplink program's configuration comes from --kube-proxy-replacement
// and --devices; --devices is there only with the host routing cell.
func TestNodePortConfig(t *testing.T) {
	c := bpfdatapath.NodePortConfig(bpfdatapath.NodePortParams{})
	if c == nil || c.KubeProxyReplacement || len(c.Devices) != 0 {
		t.Errorf("default: %+v, want off, detected devices", c)
	}
	p := bpfdatapath.NodePortParams{}
	p.SocketLB.KubeProxyReplacement = "true"
	p.Routing.Devices = []string{"eth0", "eth1"}
	if c := bpfdatapath.NodePortConfig(p); !c.KubeProxyReplacement || strings.Join(c.Devices, ",") != "eth0,eth1" {
		t.Errorf("--kube-proxy-replacement=true --devices=eth0,eth1: %+v", c)
	}
	out, err := run(t, "hive", "--kube-proxy-replacement=true")
	if err != nil {
		t.Fatalf("agent graph with --kube-proxy-replacement=true: %v\n%s", err, out)
	}
	for _, want := range []string{"--kube-proxy-replacement=true (default false)", "--enable-host-port=false (default false)", "*loader.NodePortConfig"} {
		if !strings.Contains(out, want) {
			t.Errorf("agent hive output lacks %q", want)
		}
	}
}

// --bpf-lb-algorithm=maglev gives the uplink program the table size and
// the packet hash's seed; random gives it 0 (no table is read).
func TestNodePortConfigMaglev(t *testing.T) {
	p := bpfdatapath.NodePortParams{Maglev: maglev.DefaultConfig}
	p.SocketLB.KubeProxyReplacement = "true"
	if c := bpfdatapath.NodePortConfig(p); c.MaglevTableSize != 0 {
		t.Errorf("random: table size %d, want 0", c.MaglevTableSize)
	}
	p.Maglev.Algorithm, p.Maglev.TableSize, p.Maglev.HashSeed = maglev.AlgorithmMaglev, 251, "AAECAwQFBgcICQoL"
	if c := bpfdatapath.NodePortConfig(p); c.MaglevTableSize != 251 || c.MaglevSeed != 0x04050607 {
		t.Errorf("maglev: %+v, want table size 251, seed 0x04050607", c)
	}
}

// --bpf-lb-mode and --bpf-lb-dsr-dispatch are the agent's flags with
// Cilium's defaults; DSR with --routing-mode=tunnel is refused while the
// kube-proxy replacement is on, accepted with native routing, and the
// mode reaches the uplink program's configuration.
func TestLBModeFlags(t *testing.T) {
	out, err := run(t, "hive")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"--bpf-lb-mode=snat (default snat)", "--bpf-lb-dsr-dispatch=opt (default opt)"} {
		if !strings.Contains(out, want) {
			t.Errorf("agent hive output lacks %q", want)
		}
	}
	_, err = run(t, "hive", "--kube-proxy-replacement=true", "--bpf-lb-mode=dsr")
	if err == nil || !strings.Contains(err.Error(), "--routing-mode=tunnel") || !strings.Contains(err.Error(), "--routing-mode=native") {
		t.Errorf("dsr with tunnel routing: %v, want refused naming --routing-mode=native", err)
	}
	if _, err := run(t, "hive", "--kube-proxy-replacement=true", "--bpf-lb-mode=hybrid", "--routing-mode=tunnel"); err == nil {
		t.Error("hybrid with tunnel routing accepted")
	}
	if out, err := run(t, "hive", "--kube-proxy-replacement=true", "--bpf-lb-mode=dsr", "--routing-mode=native",
		"--enable-ipv4-masquerade=false"); err != nil {
		t.Errorf("dsr with native routing: %v\n%s", err, out)
	}
	if _, err := run(t, "hive", "--bpf-lb-mode=dr"); err == nil || !strings.Contains(err.Error(), "--bpf-lb-mode") {
		t.Errorf("--bpf-lb-mode=dr: %v, want refused naming the flag", err)
	}
	if _, err := run(t, "hive", "--bpf-lb-dsr-dispatch=geneve"); err == nil || !strings.Contains(err.Error(), "--bpf-lb-dsr-dispatch") {
		t.Errorf("--bpf-lb-dsr-dispatch=geneve: %v, want refused naming the flag", err)
	}
	p := bpfdatapath.NodePortParams{LBMode: lbmode.Config{Mode: lbmode.ModeHybrid, DSRDispatch: lbmode.DispatchOption}}
	if c := bpfdatapath.NodePortConfig(p); c.LBMode != bpf.LBModeHybrid {
		t.Errorf("hybrid: uplink program mode %d, want %d", c.LBMode, bpf.LBModeHybrid)
	}
}
