package cli

import (
	"bytes"
	"context"
	"net/netip"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cellium/cellium/api/v1/models"
	"github.com/cellium/cellium/cells/agentapi"
	"github.com/cellium/cellium/cells/hive/hivetest"
	"github.com/cellium/cellium/cells/metrics"
	"github.com/cellium/cellium/cells/monitor"
	hub "github.com/cellium/cellium/statedb/monitor"
)

// lineBuffer collects a command's output while it runs and lets the test
// wait for lines.
type lineBuffer struct {
	mu    sync.Mutex
	buf   bytes.Buffer
	wrote chan struct{}
}

func newLineBuffer() *lineBuffer { return &lineBuffer{wrote: make(chan struct{}, 1)} }

func (b *lineBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	n, err := b.buf.Write(p)
	select {
	case b.wrote <- struct{}{}:
	default:
	}
	return n, err
}

func (b *lineBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// waitLines waits until the output has n lines.
func (b *lineBuffer) waitLines(t *testing.T, n int) {
	t.Helper()
	timeout := time.After(30 * time.Second)
	for strings.Count(b.String(), "\n") < n {
		select {
		case <-b.wrote:
		case <-timeout:
			t.Fatalf("waited for %d lines of output, have:\n%s", n, b.String())
		}
	}
}

// monitorRun is a `cellium monitor` running until stop (Ctrl-C).
type monitorRun struct {
	out, errOut *lineBuffer
	cancel      context.CancelFunc
	done        chan int
}

func startMonitor(t *testing.T, sock string, args ...string) *monitorRun {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	m := &monitorRun{out: newLineBuffer(), errOut: newLineBuffer(), cancel: cancel, done: make(chan int, 1)}
	go func() {
		m.done <- Run(ctx, append([]string{"-H", "unix://" + sock, "monitor"}, args...),
			Options{Out: m.out, Err: m.errOut, Now: func() time.Time { return testNow }})
	}()
	t.Cleanup(cancel)
	return m
}

// stop presses Ctrl-C and returns the exit code.
func (m *monitorRun) stop() int {
	m.cancel()
	return <-m.done
}

var monitorEvents = []models.MonitorEvent{
	{Type: "drop", Timestamp: testNow, EndpointID: 1234, ReasonCode: 133, Reason: "Policy denied", Direction: "ingress",
		SrcIdentity: 5678, DstIdentity: 1234, SrcIP: "10.0.0.2", DstIP: "10.0.0.3", SrcPort: 43210, DstPort: 80,
		Protocol: "tcp", Ifindex: 7, Length: 74},
	{Type: "drop", Timestamp: testNow, EndpointID: 1234, ReasonCode: 181, Reason: "Policy denied by denylist", Direction: "egress",
		SrcIdentity: 1234, DstIdentity: 2, SrcIP: "10.0.0.3", DstIP: "192.0.2.9", Protocol: "icmp", Ifindex: 7, Length: 84},
	{Type: "policy-verdict", Timestamp: testNow, EndpointID: 1234, Verdict: "allow", Direction: "ingress",
		SrcIdentity: 5678, DstIdentity: 1234, SrcIP: "10.0.0.2", DstIP: "10.0.0.3", SrcPort: 43211, DstPort: 53,
		Protocol: "udp", Ifindex: 7, Length: 60},
	{Type: "policy-verdict", Timestamp: testNow, EndpointID: 1234, Verdict: "audit", Direction: "egress",
		SrcIdentity: 1234, DstIdentity: 16777217, SrcIP: "fd00:10::3", DstIP: "fd00::1", SrcPort: 40000, DstPort: 443,
		Protocol: "tcp", Ifindex: 7, Length: 80},
	{Type: "lost", Timestamp: testNow, Lost: 12},
	{Type: "trace", Timestamp: testNow, EndpointID: 1234, ObservationPointCode: 0, ObservationPoint: "to-endpoint",
		Direction: "ingress", SrcIdentity: 5678, DstIdentity: 1234, SrcIP: "10.0.0.2", DstIP: "10.0.0.3",
		SrcPort: 43210, DstPort: 80, Protocol: "tcp", Ifindex: 7, Length: 74},
	{Type: "trace", Timestamp: testNow, EndpointID: 1234, ObservationPointCode: 5, ObservationPoint: "from-endpoint",
		Direction: "egress", SrcIdentity: 1234, DstIdentity: 5678, SrcIP: "10.0.0.3", DstIP: "10.0.0.2",
		SrcPort: 80, DstPort: 43210, Protocol: "tcp", Ifindex: 7, Length: 74},
}

// TestMonitorFakeAgent: the human, verbose and JSON forms of every event
// type, the filters sent to the agent, and Ctrl-C ending with exit 0.
func TestMonitorFakeAgent(t *testing.T) {
	f := newFakeAgent()
	f.Monitor = monitorEvents
	sock := f.start(t)
	for _, tc := range []struct {
		name  string
		args  []string
		lines int
		query string
	}{
		{"monitor", nil, len(monitorEvents), "GET /v1/monitor"},
		{"monitor-verbose", []string{"-v", "--type", "drop,policy-verdict", "--type", "trace", "--related-to", "1234"},
			3 + 3 + 2 + 2 + 1 + 3 + 3, "GET /v1/monitor?endpoint=1234&type=drop&type=policy-verdict&type=trace"},
		{"monitor-json", []string{"-o", "json", "-t", "drop"}, len(monitorEvents), "GET /v1/monitor?type=drop"},
		{"monitor-json", []string{"-j", "--related-to", "7,1234", "--related-to", "9"}, len(monitorEvents),
			"GET /v1/monitor?endpoint=7&endpoint=1234&endpoint=9"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := len(f.seen())
			m := startMonitor(t, sock, tc.args...)
			m.out.waitLines(t, tc.lines)
			if code := m.stop(); code != 0 {
				t.Fatalf("exit %d after Ctrl-C, stderr %q", code, m.errOut.String())
			}
			golden(t, tc.name, m.out.String())
			if seen := f.seen()[before:]; len(seen) != 1 || seen[0] != tc.query {
				t.Errorf("requests %q, want %q", seen, tc.query)
			}
		})
	}
}

