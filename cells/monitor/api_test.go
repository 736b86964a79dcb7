package monitor_test

import (
	"context"
	"errors"
	"io"
	"net/http/httptest"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/cellium/cellium/api/v1/client"
	"github.com/cellium/cellium/api/v1/models"
	"github.com/cellium/cellium/cells/agentapi"
	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/cells/hive/hivetest"
	"github.com/cellium/cellium/cells/metrics"
	"github.com/cellium/cellium/cells/monitor"
	hub "github.com/cellium/cellium/statedb/monitor"
)

var t0 = time.Date(2026, 12, 1, 6, 0, 0, 0, time.UTC)

func drop(ep uint16) hub.Event {
	return hub.Event{Type: hub.TypeDrop, Timestamp: t0, Reason: 133, ReasonName: "Policy denied",
		Direction: hub.DirectionIngress, EndpointID: ep, SrcIdentity: 5678, DstIdentity: 1234,
		SrcIP: netip.MustParseAddr("10.0.0.2"), DstIP: netip.MustParseAddr("10.0.0.3"),
		SrcPort: 43210, DstPort: 80, Protocol: 6, Ifindex: 7, Length: 74}
}

func verdict(ep uint16, v hub.Verdict) hub.Event {
	ev := drop(ep)
	ev.Type, ev.Reason, ev.ReasonName, ev.Verdict = hub.TypePolicyVerdict, 0, "", v
	return ev
}

func trace(ep uint16) hub.Event {
	ev := drop(ep)
	ev.Type, ev.Reason, ev.ReasonName, ev.Direction = hub.TypeTrace, 5, "from-endpoint", hub.DirectionEgress
	return ev
}

type agent struct {
	hive   *hive.Hive
	hub    *hub.Hub
	reg    *prometheus.Registry
	socket string
}

// startAgent runs the API, metrics and monitor cells on a socket of the
// test. The caller stops the hive (or the test's cleanup does).
func startAgent(t *testing.T, args ...string) *agent {
	t.Helper()
	a := &agent{socket: filepath.Join(t.TempDir(), "api.sock")}
	a.hive = hivetest.New(t, append([]string{"--socket-path=" + a.socket}, args...),
		metrics.Cell, agentapi.Cell, monitor.Cell,
		hivetest.Capture(&a.hub), hivetest.Capture(&a.reg))
	if err := a.hive.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	// Stopping a stopped hive does nothing.
	t.Cleanup(func() { _ = a.hive.Stop(context.Background()) })
	return a
}

