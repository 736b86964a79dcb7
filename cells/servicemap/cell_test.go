package servicemap_test

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/cellium/cellium/cells/hive/hivetest"
	"github.com/cellium/cellium/cells/servicemap"
)

// The map follows the agent's real Hubble server: it shows the upstream
// down while no agent listens, connects once one does, draws the flows,
// and reconnects after the agent restarts.
func TestServiceMapFollowsAgentAndReconnects(t *testing.T) {
	socket := socketPath(t)
	base := startMap(t, "unix://"+socket)
	s := waitGraph(t, base, "the upstream shown down", func(s servicemap.Snapshot) bool {
		return s.Upstream.State == servicemap.UpstreamDisconnected
	})
	if s.Upstream.Error == "" || s.Upstream.RetryAt == nil || s.Upstream.Address != "unix://"+socket {
		t.Errorf("a down upstream says why and when it retries: %+v", s.Upstream)
	}

	a := newAgent(t, socket)
	waitGraph(t, base, "connected", func(s servicemap.Snapshot) bool {
		return s.Upstream.State == servicemap.UpstreamConnected
	})
	a.send(deniedFlow())
	a.send(allowedFlow())
	s = waitGraph(t, base, "both edges", func(s servicemap.Snapshot) bool {
		_, d := findEdge(s, deniedEdge)
		_, f := findEdge(s, allowedEdge)
		return d && f
	})
	if !strings.HasPrefix(s.Upstream.Version, "cellium ") {
		t.Errorf("upstream version %q: want the agent's ServerStatus version", s.Upstream.Version)
	}
	d, _ := findEdge(s, deniedEdge)
	if d.State != servicemap.StateDropped || d.Dropped != 1 || len(d.DeniedBy) != 1 || d.DeniedBy[0] != "CiliumNetworkPolicy demo/db-deny-redis" {
		t.Errorf("denied edge %+v", d)
	}
	f, _ := findEdge(s, allowedEdge)
	if f.State != servicemap.StateForwarded || f.Forwarded != 1 || len(f.AllowedBy) != 1 || f.AllowedBy[0] != "CiliumNetworkPolicy demo/db-allow-web" {
		t.Errorf("allowed edge %+v", f)
	}

	a.stop(t)
	waitGraph(t, base, "the upstream down after the agent stopped", func(s servicemap.Snapshot) bool {
		return s.Upstream.State == servicemap.UpstreamDisconnected
	})
	a = startAgent(t, socket)
	a.send(deniedFlow())
	s = waitGraph(t, base, "a second drop after the reconnection", func(s servicemap.Snapshot) bool {
		e, ok := findEdge(s, deniedEdge)
		return ok && e.Dropped == 2
	})
	if s.Upstream.State != servicemap.UpstreamConnected || s.Stats.Flows != 3 {
		t.Errorf("after the reconnection: upstream %+v, stats %+v (want 3 flows: none counted twice)", s.Upstream, s.Stats)
	}
}

// At start the map reads the flows of the last --hubble-service-map-since.
func TestServiceMapReadsRecentFlowsAtStart(t *testing.T) {
	socket := socketPath(t)
	a := startAgent(t, socket)
	old := deniedFlow()
	old.Time.Seconds -= 3600 // an hour ago: before --hubble-service-map-since
	a.send(old)
	a.send(deniedFlow())
	base := startMap(t, "unix://"+socket, "--hubble-service-map-since=10m")
	s := waitGraph(t, base, "the recent drop", func(s servicemap.Snapshot) bool {
		_, ok := findEdge(s, deniedEdge)
		return ok
	})
	if e, _ := findEdge(s, deniedEdge); e.Dropped != 1 {
		t.Errorf("edge %+v: want the one drop of the last 10 minutes, not the one of an hour ago", e)
	}
}

func TestHTTPIsReadOnly(t *testing.T) {
	socket := socketPath(t)
	startAgent(t, socket)
	base := startMap(t, "unix://"+socket)
	for _, tc := range []struct {
		path, contentType, contains string
	}{
		{"/", "text/html; charset=utf-8", `<svg id="map"`},
		{"/app.js", "text/javascript; charset=utf-8", "new EventSource(\"api/events\")"},
		{"/app.css", "text/css; charset=utf-8", ".edge.dropped"},
		{"/api/graph", "application/json", `"upstream"`},
	} {
		resp, err := http.Get(base + tc.path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != tc.contentType || !strings.Contains(string(body), tc.contains) {
			t.Errorf("GET %s: %s, %q, body lacks %q", tc.path, resp.Status, resp.Header.Get("Content-Type"), tc.contains)
		}
		if csp := resp.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "script-src 'self'") {
			t.Errorf("GET %s: Content-Security-Policy %q", tc.path, csp)
		}
	}
	for _, method := range []string{http.MethodPost, http.MethodPut, http.MethodDelete, http.MethodPatch} {
		for _, path := range []string{"/", "/api/graph", "/api/events"} {
			req, _ := http.NewRequest(method, base+path, strings.NewReader("{}"))
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusMethodNotAllowed || resp.Header.Get("Allow") != "GET, HEAD" || !strings.Contains(string(body), "read-only") {
				t.Errorf("%s %s: %s, Allow %q, %q; want 405 saying it is read-only", method, path, resp.Status, resp.Header.Get("Allow"), body)
			}
		}
	}
	resp, err := http.Get(base + "/api/nothing")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Errorf("GET /api/nothing: %s, want 404", resp.Status)
	}
}

