package benchdatapath

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cellium/cellium/test/harness"
	"github.com/cellium/cellium/test/privileged"
)

// mounts returns /proc/self/mountinfo, where the bench's netns and bpffs
// mounts appear while they exist.
func mounts(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestPrivilegedBenchRuns runs the bench once at its smallest and checks
// it prints every figure (throughput, request/response, both policy update
// latencies, the reconcilers, the aims), that each is present and sane,
// and that it leaves no namespace or bpffs mount behind. It asserts
// nothing about how fast anything is.
func TestPrivilegedBenchRuns(t *testing.T) {
	privileged.Require(t)
	for _, bin := range []string{"iperf3", "sockperf", "nsenter", "ss"} {
		if _, err := exec.LookPath(bin); err != nil {
			if os.Getenv(privileged.EnvVar) == "1" {
				t.Fatalf("%s missing and %s=1: run make deps", bin, privileged.EnvVar)
			}
			t.Skipf("%s missing: run make deps", bin)
		}
	}
	before := mounts(t)
	var out bytes.Buffer
	res, err := Run(context.Background(), Config{
		Duration: time.Second, Rounds: 1, Updates: 3, AgentUpdates: 3, StreamInterval: time.Millisecond,
		IPCachePrefixes: 100, PolicyEntries: 10,
		ReconcilerPolicyEntries: 1000, ReconcilerPrefixes: 2000, ReconcilerRounds: 1,
	}, &out)
	if err != nil {
		t.Fatalf("Run: %v\n%s", err, out.String())
	}
	for _, want := range []string{"round 1 bare", "round 1 stack", "round 1 redirect", "TCP throughput (iperf3)", "TCP_RR (sockperf",
		"through the agent:", "policy map written directly", "update -> first packet dropped", "update -> first packet through",
		"entries/s", "prefixes/s", "== aims ==", "load average"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
	if n := strings.Count(out.String(), "PASS ") + strings.Count(out.String(), "MISS "); n != 4 {
		t.Errorf("%d aims with a verdict, want 4:\n%s", n, out.String())
	}
	// Sane, not timed: every figure is there and positive, latencies
	// below the 5s the bench waits at most.
	for _, v := range res.Variants {
		if len(v.Bps) != 1 || len(v.RR) != 1 || v.Bps[0] <= 0 || v.RR[0] <= 0 {
			t.Errorf("variant %s: %+v", v.Name, v)
		}
	}
	if len(res.Variants) != 3 {
		t.Errorf("%d variants, want bare, stack, redirect", len(res.Variants))
	}
	for _, l := range []Latency{res.MapLatency, res.AgentLatency} {
		for what, d := range map[string][]time.Duration{"applied": l.Applied, "first drop": l.FirstDrop, "first pass": l.FirstPass} {
			if len(d) != 3 {
				t.Errorf("%s: %d %s latencies, want 3", l.Enforcer, len(d), what)
			}
			for _, x := range d {
				if x <= 0 || x > 5*time.Second {
					t.Errorf("%s: %s latency %v", l.Enforcer, what, x)
				}
			}
		}
		if l.StreamGap <= 0 {
			t.Errorf("%s: stream gap %v", l.Enforcer, l.StreamGap)
		}
	}
	rc := res.Reconcilers
	if rc.PolicyEntriesPerSec <= 0 || rc.IPCachePrefixesPerSec <= 0 || rc.PolicyEntries != 1000 || rc.IPCachePrefixes != 2000 {
		t.Errorf("reconcilers %+v", rc)
	}
	if res.LoadBefore == "" || res.LoadAfter == "" {
		t.Errorf("load averages %q %q", res.LoadBefore, res.LoadAfter)
	}
	// Only the run's own mounts: other tests make namespaces meanwhile.
	if len(res.made) != 4 {
		t.Errorf("the run reports %d mounts made, want 3 namespaces and a bpffs: %v", len(res.made), res.made)
	}
	var made []string
	for _, m := range res.made {
		// mountinfo shows /var/run/netns/x as /run/netns/x.
		if dir, err := filepath.EvalSymlinks(filepath.Dir(m)); err == nil {
			m = filepath.Join(dir, filepath.Base(m))
		}
		made = append(made, m)
	}
	after := mounts(t)
	for _, l := range strings.Split(after, "\n") {
		for _, m := range made {
			if strings.Contains(l, " "+m+" ") {
				t.Errorf("left behind: %s", l)
			}
		}
		if strings.Contains(l, "cellium-benchdp-") && !strings.Contains(before, l) {
			t.Errorf("left behind: %s", l)
		}
	}
}

// TestPrivilegedCrossNodeBenchRuns runs a tiny cross-node bench: every
// variant carries traffic (figures above zero), the four aims get a
// verdict, and no namespace or bpffs mount is left behind. It asserts
// nothing about speed.
func TestPrivilegedCrossNodeBenchRuns(t *testing.T) {
	privileged.Require(t)
	for _, bin := range []string{"iperf3", "sockperf", "nsenter", "ss"} {
		if _, err := exec.LookPath(bin); err != nil {
			if os.Getenv(privileged.EnvVar) == "1" {
				t.Fatalf("%s missing and %s=1: run make deps", bin, privileged.EnvVar)
			}
			t.Skipf("%s missing: run make deps", bin)
		}
	}
	before := mounts(t)
	var out bytes.Buffer
	res, err := RunCrossNode(context.Background(), Config{Duration: time.Second, Rounds: 1}, &out)
	if err != nil {
		t.Fatalf("RunCrossNode: %v\n%s", err, out.String())
	}
	for _, v := range res.Variants {
		if len(v.Bps) != 1 || v.Bps[0] <= 0 || len(v.RR) != 1 || v.RR[0] <= 0 {
			t.Errorf("variant %s: %v bit/s, %v req/s", v.Name, v.Bps, v.RR)
		}
	}
	if n := strings.Count(out.String(), "PASS ") + strings.Count(out.String(), "MISS "); n != 4 {
		t.Errorf("%d aims with a verdict, want 4:\n%s", n, out.String())
	}
	// Only the run's own mounts (its bpffs folders are named
	// cellium-benchxn-*): other packages' tests mount namespaces and
	// bpffs meanwhile.
	for _, l := range strings.Split(mounts(t), "\n") {
		if strings.Contains(l, "cellium-benchxn-") && !strings.Contains(before, l) {
			t.Errorf("left behind: %s", l)
		}
	}
}

// TestPrivilegedControlPlaneBenchRuns runs the control-plane rows at their
// smallest (two agents, tunnel mode, two joins and two policy changes):
// every row has its samples, both aims get a verdict, and no bridge,
// route, namespace or bpffs mount of the run is left behind. It asserts
// nothing about speed.
func TestPrivilegedControlPlaneBenchRuns(t *testing.T) {
	if testing.Short() {
		t.Skip("starts an API server, etcd, the operator and two agents; run without -short")
	}
	privileged.Require(t)
	before := mounts(t)
	var out bytes.Buffer
	res, err := RunControlPlane(t.Context(), ControlPlaneConfig{Nodes: 2, Joins: 2, PolicyChanges: 2, Modes: []string{"tunnel"}}, &out)
	if err != nil {
		t.Fatalf("RunControlPlane: %v\n%s", err, out.String())
	}
	if len(res.Modes) != 1 {
		t.Fatalf("modes %+v", res.Modes)
	}
	m := res.Modes[0]
	for name, d := range map[string][]time.Duration{"join": m.Join, "leave": m.Leave, "policy": m.Policy, "policy from the API": m.PolicyFromAPI} {
		if len(d) != 2 || d[0] <= 0 || d[1] <= 0 {
			t.Errorf("%s samples %v, want 2 above zero", name, d)
		}
	}
	if n := strings.Count(out.String(), "PASS ") + strings.Count(out.String(), "MISS "); n != 2 {
		t.Errorf("%d aims with a verdict, want 2:\n%s", n, out.String())
	}
	for _, l := range strings.Split(mounts(t), "\n") {
		if strings.Contains(l, "cellium-bcp-") && !strings.Contains(before, l) {
			t.Errorf("left behind: %s", l)
		}
	}
	if out, _ := exec.Command("ip", "link", "show", cpBridge).CombinedOutput(); !strings.Contains(string(out), "does not exist") {
		t.Errorf("bridge %s left behind: %s", cpBridge, out)
	}
	if out, _ := exec.Command("ip", "route", "show", cpRange.String()).CombinedOutput(); strings.TrimSpace(string(out)) != "" {
		t.Errorf("route left behind: %s", out)
	}
}

// TestPrivilegedHubbleBenchRuns runs the Hubble rows small (20 samples, a
// 2s flood): every sample is timed (none missed), the flood sent
// datagrams that the datapath dropped and the agent turned into flows,
// every drop the datapath counted is a flow or a counted lost event, the
// probes answered, the RSS was sampled, the three aims got a verdict and
// nothing of the run is left behind. It asserts nothing about speed.
func TestPrivilegedHubbleBenchRuns(t *testing.T) {
	if testing.Short() {
		t.Skip("starts an API server, etcd, the operator and an agent; run without -short")
	}
	privileged.Require(t)
	if _, ok := harness.CachedHubble(); !ok {
		if os.Getenv(privileged.EnvVar) == "1" {
			t.Fatalf("the upstream hubble CLI is not built and %s=1: run make hubble-binaries", privileged.EnvVar)
		}
		t.Skip("the upstream hubble CLI is not built: run make hubble-binaries")
	}
	before := mounts(t)
	var out bytes.Buffer
	res, err := RunHubble(t.Context(), HubbleConfig{Samples: 20, SampleTimeout: 5 * time.Second, Flood: 2 * time.Second,
		StatusEvery: 100 * time.Millisecond}, &out)
	t.Log(out.String())
	if err != nil {
		t.Fatalf("RunHubble: %v", err)
	}
	if len(res.Latency) != 20 || res.Missed != 0 {
		t.Errorf("%d samples timed, %d missed; want 20 and 0", len(res.Latency), res.Missed)
	}
	f := res.Flood
	if f.Sent == 0 || f.DatapathDrops == 0 || f.SeenFlows == 0 || f.FollowFlows == 0 {
		t.Errorf("flood: sent %d, dropped %d, flows %d, followed %d: want all above zero", f.Sent, f.DatapathDrops, f.SeenFlows, f.FollowFlows)
	}
	// Drops are always reported: every dropped datagram's drop event is a
	// flow or counted lost where it was lost (the queue, the datapath's
	// ring buffer).
	if accounted := f.Produced + f.QueueLost + f.SourceLost; accounted < f.DatapathDrops {
		t.Errorf("flood: %d flows + %d lost in the queue + %d lost in the ring buffer = %d, fewer than the %d drops",
			f.Produced, f.QueueLost, f.SourceLost, accounted, f.DatapathDrops)
	}
	if len(f.Status) == 0 || len(f.Last) == 0 || f.RSSBefore == 0 || f.RSSPeak < f.RSSBefore || f.HWM == 0 {
		t.Errorf("flood probes %d/%d, RSS %d/%d/%d", len(f.Status), len(f.Last), f.RSSBefore, f.RSSPeak, f.HWM)
	}
	if n := strings.Count(out.String(), "PASS ") + strings.Count(out.String(), "MISS "); n != 3 {
		t.Errorf("%d aims with a verdict, want 3:\n%s", n, out.String())
	}
	for _, l := range strings.Split(mounts(t), "\n") {
		if strings.Contains(l, "cellium-bhb-") && !strings.Contains(before, l) {
			t.Errorf("left behind: %s", l)
		}
	}
	if out, _ := exec.Command("ip", "link", "show", cpBridge).CombinedOutput(); !strings.Contains(string(out), "does not exist") {
		t.Errorf("bridge %s left behind: %s", cpBridge, out)
	}
	if out, _ := exec.Command("ip", "route", "show", cpRange.String()).CombinedOutput(); strings.TrimSpace(string(out)) != "" {
		t.Errorf("route left behind: %s", out)
	}
}