// waitSubscribers waits until the hub has n subscribers.
func waitSubscribers(t *testing.T, h *hub.Hub, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for h.Stats().Subscribers != n {
		if time.Now().After(deadline) {
			t.Fatalf("hub has %d subscribers, want %d", h.Stats().Subscribers, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestStreamFiltersAndEndsWithClient: events published into the hub reach
// each client as NDJSON, filtered by type and endpoint on the agent's
// side; a client that goes leaves no subscription behind.
func TestStreamFiltersAndEndsWithClient(t *testing.T) {
	a := startAgent(t)
	c := client.New(a.socket)
	defer c.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	all, err := c.Monitor(ctx, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer all.Close()
	verdicts7, err := c.Monitor(ctx, []string{"policy-verdict", "drop"}, []uint16{7})
	if err != nil {
		t.Fatal(err)
	}
	events := []hub.Event{drop(9), trace(7), verdict(7, hub.VerdictDeny), drop(7), verdict(9, hub.VerdictAllow)}
	for _, ev := range events {
		a.hub.Publish(ev)
	}
	next := func(s *client.MonitorStream) models.MonitorEvent {
		t.Helper()
		ev, err := s.Next()
		if err != nil {
			t.Fatal(err)
		}
		return ev
	}
	for i, want := range events {
		if got := next(all); got != monitor.Model(&want) {
			t.Errorf("all: event %d = %+v, want %+v", i, got, monitor.Model(&want))
		}
	}
	for i, want := range []hub.Event{events[2], events[3]} {
		if got := next(verdicts7); got != monitor.Model(&want) {
			t.Errorf("verdicts and drops of 7: event %d = %+v, want %+v", i, got, monitor.Model(&want))
		}
	}
	first := monitor.Model(&events[0])
	if first.Reason != "Policy denied" || first.ReasonCode != 133 || first.Direction != "ingress" || first.Protocol != "tcp" ||
		first.SrcIP != "10.0.0.2" || first.DstPort != 80 {
		t.Errorf("Model(drop) = %+v", first)
	}

	verdicts7.Close()
	waitSubscribers(t, a.hub, 1)
	all.Close()
	waitSubscribers(t, a.hub, 0)

	got := gather(t, a.reg)
	if got["cellium_monitor_events_total"] != 5 || got["cellium_monitor_clients"] != 0 || got["cellium_monitor_events_lost_total"] != 0 {
		t.Errorf("metrics = %v, want 5 events, 0 clients, 0 lost", got)
	}
}

// gather returns the value of each unlabelled metric of reg by name.
func gather(t *testing.T, reg prometheus.Gatherer) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			if len(m.GetLabel()) > 0 {
				continue
			}
			switch {
			case m.Counter != nil:
				out[mf.GetName()] = m.GetCounter().GetValue()
			case m.Gauge != nil:
				out[mf.GetName()] = m.GetGauge().GetValue()
			}
		}
	}
	return out
}

// TestStreamEndsWhenAgentStops: stopping the agent ends an open stream
// (the API server does not wait for it until its stop timeout).
func TestStreamEndsWhenAgentStops(t *testing.T) {
	a := startAgent(t)
	c := client.New(a.socket)
	defer c.Close()
	s, err := c.Monitor(context.Background(), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	a.hub.Publish(drop(1))
	if _, err := s.Next(); err != nil {
		t.Fatal(err)
	}
	stopCtx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := a.hive.Stop(stopCtx); err != nil {
		t.Fatalf("stop with an open monitor stream: %v", err)
	}
	if _, err := s.Next(); !errors.Is(err, io.EOF) {
		t.Fatalf("Next after the agent stopped = %v, want io.EOF", err)
	}
}

func TestBadFilter(t *testing.T) {
	a := startAgent(t)
	c := client.New(a.socket)
	defer c.Close()
	for q, want := range map[string]string{
		"capture": `unknown event type "capture": use one of drop, trace, policy-verdict`,
	} {
		_, err := c.Monitor(context.Background(), []string{q}, nil)
		var apiErr *client.APIError
		if !errors.As(err, &apiErr) || apiErr.StatusCode != 400 || apiErr.Payload.Message != want {
			t.Errorf("Monitor(type=%s) error = %v, want 400 %q", q, err, want)
		}
	}
	if _, err := monitor.ParseFilter(map[string][]string{"endpoint": {"0"}}); err == nil ||
		err.Error() != `invalid endpoint "0": want an endpoint ID from 1 to 65535` {
		t.Errorf("ParseFilter(endpoint=0) = %v", err)
	}
	f, err := monitor.ParseFilter(map[string][]string{"type": {"drop,trace", "policy-verdict"}, "endpoint": {"42,43", "7"}})
	if err != nil || len(f.Types) != 3 || !slices.Equal(f.EndpointIDs, []uint16{42, 43, 7}) {
		t.Errorf("ParseFilter = %+v, %v", f, err)
	}
}

// gatedWriter is a ResponseWriter whose first flush (the stream's
// header) reports on flushed and then waits for release, so the test can
// publish while the handler is stuck writing, as with a slow client.
// Later flushes are reported on later.
type gatedWriter struct {
	*httptest.ResponseRecorder
	flushed, release chan struct{}
	later            chan struct{}
	n                int
}

func (g *gatedWriter) Flush() {
	g.n++
	g.ResponseRecorder.Flush()
	if g.n == 1 {
		close(g.flushed)
		<-g.release
		return
	}
	g.later <- struct{}{}
}

// TestSlowClientGetsLostRecord: events beyond the queue are dropped for a
// client that does not read, and the stream says how many before the next
// event.
func TestSlowClientGetsLostRecord(t *testing.T) {
	h := hub.NewHub()
	w := &gatedWriter{ResponseRecorder: httptest.NewRecorder(), flushed: make(chan struct{}),
		release: make(chan struct{}), later: make(chan struct{}, 1)}
	ctx, cancel := context.WithCancel(context.Background())
	req := httptest.NewRequest("GET", "/v1/monitor?type=drop", nil).WithContext(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		monitor.StreamHandler(h, 2)(w, req)
	}()
	<-w.flushed
	for i := range 10 {
		ev := drop(1)
		ev.Length = uint32(i + 1)
		h.Publish(ev)
	}
	close(w.release)
	// The handler writes the lost record and the two queued events, then
	// flushes.
	<-w.later
	cancel()
	<-done
	want := `{"type":"lost","timestamp":"2026-12-01T06:00:00Z","src-identity":0,"dst-identity":0,"lost":8}`
	lines := strings.Split(strings.TrimSpace(w.Body.String()), "\n")
	if len(lines) != 3 || lines[0] != want || !strings.Contains(lines[1], `"length":1}`) || !strings.Contains(lines[2], `"length":2}`) {
		t.Errorf("stream =\n%s\nwant a lost record of 8, then the first two events", w.Body.String())
	}
	if ct := w.Header().Get("Content-Type"); ct != "application/x-ndjson" {
		t.Errorf("Content-Type = %q", ct)
	}
}

func TestQueueSizeValidated(t *testing.T) {
	h := hivetest.New(t, []string{"--socket-path=" + filepath.Join(t.TempDir(), "s.sock"), "--monitor-queue-size=0"},
		metrics.Cell, agentapi.Cell, monitor.Cell)
	err := h.Start(context.Background())
	if err == nil {
		_ = h.Stop(context.Background())
		t.Fatal("start with --monitor-queue-size=0 succeeded")
	}
	if !strings.Contains(err.Error(), "--monitor-queue-size=0: give the number of events to buffer") {
		t.Errorf("error %v does not name the flag", err)
	}
}