// /api/events pushes the graph when it changes.
func TestEventsPushChanges(t *testing.T) {
	socket := socketPath(t)
	a := startAgent(t, socket)
	base := startMap(t, "unix://"+socket)
	waitGraph(t, base, "connected", func(s servicemap.Snapshot) bool {
		return s.Upstream.State == servicemap.UpstreamConnected
	})
	resp, err := http.Get(base + "/api/events")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("Content-Type %q", ct)
	}
	r := bufio.NewReader(resp.Body)
	if first := readEvent(t, r); !strings.Contains(first, `"state":"connected"`) || strings.Contains(first, "6379") {
		t.Fatalf("first event %s", first)
	}
	start := time.Now()
	a.send(deniedFlow())
	for {
		ev := readEvent(t, r)
		if strings.Contains(ev, `"id":"`+deniedEdge+`"`) {
			t.Logf("the drop reached /api/events in %s", time.Since(start).Round(time.Millisecond))
			break
		}
		if time.Since(start) > 10*time.Second {
			t.Fatalf("no event with the drop after 10 s; last %s", ev)
		}
	}
}

func TestConfigRejectsBadInput(t *testing.T) {
	on := func(c servicemap.Config) servicemap.Config {
		c.HubbleServiceMapListenAddress = "localhost:12000"
		if c.HubbleRelayAddress == "" {
			c.HubbleRelayAddress = "hubble-relay:80"
		}
		return c
	}
	def := servicemap.DefaultConfig
	if err := def.Validate(); err != nil {
		t.Errorf("the default (off): %v", err)
	}
	if err := on(def).Validate(); err != nil {
		t.Errorf("on with a relay: %v", err)
	}
	unix := on(def)
	unix.HubbleRelayAddress = "unix:///var/run/cellium/hubble.sock"
	if err := unix.Validate(); err != nil {
		t.Errorf("on with a socket: %v", err)
	}
	for _, tc := range []struct {
		name string
		mod  func(*servicemap.Config)
		want string
	}{
		{"no relay", func(c *servicemap.Config) { c.HubbleRelayAddress = "" }, "give --hubble-relay-address"},
		{"bad listen", func(c *servicemap.Config) { c.HubbleServiceMapListenAddress = "12000" }, "invalid --hubble-service-map-listen-address"},
		{"relay without port", func(c *servicemap.Config) { c.HubbleRelayAddress = "hubble-relay" }, "invalid --hubble-relay-address"},
		{"empty socket", func(c *servicemap.Config) { c.HubbleRelayAddress = "unix://" }, "give the socket's path"},
		{"tls to a socket", func(c *servicemap.Config) {
			c.HubbleRelayAddress = "unix:///s"
			c.HubbleRelayTLSCAFiles = []string{"ca.pem"}
		}, "do not apply"},
		{"cert without key", func(c *servicemap.Config) {
			c.HubbleRelayTLSCAFiles = []string{"ca.pem"}
			c.HubbleRelayTLSClientCertFile = "c.pem"
		}, "go together"},
		{"cert without CA", func(c *servicemap.Config) {
			c.HubbleRelayTLSClientCertFile = "c.pem"
			c.HubbleRelayTLSClientKeyFile = "k.pem"
		}, "give --hubble-relay-tls-ca-files"},
		{"zero edges", func(c *servicemap.Config) { c.HubbleServiceMapMaxEdges = 0 }, "--hubble-service-map-max-edges=0"},
		{"zero idle", func(c *servicemap.Config) { c.HubbleServiceMapIdleTimeout = 0 }, "--hubble-service-map-idle-timeout"},
		{"negative since", func(c *servicemap.Config) { c.HubbleServiceMapSince = -time.Second }, "--hubble-service-map-since"},
	} {
		c := on(def)
		tc.mod(&c)
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error containing %q", tc.name, err, tc.want)
		}
	}
}

// Stopping the operator ends open /api/events streams at once: an open
// page does not hold the shutdown up.
func TestStopEndsEventStreams(t *testing.T) {
	socket := socketPath(t)
	startAgent(t, socket)
	addr := freeAddr(t)
	h := hivetest.New(t, []string{"--hubble-service-map-listen-address=" + addr, "--hubble-relay-address=unix://" + socket}, servicemap.Cell)
	if err := h.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	resp, err := http.Get("http://" + addr + "/api/events")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	r := bufio.NewReader(resp.Body)
	readEvent(t, r)
	start := time.Now()
	if err := h.Stop(context.Background()); err != nil {
		t.Fatalf("stop: %v", err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("stopping with an open event stream took %s", took)
	}
	if _, err := io.ReadAll(r); err != nil {
		t.Logf("the stream ended with %v", err)
	}
}
