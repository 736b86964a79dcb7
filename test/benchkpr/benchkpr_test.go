package benchkpr

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The probes against an echo server on the loopback: rr and connect time
// what they did; watch reports the answer changing when the server goes.
func TestProbes(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	served := make(chan error, 1)
	sctx, stopServer := context.WithCancel(ctx)
	go func() { served <- echo(sctx, addr) }()

	var out bytes.Buffer
	waitUp := time.Now().Add(5 * time.Second)
	for {
		out.Reset()
		if err := Probe(ctx, []string{"rr", "-addr", addr, "-n", "200"}, &out); err == nil {
			break
		} else if time.Now().After(waitUp) {
			t.Fatal(err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	var r ProbeResult
	if err := json.Unmarshal(out.Bytes(), &r); err != nil {
		t.Fatalf("rr printed %q: %v", out.String(), err)
	}
	if r.N != 200 || r.PerSecond <= 0 || r.P50 <= 0 || r.P99 < r.P50 {
		t.Errorf("rr: %+v", r)
	}
	out.Reset()
	if err := Probe(ctx, []string{"connect", "-addr", addr, "-n", "50"}, &out); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(out.Bytes(), &r); err != nil || r.N != 50 {
		t.Errorf("connect: %q, %v", out.String(), err)
	}

	// watch: up while the server runs, down once it is gone.
	pr, pw := io.Pipe()
	wctx, stopWatch := context.WithCancel(ctx)
	watched := make(chan error, 1)
	go func() {
		watched <- Probe(wctx, []string{"watch", "-addr", addr, "-interval", "2ms"}, pw)
		pw.Close()
	}()
	lines := bufio.NewScanner(pr)
	next := func() string {
		if !lines.Scan() {
			t.Fatalf("watch ended: %v", lines.Err())
		}
		_, state, _ := strings.Cut(lines.Text(), " ")
		return state
	}
	if got := next(); got != "up" {
		t.Fatalf("watch first said %q, want up", got)
	}
	stopServer()
	if err := <-served; err != nil {
		t.Fatal(err)
	}
	if got := next(); got != "down" {
		t.Fatalf("watch said %q after the server went, want down", got)
	}
	stopWatch()
	go func() { _, _ = io.Copy(io.Discard, pr) }()
	if err := <-watched; err != nil {
		t.Fatal(err)
	}

	if err := Probe(ctx, []string{"nosuch"}, io.Discard); err == nil {
		t.Error("an unknown probe was accepted")
	}
}

// The bulk Services' backends are distinct (address and port) across
// Services, never in a node's pod range, and the watcher picks the first
// event at or after a change.
func TestBulkBackendsAndWatcher(t *testing.T) {
	seen := map[netip.AddrPort]int{}
	nodes := netip.MustParsePrefix("10.236.0.0/18") // the nodes' /24s
	for i := range 10000 {
		addrs, port := bulkBackends(i, 10)
		for _, a := range addrs {
			ap := netip.AddrPortFrom(a, uint16(port))
			if j, ok := seen[ap]; ok {
				t.Fatalf("backend %s of Service %d is Service %d's too", ap, i, j)
			}
			seen[ap] = i
			if nodes.Contains(a) || !netip.MustParsePrefix("10.236.64.0/18").Contains(a) {
				t.Fatalf("backend %s of Service %d outside 10.236.64.0/18", a, i)
			}
		}
	}

	w := &watcher{}
	w.cond = newCond(w)
	t0 := time.Now()
	w.events = []watchEvent{{at: t0.Add(-time.Second), up: false}, {at: t0.Add(time.Millisecond), up: true}}
	got, err := w.wait(t0, true, time.Second)
	if err != nil || !got.Equal(t0.Add(time.Millisecond)) {
		t.Errorf("wait up: %v, %v", got, err)
	}
	if _, err := w.wait(t0, false, 50*time.Millisecond); err == nil {
		t.Error("wait down found the down before the change")
	}
}

// The report puts both modes side by side and computes the ratios.
func TestReport(t *testing.T) {
	size := func(connectP50 int64, changes ...time.Duration) SizeResult {
		return SizeResult{Services: 1000, Connect: ProbeResult{P50: connectP50, P99: 2 * connectP50}, Changes: changes,
			Memory: Memory{AgentRSS: 100 << 20, Maps: map[string]MapSize{"cellium_lb4_ser": {Entries: 11000, MaxEntries: 262144, Bytes: 22 << 20}}}}
	}
	r := Result{Config: Config{Sizes: []int{1000}, Rounds: 1, IperfSeconds: 1}, Modes: []ModeResult{
		{Mode: ModeKubeProxy, Paths: []PathResult{{Name: pathClusterIP, BitsPerSecond: []float64{8e9}, RoundTripsPerSecond: []float64{10000}}},
			Sizes: []SizeResult{size(400000, time.Second, 2*time.Second)}},
		{Mode: ModeKPR, Paths: []PathResult{{Name: pathClusterIP, BitsPerSecond: []float64{10e9}, RoundTripsPerSecond: []float64{12000}}},
			Sizes: []SizeResult{size(200000, 10*time.Millisecond, 20*time.Millisecond)}},
	}}
	var b bytes.Buffer
	r.Write(&b)
	for _, want := range []string{
		"| pod -> ClusterIP -> pod | 8.00 | 10.00 | 1.25x | 10000 | 12000 | 1.20x |",
		"| 1000 | 400 / 800 | 200 / 400 |",
		"| 1000 | 1000.0 / 2000.0 / 2000.0 | 10.0 / 20.0 / 20.0 | 100.00x |",
		"ser 11000 (262144, 22.0)",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, b.String())
		}
	}
	bad := Config{Sizes: []int{10, 5}}
	if err := bad.defaults(); err == nil {
		t.Error("descending sizes accepted")
	}
	small := Config{Sizes: []int{100000}, LBMapMax: 65536}
	if err := small.defaults(); err == nil {
		t.Error("100,000 Services x 10 accepted with 65536 map entries")
	}
}
