// Package monitor is the agent's monitor cell: it owns the hub of
// datapath events (statedb/monitor) that the datapath publishes into, and
// serves GET /v1/monitor, the stream `cellium monitor` prints. The
// datapath side (reading the BPF ring buffer) is daemon/datapathmonitor.
package monitor

import (
	"context"

	"github.com/cellium/cellium/cells/hive"
	hub "github.com/cellium/cellium/statedb/monitor"
)

// Cell provides the event hub and serves GET /v1/monitor.
var Cell = hive.Module("monitor", "Datapath event hub and the monitor API (cellium monitor)",
	// --monitor-queue-size.
	hive.Config(DefaultConfig),
	// The hub: *Hub for readers, Publisher for the datapath.
	hive.Provide(newHub),
	// GET /v1/monitor on the agent API.
	hive.Provide(apiHandlers),
	// cellium_monitor_* metrics of the hub.
	hive.Invoke(registerMetrics),
)

type hubOut struct {
	hive.Out
	Hub       *hub.Hub
	Publisher hub.Publisher
}

// newHub creates the hub; stopping the hive closes it, which ends the
// subscriptions left (the API server has already ended its streams).
func newHub(lc hive.Lifecycle) hubOut {
	h := hub.NewHub()
	lc.Append(hive.Hook{Name: "close-monitor-hub", OnStop: func(context.Context) error {
		h.Close()
		return nil
	}})
	return hubOut{Hub: h, Publisher: h}
}
