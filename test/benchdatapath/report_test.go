package benchdatapath

import (
	"bytes"
	"context"
	"io"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestParseIperf3(t *testing.T) {
	got, err := ParseIperf3([]byte(`{"start": {}, "end": {"sum_sent": {"bits_per_second": 9.9e9},
		"sum_received": {"bits_per_second": 12345678901.5}}}`))
	if err != nil || got != 12345678901.5 {
		t.Errorf("ParseIperf3 = %v, %v; want the received rate", got, err)
	}
	for _, bad := range []string{
		`{"start": {}, "end": {}, "error": "unable to connect to server: Connection refused"}`,
		`{"end": {"sum_received": {"bits_per_second": 0}}}`,
		`iperf3: error - unable to connect`,
	} {
		if got, err := ParseIperf3([]byte(bad)); err == nil {
			t.Errorf("ParseIperf3(%q) = %v, want an error", bad, got)
		}
	}
}

func TestParseSockperf(t *testing.T) {
	out := `sockperf: == version #3.10-no.git ==
sockperf[CLIENT] send on:sockperf: using recvfrom() to block on socket(s)
[ 0] IP = 10.97.0.11      PORT = 11111 # TCP
sockperf: Warmup stage (sending a few dummy messages)...
sockperf: Starting test...
sockperf: Test end (interrupted by timer)
sockperf: Test ended
sockperf: [Total Run] RunTime=3.000 sec; Warm up time=400 msec; SentMessages=150005; ReceivedMessages=150004
sockperf: ========= Printing statistics for Server No: 0
sockperf: [Valid Duration] RunTime=2.500 sec; SentMessages=125001; ReceivedMessages=125000
sockperf: ====> avg-latency=9.950 (std-dev=2.093, mean-ad=0.731, median-ad=0.479, siqr=0.347, cv=0.210, std-error=0.006, 99.0% ci=[9.935, 9.965])
`
	got, err := parseSockperf([]byte(out))
	if err != nil || got != 50000 {
		t.Errorf("parseSockperf = %v, %v; want 125000 / 2.5 s = 50000", got, err)
	}
	for _, bad := range []string{
		"sockperf: ERROR: Failed to connect",
		"sockperf: [Valid Duration] RunTime=0.000 sec; SentMessages=0; ReceivedMessages=0",
	} {
		if got, err := parseSockperf([]byte(bad)); err == nil {
			t.Errorf("parseSockperf(%q) = %v, want an error", bad, got)
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
	// 200 samples: p99 is the 198th smallest, not the maximum.
	var many []time.Duration
	for i := 200; i >= 1; i-- {
		many = append(many, time.Duration(i)*time.Millisecond)
	}
	if st := summarize(many); st.N != 200 || st.P50 != 100*time.Millisecond || st.P99 != 198*time.Millisecond || st.Max != 200*time.Millisecond {
		t.Errorf("summarize = %+v", st)
	}
}

func TestLatencyHelpers(t *testing.T) {
	if got := since(100, 350); got != 250 {
		t.Errorf("since = %v", got)
	}
	if got := since(350, 100); got != 0 {
		t.Errorf("since of an earlier time = %v, want 0", got)
	}
	// Datagrams numbered up to the mark were sent before it.
	if sentAfter(rx{seq: 7}, 7) || !sentAfter(rx{seq: 8}, 7) {
		t.Error("sentAfter: a datagram is after the mark only when numbered above it")
	}
	drops := make(chan uint64, 4)
	drops <- 90 // a drop of the previous update
	drops <- 120
	drops <- 130
	if k, err := firstDropAfter(context.Background(), drops, 100, time.Second); err != nil || k != 120 {
		t.Errorf("firstDropAfter = %v, %v; want 120 (the first at or after the update)", k, err)
	}
	if _, err := firstDropAfter(context.Background(), make(chan uint64), 100, 10*time.Millisecond); err == nil {
		t.Error("firstDropAfter without drops: want a timeout error")
	}
	ch := make(chan int, 3)
	ch <- 1
	ch <- 2
	drain(ch)
	if len(ch) != 0 {
		t.Errorf("drain left %d", len(ch))
	}
}

func sampleResult(rrRatio float64, agentP99 time.Duration) *Result {
	ms := func(v ...float64) []time.Duration {
		var out []time.Duration
		for _, x := range v {
			out = append(out, time.Duration(x*float64(time.Millisecond)))
		}
		return out
	}
	return &Result{
		Duration: 3 * time.Second, Rounds: 3,
		Variants: []Variant{
			{Name: "bare", Bps: []float64{10e9, 20e9, 12e9}, RR: []float64{50000, 40000, 60000}},
			{Name: "stack", Bps: []float64{9.9e9, 19e9, 12e9}, RR: []float64{45000, 38000, 50000}},
			{Name: "redirect", Bps: []float64{9.8e9, 20e9, 11e9}, RR: []float64{50000 * rrRatio, 40000 * rrRatio, 60000 * rrRatio}},
		},
		MapLatency:   Latency{Enforcer: "map", latencies: latencies{Applied: ms(0.004), FirstDrop: ms(0.04), FirstPass: ms(0.1), StreamGap: 100 * time.Microsecond}},
		AgentLatency: Latency{Enforcer: "agent", latencies: latencies{Applied: ms(0.3, 0.5), FirstDrop: []time.Duration{time.Millisecond, agentP99}, FirstPass: ms(0.9, 2)}},
		Reconcilers:  ReconcilerRates{PolicyEntriesPerSec: 300000, PolicyEntries: 10000, IPCachePrefixesPerSec: 80000, IPCachePrefixes: 50000, Rounds: 3},
		LoadBefore:   "3.10 2.00 1.50", LoadAfter: "3.50 2.10 1.60",
	}
}

func TestAims(t *testing.T) {
	aims := sampleResult(1.02, 4*time.Millisecond).Aims()
	if len(aims) != 4 {
		t.Fatalf("%d aims, want 4", len(aims))
	}
	// Throughput ratios per round 0.98, 1.0, 0.9167: median 0.98.
	if !aims[0].Met || aims[0].Value != "0.980x" {
		t.Errorf("throughput aim %+v", aims[0])
	}
	if !aims[1].Met || !aims[2].Met || !aims[3].Met {
		t.Errorf("aims %+v: want all met", aims)
	}
	aims = sampleResult(0.97, 60*time.Millisecond).Aims()
	if aims[1].Met || aims[2].Met || !aims[3].Met {
		t.Errorf("aims %+v: want request/response and drop latency missed", aims)
	}
	// No agent figures: the latency aims are not met.
	r := sampleResult(1, 0)
	r.AgentLatency = Latency{}
	if aims := r.Aims(); aims[2].Met || aims[3].Met {
		t.Errorf("aims without agent figures %+v", aims)
	}
}

func TestWrite(t *testing.T) {
	var b bytes.Buffer
	sampleResult(0.97, 60*time.Millisecond).Write(&b)
	out := b.String()
	for _, want := range []string{
		"TCP throughput (iperf3)            12.00 Gbit/s",
		"TCP_RR (sockperf ping-pong, 64B)   50000 /s",
		"throughput      b stack 0.990x  b redirect 0.980x",
		"request/resp.   b stack 0.900x  b redirect 0.970x",
		"per-round ratios b redirect / a, sorted",
		"throughput      0.92 0.98 1.00",
		"request/resp.   0.97 0.97 0.97",
		"through the agent: agent",
		"deny: update -> first packet dropped       p50   1.000ms  p99  60.000ms",
		"allow: update -> first packet through      p50   900.0µs",
		"policy map written directly, no agent: map",
		"300000 entries/s",
		"80000 prefixes/s",
		"PASS TCP throughput, cellium / bare",
		"MISS request/response rate, cellium / bare",
		"MISS agent policy update -> first drop, p99",
		"PASS agent policy update -> traffic again, p99",
		"load average (1, 5, 15 min) before 3.10 2.00 1.50, after 3.50 2.10 1.60",
		"noisy",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	var round bytes.Buffer
	WriteRound(&round, 2, "redirect", 13.2e9, 51234, 0)
	if got := round.String(); !strings.Contains(got, "round 2 redirect throughput    13.20 Gbit/s   request/response     51234 /s") {
		t.Errorf("round line %q", got)
	}
}

func TestFmtDur(t *testing.T) {
	for d, want := range map[time.Duration]string{
		42 * time.Microsecond: "42.0µs", 1500 * time.Microsecond: "1.500ms", 2 * time.Second: "2.000s",
	} {
		if got := fmtDur(d); got != want {
			t.Errorf("fmtDur(%v) = %q, want %q", d, got, want)
		}
	}
}

func TestControlPlaneAims(t *testing.T) {
	ms := func(v ...int) []time.Duration {
		var d []time.Duration
		for _, x := range v {
			d = append(d, time.Duration(x)*time.Millisecond)
		}
		return d
	}
	r := ControlPlaneResult{Nodes: 2, Modes: []ControlPlaneMode{
		{Mode: "tunnel", Join: ms(20, 30, 1900), Policy: ms(5, 10, 49)},
		{Mode: "native", Join: ms(20, 2100), Policy: ms(5, 51)},
		{Mode: "empty"},
	}}
	var got []bool
	for _, a := range r.Aims() {
		got = append(got, a.Met)
	}
	if want := []bool{true, true, false, false, false, false}; !slices.Equal(got, want) {
		t.Errorf("verdicts %v, want %v", got, want)
	}
	var b bytes.Buffer
	r.Write(&b)
	for _, want := range []string{"PASS tunnel: node join programmed on all other nodes, p99", "MISS native: policy change enforced on every node, p99", "node leave"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, b.String())
		}
	}
}

func TestControlPlaneBadConfig(t *testing.T) {
	for _, c := range []struct {
		cfg  ControlPlaneConfig
		want string
	}{
		{ControlPlaneConfig{Nodes: 1, Joins: 1, PolicyChanges: 1}, "at least 2"},
		{ControlPlaneConfig{Nodes: 2, Joins: 0, PolicyChanges: 1}, "give 1 to 100"},
		{ControlPlaneConfig{Nodes: 2, Joins: 1, PolicyChanges: 0}, "at least 1"},
		{ControlPlaneConfig{Nodes: 2, Joins: 1, PolicyChanges: 1, Modes: []string{"geneve"}}, "tunnel and/or native"},
	} {
		if _, err := RunControlPlane(t.Context(), c.cfg, io.Discard); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: error %v, want one saying %q", c.cfg, err, c.want)
		}
	}
}
