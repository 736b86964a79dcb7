package metrics

import (
	"fmt"
	"log/slog"
	"net"
	"strings"

	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/cells/hive/httpserve"
	"github.com/cellium/cellium/cells/hubble"
)

// Cell counts flows into Hubble's metrics and serves them on
// --hubble-metrics-server.
var Cell = hive.Module("hubble-metrics", "Hubble flow metrics on --hubble-metrics-server",
	// --hubble-metrics-server, --hubble-metrics, --enable-hubble-open-metrics;
	// a bad list stops start-up.
	hive.Config(DefaultConfig),
	// The sink the flow producer feeds (a no-op when no server is set),
	// and the metrics server's lifecycle.
	hive.Provide(newSink),
)

// sinkParams is what newSink takes.
type sinkParams struct {
	hive.In
	Config    Config
	Lifecycle hive.Lifecycle
	Log       *slog.Logger
}

func newSink(p sinkParams) (hubble.SinkOut, error) {
	if p.Config.HubbleMetricsServer == "" {
		return hubble.SinkOut{Sink: nopSink{}}, nil
	}
	specs, err := ParseSpecs(p.Config.HubbleMetrics)
	if err != nil {
		return hubble.SinkOut{}, fmt.Errorf("--hubble-metrics: %w", err)
	}
	m, err := New(specs)
	if err != nil {
		return hubble.SinkOut{}, fmt.Errorf("--hubble-metrics: %w", err)
	}
	names := make([]string, len(specs))
	for i, s := range specs {
		names[i] = s.Name
	}
	addr := p.Config.HubbleMetricsServer
	p.Lifecycle.Append(httpserve.Hook("hubble-metrics", func() (net.Listener, error) {
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			return nil, fmt.Errorf("listen on --hubble-metrics-server=%s: %w", addr, err)
		}
		p.Log.Info("hubble metrics enabled", "metrics", strings.Join(names, ","), "address", ln.Addr().String())
		return ln, nil
	}, m.Handler(p.Config.EnableHubbleOpenMetrics), p.Log, nil))
	return hubble.SinkOut{Sink: m}, nil
}
