// Package pprof is the profiling cell: with --pprof (the agent) or
// --operator-pprof (the operator), Cilium's flags, it serves Go's runtime
// profiles (/debug/pprof/: heap, goroutine, profile, trace, ...) over HTTP
// on the configured address and port, in the format `go tool pprof`
// reads. Off by default; it then listens nowhere.
package pprof

import (
	"github.com/cellium/cellium/cells/hive"
)

// AgentCell serves the agent's profiles with --pprof on
// --pprof-address:--pprof-port (default localhost:6060).
var AgentCell = hive.Module("pprof", "pprof HTTP server (runtime profiles)",
	hive.Config(DefaultAgentConfig),
	hive.Invoke(func(cfg AgentConfig, p serverParams) { register(cfg.settings(), p) }),
)

// OperatorCell serves the operator's profiles with --operator-pprof on
// --operator-pprof-address:--operator-pprof-port (default
// localhost:6061).
var OperatorCell = hive.Module("pprof", "pprof HTTP server (runtime profiles)",
	hive.Config(DefaultOperatorConfig),
	hive.Invoke(func(cfg OperatorConfig, p serverParams) { register(cfg.settings(), p) }),
)
