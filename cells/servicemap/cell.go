package servicemap

import (
	"context"
	"fmt"
	"log/slog"
	"net"

	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/cells/hive/httpserve"
)

// Cell serves the service map on --hubble-service-map-listen-address,
// from the flows of --hubble-relay-address. Off by default.
var Cell = hive.Module("hubble-service-map", "Live service map of Hubble flows in the browser",
	// --hubble-service-map-*, --hubble-relay-*.
	hive.Config(DefaultConfig),
	// The reader of the relay's flows and the HTTP server, from start to stop.
	hive.Invoke(register),
)

// registerParams is what register needs.
type registerParams struct {
	hive.In
	Config    Config
	Lifecycle hive.Lifecycle
	Jobs      hive.Jobs
	Log       *slog.Logger
}

func register(p registerParams) error {
	c := p.Config
	if !c.Enabled() {
		return nil
	}
	g, err := NewGraph(c.HubbleServiceMapMaxEdges, c.HubbleServiceMapIdleTimeout, nil)
	if err != nil {
		return err
	}
	creds, err := c.transportCredentials()
	if err != nil {
		return err
	}
	rd, err := NewReader(c.HubbleRelayAddress, creds, c.HubbleServiceMapSince, g, p.Log)
	if err != nil {
		return fmt.Errorf("invalid --hubble-relay-address: %w", err)
	}
	// Before the job's hook, so that it stops after the job.
	p.Lifecycle.Append(hive.Hook{Name: "close-relay-connection", OnStop: func(context.Context) error {
		return rd.Close()
	}})
	p.Jobs.Add(hive.Service("follow-flows", nil, func(ctx context.Context, h hive.Health) {
		h.OK("following flows of " + c.HubbleRelayAddress)
		rd.Run(ctx)
	}))
	p.Lifecycle.Append(httpserve.Hook("service-map", func() (net.Listener, error) {
		ln, err := net.Listen("tcp", c.HubbleServiceMapListenAddress)
		if err != nil {
			return nil, fmt.Errorf("listen on --hubble-service-map-listen-address=%s: %w", c.HubbleServiceMapListenAddress, err)
		}
		return ln, nil
	}, NewHandler(g), p.Log, nil))
	return nil
}
