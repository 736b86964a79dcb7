package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestCountWrites(t *testing.T) {
	from := time.Date(2026, 1, 1, 10, 0, 0, 0, time.UTC)
	to := from.Add(time.Minute)
	lines := []string{
		// Counted: writes by the agent inside the window.
		`{"stage":"ResponseComplete","verb":"create","userAgent":"cellium-agent","objectRef":{"resource":"ciliumendpoints"},"responseStatus":{"code":201},"requestReceivedTimestamp":"2026-01-01T10:00:01Z"}`,
		`{"stage":"ResponseComplete","verb":"patch","userAgent":"cellium-agent/v1 (linux)","objectRef":{"resource":"ciliumendpoints"},"responseStatus":{"code":422},"requestReceivedTimestamp":"2026-01-01T10:00:02Z"}`,
		`{"stage":"ResponseComplete","verb":"update","userAgent":"cellium-agent","objectRef":{"resource":"ciliumnodes","subresource":"status"},"responseStatus":{"code":200},"requestReceivedTimestamp":"2026-01-01T10:00:03Z"}`,
		// Not counted: other stage, other agent, reads, outside the window, garbage.
		`{"stage":"ResponseStarted","verb":"create","userAgent":"cellium-agent","objectRef":{"resource":"ciliumendpoints"},"requestReceivedTimestamp":"2026-01-01T10:00:01Z"}`,
		`{"stage":"ResponseComplete","verb":"create","userAgent":"devkubelet","objectRef":{"resource":"pods"},"requestReceivedTimestamp":"2026-01-01T10:00:01Z"}`,
		`{"stage":"ResponseComplete","verb":"get","userAgent":"cellium-agent","objectRef":{"resource":"ciliumendpoints"},"requestReceivedTimestamp":"2026-01-01T10:00:01Z"}`,
		`{"stage":"ResponseComplete","verb":"delete","userAgent":"cellium-agent","objectRef":{"resource":"ciliumendpoints"},"requestReceivedTimestamp":"2026-01-01T09:59:59Z"}`,
		`not json`,
	}
	path := filepath.Join(t.TempDir(), "audit.log")
	if err := os.WriteFile(path, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	wc, err := countWrites(path, agentUserAgent, from, to)
	if err != nil {
		t.Fatal(err)
	}
	if wc.total != 3 || wc.failed != 1 || wc.by["create ciliumendpoints"] != 1 || wc.by["patch ciliumendpoints"] != 1 ||
		wc.by["update ciliumnodes/status"] != 1 {
		t.Errorf("countWrites = %+v", wc)
	}
	if _, err := countWrites(filepath.Join(t.TempDir(), "none"), agentUserAgent, from, to); err == nil {
		t.Error("missing audit log: no error")
	}
}

func TestReportPrint(t *testing.T) {
	ms := time.Millisecond
	r := report{
		pods: 4, node: "n", cpus: 2, load: [2]string{"0.5", "1.0"},
		add:        []time.Duration{10 * ms, 20 * ms, 30 * ms, 40 * ms},
		del:        []time.Duration{5 * ms, 5 * ms, 5 * ms, 5 * ms},
		running:    []time.Duration{50 * ms},
		cepReady:   []time.Duration{60 * ms},
		createSpan: 40 * ms, readySpan: 60 * ms, deleteSpan: 20 * ms,
		rssBefore: 1024, rssAfter: 2048, rssPeak: 3072,
		writes: writeCounts{total: 8, by: map[string]int{"create ciliumendpoints": 4, "delete ciliumendpoints": 4}},
	}
	var b bytes.Buffer
	r.print(&b)
	out := b.String()
	for _, want := range []string{
		"4 pods on node n, 2 CPUs, load average 0.5 before, 1.0 after",
		"CNI ADD", "20.0ms", "40.0ms", "CEP ready",
		"100.0 pods/s", "agent RSS: 1.0 MiB idle, 2.0 MiB with 4 pods, peak 3.0 MiB",
		"API writes by cellium-agent: 8 = 2.00 per pod", "create ciliumendpoints", "1.00/pod",
		"aim p99 ADD < 100ms: met (40.0ms); aim >= 50 pods/s: met (100.0)",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("report lacks %q:\n%s", want, out)
		}
	}
}

func TestComparisonPrint(t *testing.T) {
	ms := time.Millisecond
	durs := func(base time.Duration) []time.Duration {
		var out []time.Duration
		for i := 1; i <= 100; i++ {
			out = append(out, base*time.Duration(i)/100)
		}
		return out
	}
	c := comparison{refVersion: "v1.10.0", load: [2]string{"1.5", "2.5"}, results: []phaseResult{
		{party: partyCellium, mode: modeAtOnce, pods: 100, parallel: 50, add: durs(300 * ms), del: durs(100 * ms),
			createSpan: 2 * time.Second, cpu: cpuTimes{"cellium-cni": 1500 * ms, "cellium-agent": 800 * ms}},
		{party: partyReference, mode: modeAtOnce, pods: 100, parallel: 50, add: durs(100 * ms), del: durs(50 * ms),
			createSpan: time.Second, cpu: cpuTimes{"cellium-cni": 2000 * ms, "cellium-agent": 100 * ms}},
		{party: partyCellium, mode: modeSequential, pods: 100, parallel: 1, add: durs(40 * ms), del: durs(20 * ms),
			createSpan: 10 * time.Second, cpu: cpuTimes{"cellium-cni": 1000 * ms}},
		{party: partyReference, mode: modeSequential, pods: 100, parallel: 1, add: durs(30 * ms), del: durs(20 * ms),
			createSpan: 8 * time.Second, cpu: cpuTimes{"cellium-cni": 1100 * ms}},
	}}
	var b bytes.Buffer
	c.print(&b)
	out := b.String()
	for _, want := range []string{
		"ptp + host-local v1.10.0", "load average 1.5 before, 2.5 after",
		"ADD p99 (50 at once)", "297.0ms", "99.0ms", "3.00x",
		"ADD p50 (sequential)", "pods/s to Running (50 at once)", "50.0", "100.0",
		"plugin CPU per ADD+DEL (50 at once)", "15.0ms", "20.0ms", "0.75x",
		"plugin+agent CPU per pod (50 at once)", "23.0ms",
		"ADD p99 <= 1.5x reference (50 at once): MISSED (3.00x)",
		"plugin CPU per ADD+DEL <= reference (50 at once): met (0.75x)",
		"ADD p99 <= 1.5x reference (sequential): met (1.33x)",
		"plugin CPU per ADD+DEL <= reference (sequential): met (0.91x)",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("comparison lacks %q:\n%s", want, out)
		}
	}
}
