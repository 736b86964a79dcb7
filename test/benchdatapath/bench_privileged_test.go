package benchdatapath

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

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
// it prints every figure and leaves no namespace or bpffs mount behind.
// It asserts nothing about the figures.
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
		Duration: time.Second, Rounds: 1, Updates: 3, StreamInterval: time.Millisecond,
		IPCachePrefixes: 100, PolicyEntries: 10,
	}, &out)
	if err != nil {
		t.Fatalf("Run: %v\n%s", err, out.String())
	}
	for _, want := range []string{"TCP throughput (iperf3)", "TCP_RR (sockperf", "update -> first packet dropped", "round 1 redirect"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
	if res.BareBps <= 0 || res.RedirectRR <= 0 || len(res.Latencies.FirstDrop) != 3 {
		t.Errorf("result %+v: want figures for every part", res)
	}
	after := mounts(t)
	for _, l := range strings.Split(after, "\n") {
		if (strings.Contains(l, "cellium-benchdp-") || strings.Contains(l, "/netns/")) && !strings.Contains(before, l) {
			t.Errorf("left behind: %s", l)
		}
	}
}

func TestPercentileAndMedian(t *testing.T) {
	d := []time.Duration{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	if got := percentile(d, 50); got != 5 {
		t.Errorf("p50 = %v, want 5", got)
	}
	if got := percentile(d, 99); got != 10 {
		t.Errorf("p99 = %v, want 10", got)
	}
	if got := percentile(nil, 99); got != 0 {
		t.Errorf("p99 of nothing = %v", got)
	}
	if got := median([]float64{3, 1, 2}); got != 2 {
		t.Errorf("median = %v, want 2", got)
	}
	if got := medianRatio([]float64{2, 9, 3}, []float64{1, 3, 3}); got != 2 {
		t.Errorf("medianRatio = %v, want 2 (ratios 2, 3, 1)", got)
	}
}
