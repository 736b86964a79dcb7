package metrics

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"time"

	"github.com/cilium/statedb"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
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
	// the metrics server's lifecycle, and the job that forgets the series
	// of deleted pods (from the CiliumEndpoints table).
	hive.Provide(newSink),
)

// Timing of the forgetting of deleted pods' series.
const (
	// forgetGrace is Hubble's: the series of a pod stay a minute after
	// its CiliumEndpoint goes, so that the last counts are scraped.
	forgetGrace = time.Minute
	// forgetEvery is how often pods past their grace are forgotten.
	forgetEvery = 10 * time.Second
)

// forgetTiming overrides forgetGrace and forgetEvery (tests).
type forgetTiming struct{ grace, every time.Duration }

// sinkParams is what newSink takes.
type sinkParams struct {
	hive.In
	Config    Config
	Lifecycle hive.Lifecycle
	Jobs      hive.Jobs
	Log       *slog.Logger
	DB        *statedb.DB
	// CEPs tell which pods went; without the table (a partial hive) the
	// series of deleted pods stay.
	CEPs   statedb.Table[*ciliumv2.CiliumEndpoint] `optional:"true"`
	Timing *forgetTiming                           `optional:"true"`
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

	if p.CEPs != nil {
		timing := forgetTiming{grace: forgetGrace, every: forgetEvery}
		if p.Timing != nil {
			timing = *p.Timing
		}
		fg := NewForgetter(m, timing.grace)
		p.Jobs.Add(
			hive.ObserveTable("hubble-metrics-deleted-pods", p.DB, p.CEPs, func(_ context.Context, c statedb.Change[*ciliumv2.CiliumEndpoint]) error {
				if c.Deleted {
					fg.Deleted(c.Object.Namespace, c.Object.Name, time.Now())
				} else {
					fg.Exists(c.Object.Namespace, c.Object.Name)
				}
				return nil
			}),
			hive.Timer("hubble-metrics-forget-pods", func(context.Context) error {
				if n := fg.Forget(time.Now()); n > 0 {
					p.Log.Debug("forgot the hubble metrics series of deleted pods", "series", n)
				}
				return nil
			}, timing.every),
		)
	}
	return hubble.SinkOut{Sink: m}, nil
}