func TestMonitorErrors(t *testing.T) {
	f := newFakeAgent()
	f.Monitor = monitorEvents[:1]
	f.MonitorEnds = true
	sock := f.start(t)
	if r := run(t, sock, "monitor"); r.code != 1 || !strings.HasSuffix(r.stderr, "\nError: the agent closed the event stream (is it stopping?): run cellium monitor again once it is back\n") ||
		!strings.HasPrefix(r.stdout, "xx drop (Policy denied)") {
		t.Errorf("stream ended by the agent: %+v", r)
	}
	if r := run(t, sock, "monitor", "--type", "capture"); r.code != 1 || r.stderr != "Error: unknown --type \"capture\": use drop, trace, policy-verdict\n" {
		t.Errorf("--type capture: %+v", r)
	}
	if r := run(t, sock, "monitor", "--related-to", "web"); r.code != 1 ||
		r.stderr != "Error: invalid --related-to \"web\": want an endpoint ID from 1 to 65535 (cellium endpoint list shows them)\n" {
		t.Errorf("--related-to web: %+v", r)
	}
	if r := run(t, sock, "monitor", "-o", "yaml"); r.code != 1 || !strings.Contains(r.stderr, "use -o json") {
		t.Errorf("-o yaml: %+v", r)
	}
	old := newFakeAgent()
	old.Missing = []string{"GET /monitor"}
	if r := run(t, old.start(t), "monitor"); r.code != 1 ||
		r.stderr != "Error: monitor the datapath: the agent does not serve GET /v1/monitor: is it older than this cellium CLI?\n" {
		t.Errorf("agent without /v1/monitor: %+v", r)
	}
	hang := newFakeAgent()
	hang.Hang = true
	if r := run(t, hang.start(t), "--timeout=200ms", "monitor"); r.code != 1 || !strings.Contains(r.stderr, "did not answer within 200ms") {
		t.Errorf("hanging agent: %+v", r)
	}
	if r := run(t, filepath.Join(t.TempDir(), "none.sock"), "monitor"); r.code != 1 || !strings.Contains(r.stderr, "is cellium-agent running?") {
		t.Errorf("no agent: %+v", r)
	}
}

