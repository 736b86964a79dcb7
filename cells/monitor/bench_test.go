package monitor_test

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/cellium/cellium/api/v1/client"
	"github.com/cellium/cellium/cells/agentapi"
	"github.com/cellium/cellium/cells/hive/hivetest"
	"github.com/cellium/cellium/cells/metrics"
	"github.com/cellium/cellium/cells/monitor"
	hub "github.com/cellium/cellium/statedb/monitor"
)

// BenchmarkStream measures events through the whole agent side: Publish
// into the hub, the handler's NDJSON encoding on the unix socket, and the
// client's decoding. The queue is large enough that nothing is lost when
// the publisher waits for the reader every 1024 events.
func BenchmarkStream(b *testing.B) {
	sock := filepath.Join(b.TempDir(), "api.sock")
	var h *hub.Hub
	hivetest.Start(b, []string{"--socket-path=" + sock, "--monitor-queue-size=4096"},
		metrics.Cell, agentapi.Cell, monitor.Cell, hivetest.Capture(&h))
	c := client.New(sock)
	defer c.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s, err := c.Monitor(ctx, nil, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	ev := drop(7)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i += 1024 {
		n := min(1024, b.N-i)
		for range n {
			h.Publish(ev)
		}
		for range n {
			if _, err := s.Next(); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.StopTimer()
	if lost := h.Stats().Lost; lost != 0 {
		b.Fatalf("%d events lost", lost)
	}
}
