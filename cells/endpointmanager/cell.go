// Package endpointmanager is the agent cell that owns local endpoints: one
// per pod (keyed by container ID and pod namespace/name), with a node-unique
// ID, a lifecycle state, a security identity, state persisted in the state
// directory and restored after a restart, and the node's health endpoint.
// It is the only writer of the endpoints table (statedb/endpoints).
package endpointmanager

import (
	"github.com/cilium/statedb"

	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/statedb/endpoints"
	"github.com/cellium/cellium/statedb/identity"
	ipamtables "github.com/cellium/cellium/statedb/ipam"
)

// Cell provides the endpoints table and the endpoint API.
var Cell = hive.Module("endpoint-manager", "Local endpoints",
	// The table is written only by the manager...
	hive.ProvidePrivate(endpoints.NewTable),
	// ...and read by the CEP synchronizer, the datapath and the CLI.
	hive.Provide(statedb.RWTable[*endpoints.Endpoint].ToTable),
	// The identity requests: the manager asks (one row per endpoint), the
	// identity allocator answers in the rows' Result and holds their
	// references.
	hive.ProvidePrivate(identity.NewRequestsTable),
	hive.Provide(func(t statedb.RWTable[*identity.Request]) identity.RequestAnswers {
		return identity.RequestAnswers{RWTable: t}
	}),
	// The IPAM requests: the manager asks (claims and releases of the
	// CNI API, restored addresses), IPAM answers in the rows' Result.
	hive.ProvidePrivate(ipamtables.NewRequestsTable),
	hive.Provide(func(t statedb.RWTable[*ipamtables.Request]) ipamtables.RequestAnswers {
		return ipamtables.RequestAnswers{RWTable: t}
	}),
	// The manager; created here, restored and run by the hooks below.
	hive.ProvidePrivate(newManager),
	// PUT/DELETE/GET /v1/endpoint...
	hive.Provide(apiHandlers),
	// Restore at start, follow pod label changes, keep the health endpoint.
	hive.Invoke(registerJobs),
	// cellium_endpoint_state, when the agent has a metrics registry.
	hive.Invoke(registerMetrics),
)