// TestMonitorRealAgent runs the CLI against the agent's own API and
// monitor cells: events published into the hub come out as lines, the
// endpoint and type filters apply on the agent's side, and Ctrl-C leaves
// no subscription behind.
func TestMonitorRealAgent(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "api.sock")
	var h *hub.Hub
	hivetest.Start(t, []string{"--socket-path=" + sock}, metrics.Cell, agentapi.Cell, monitor.Cell, hivetest.Capture(&h))

	m := startMonitor(t, sock, "--related-to", "1234", "--type", "drop", "--type", "policy-verdict")
	m.errOut.waitLines(t, 2) // the header: the stream is open
	waitSubscribers(t, h, 1)
	base := hub.Event{Timestamp: testNow, EndpointID: 1234, Direction: hub.DirectionIngress, SrcIdentity: 5678, DstIdentity: 1234,
		SrcIP: netip.MustParseAddr("10.0.0.2"), DstIP: netip.MustParseAddr("10.0.0.3"), SrcPort: 43210, DstPort: 80,
		Protocol: 6, Ifindex: 7, Length: 74}
	drop, other, trace, verdict := base, base, base, base
	drop.Type, drop.Reason, drop.ReasonName = hub.TypeDrop, 133, "Policy denied"
	other.Type, other.EndpointID, other.Reason, other.ReasonName = hub.TypeDrop, 99, 133, "Policy denied"
	trace.Type, trace.Reason, trace.ReasonName = hub.TypeTrace, 0, "to-endpoint"
	verdict.Type, verdict.Verdict = hub.TypePolicyVerdict, hub.VerdictDeny
	for _, ev := range []hub.Event{other, drop, trace, verdict} {
		h.Publish(ev)
	}
	m.out.waitLines(t, 2)
	if code := m.stop(); code != 0 {
		t.Fatalf("exit %d after Ctrl-C, stderr %q", code, m.errOut.String())
	}
	want := "xx drop (Policy denied) flow 0x0 to endpoint 1234, ifindex 7, file bpf_lxc.c:0, , identity 5678->1234: 10.0.0.2:43210 -> 10.0.0.3:80 tcp\n" +
		"Policy verdict log: flow 0x0 local EP ID 1234, remote ID 5678, proto 6, ingress, action deny, 10.0.0.2:43210 -> 10.0.0.3:80 tcp\n"
	if got := m.out.String(); got != want {
		t.Errorf("output:\n%s\nwant:\n%s", got, want)
	}
	if got, want := m.errOut.String(), "Listening for events on unix://"+sock+"\nPress Ctrl-C to quit\n"; got != want {
		t.Errorf("stderr %q, want %q", got, want)
	}
	waitSubscribers(t, h, 0)
}

// waitSubscribers waits until the hub has n subscribers.
func waitSubscribers(t *testing.T, h *hub.Hub, n int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for h.Stats().Subscribers != n {
		if time.Now().After(deadline) {
			t.Fatalf("hub has %d subscribers, want %d", h.Stats().Subscribers, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestMonitorLineNewFields: a line shows the TCP flags, the ICMP type and
// code and the Service a socket asked for after the connection.
func TestMonitorLineNewFields(t *testing.T) {
	typ, code := uint8(8), uint8(0)
	for _, c := range []struct {
		ev   models.MonitorEvent
		want string
	}{
		{models.MonitorEvent{Type: models.MonitorTypeTrace, ObservationPointCode: 3, SrcIP: "10.0.0.2", DstIP: "10.0.0.3",
			SrcPort: 43210, DstPort: 8080, Protocol: "tcp", TCPFlags: "SYN", OrigDstIP: "10.96.0.10", OrigDstPort: 80},
			"10.0.0.2:43210 -> 10.0.0.3:8080 tcp SYN service 10.96.0.10:80\n"},
		{models.MonitorEvent{Type: models.MonitorTypeDrop, SrcIP: "10.0.0.2", DstIP: "10.0.0.3", Protocol: "icmp",
			ICMPType: &typ, ICMPCode: &code}, "10.0.0.2 -> 10.0.0.3 icmp type 8 code 0\n"},
	} {
		if got := formatMonitorEvent(&c.ev, false); !strings.HasSuffix(got, c.want) {
			t.Errorf("line %q, want it to end in %q", got, c.want)
		}
	}
}
