// Package metrics is the Prometheus registry cell: it provides the registry
// every cell registers its collectors in, records hook durations, reconciler
// operations and statedb table sizes, and serves /metrics on
// --prometheus-serve-addr.
package metrics

import (
	"github.com/cellium/cellium/cells/hive"
)

// Cell provides *prometheus.Registry, prometheus.Registerer and
// reconciler.Metrics, and serves them when --prometheus-serve-addr is set.
var Cell = hive.Module("metrics", "Prometheus metrics",
	hive.Config(DefaultConfig),
	// The registry others register into; process and Go collectors included.
	hive.Provide(NewRegistry, registerer),
	// Reconcilers report operations and error counts through this.
	hive.Provide(NewReconcilerMetrics),
	// Hive-wide collectors: hook durations, table sizes, module health.
	hive.Invoke(registerHiveCollectors),
	// The HTTP server, only when an address is configured.
	hive.Invoke(registerServer),
)
