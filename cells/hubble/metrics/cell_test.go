package metrics_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/cellium/cellium/cells/hive/hivetest"
	"github.com/cellium/cellium/cells/hubble"
	"github.com/cellium/cellium/cells/hubble/metrics"
)

// freeAddr is a loopback address with a port nobody listens on now.
func freeAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

func scrape(t testing.TB, addr string) string {
	t.Helper()
	client := &http.Client{Timeout: 5 * time.Second}
	resp, err := client.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics: %s\n%s", resp.Status, body)
	}
	return string(body)
}

// startCell starts the cell with args and returns the sinks the flow
// producer would get.
func startCell(t testing.TB, args ...string) []hubble.Sink {
	t.Helper()
	var in hubble.SinksIn
	hivetest.Start(t, args, metrics.Cell, hivetest.Capture(&in))
	return in.Sinks
}

// The cell serves the enabled metrics on --hubble-metrics-server, counting
// what reaches its sink.
func TestCellServesMetrics(t *testing.T) {
	addr := freeAddr(t)
	sinks := startCell(t, "--hubble-metrics-server="+addr,
		"--hubble-metrics=drop,tcp,flow,port-distribution,policy:sourceContext=pod;destinationContext=pod")
	if len(sinks) != 1 {
		t.Fatalf("the cell provides %d sinks, want 1", len(sinks))
	}
	for _, f := range conversation {
		sinks[0].OnFlow(f)
	}
	body := scrape(t, addr)
	for _, want := range []string{
		`hubble_drop_total{protocol="TCP",reason="POLICY_DENIED"} 2`,
		`hubble_flows_processed_total{protocol="TCP",subtype="to-endpoint",type="Trace",verdict="FORWARDED"} 2`,
		`hubble_policy_verdicts_total{action="forwarded",destination="demo/web-1",direction="ingress",match="l3-l4",source="demo/client-7d9f"} 1`,
		`hubble_tcp_flags_total{family="IPv4",flag="SYN-ACK"} 1`,
		`hubble_port_distribution_total{port="80",protocol="TCP"} 4`,
		`hubble_lost_events_total{source="perf_event_ring_buffer"} 0`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %s:\n%s", want, body)
		}
	}
	// Only Hubble's metrics: the agent's own registry is another server.
	for _, line := range strings.Split(body, "\n") {
		if line != "" && !strings.HasPrefix(line, "#") && !strings.HasPrefix(line, "hubble_") {
			t.Errorf("/metrics serves %q, not a Hubble metric", line)
		}
	}
}

// Without --hubble-metrics-server nothing listens and the sink counts
// nothing.
func TestCellOffByDefault(t *testing.T) {
	sinks := startCell(t, "--hubble-metrics=drop")
	if len(sinks) != 1 {
		t.Fatalf("the cell provides %d sinks, want 1", len(sinks))
	}
	for _, f := range conversation {
		sinks[0].OnFlow(f)
	}
	if _, ok := sinks[0].(*metrics.Metrics); ok {
		t.Error("with no --hubble-metrics-server the sink is a *Metrics; want a no-op")
	}
}

// Bad flags stop the hive with a message naming the flag and the fix.
func TestCellRefusesBadFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		says string
	}{
		{[]string{"--hubble-metrics-server=127.0.0.1:0", "--hubble-metrics=drop,http"}, `--hubble-metrics: unknown hubble metric "http": it needs the L7 HTTP proxy`},
		{[]string{"--hubble-metrics-server=127.0.0.1:0", "--hubble-metrics=flow:sourceContext=node"}, `--hubble-metrics: bad hubble metric option sourceContext of metric "flow": unknown context "node"`},
		{[]string{"--hubble-metrics-server=9965"}, `--hubble-metrics-server="9965": give host:port`},
	} {
		var in hubble.SinksIn
		h := hivetest.New(t, tc.args, metrics.Cell, hivetest.Capture(&in))
		err := h.Start(context.Background())
		if err == nil {
			_ = h.Stop(context.Background())
			t.Errorf("%v: the hive started", tc.args)
			continue
		}
		if !strings.Contains(err.Error(), tc.says) {
			t.Errorf("%v: %v; want it to say %s", tc.args, err, tc.says)
		}
	}
}

// A busy address stops start-up with the flag in the message.
func TestCellBusyAddress(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var in hubble.SinksIn
	h := hivetest.New(t, []string{"--hubble-metrics-server=" + ln.Addr().String(), "--hubble-metrics=drop"}, metrics.Cell, hivetest.Capture(&in))
	err = h.Start(context.Background())
	if err == nil {
		_ = h.Stop(context.Background())
		t.Fatal("the hive started on a busy address")
	}
	if !strings.Contains(err.Error(), "listen on --hubble-metrics-server="+ln.Addr().String()) {
		t.Errorf("%v; want it to name --hubble-metrics-server", err)
	}
}
