// Package cepsync is the agent cell that mirrors each local endpoint into
// its CiliumEndpoint: same name and namespace as the pod, an ownerReference
// to the pod, and .status equal to what `cellium endpoint get` shows. It
// never takes over a CEP that another pod or node owns, writes only when the
// status changes, deletes the CEP with the endpoint, and at start (once the
// endpoint restore is done) deletes CEPs of this node that match no
// endpoint.
package cepsync

import (
	"github.com/cilium/statedb"

	"github.com/cellium/cellium/cells/hive"
)

// Cell keeps CiliumEndpoints in step with the endpoints table.
var Cell = hive.Module("cep-sync", "CiliumEndpoint synchronizer",
	hive.Config(DefaultConfig),
	// Desired CEPs: derived from endpoints, written only here.
	hive.ProvidePrivate(NewDesiredTable),
	// Anyone may read what the agent wants each CEP to be, and its status.
	hive.Provide(statedb.RWTable[*DesiredCEP].ToTable),
	// Endpoints -> desired CEPs, and desired CEPs -> the API server.
	hive.Invoke(registerJobs),
)
