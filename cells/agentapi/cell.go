// Package agentapi serves the agent's HTTP/JSON API on a unix socket. Cells
// contribute handlers through the "agent-api-handlers" value group; this
// cell serves health and the statedb tables itself.
package agentapi

import "github.com/cellium/cellium/cells/hive"

// Cell serves the API on --socket-path.
var Cell = hive.Module("agent-api", "Agent API on a unix socket",
	hive.Config(DefaultConfig),
	// Built-in handlers: health, statedb tables.
	hive.Provide(healthHandlers, statedbHandlers),
	// The server, listening from start to stop.
	hive.Invoke(registerServer),
)
