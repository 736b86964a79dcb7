// Package cepsync is the agent cell that mirrors each local endpoint into
// its CiliumEndpoint: same name and namespace as the pod, an ownerReference
// to the pod, and .status equal to what `cellium endpoint get` shows. It
// never takes over a CEP that another pod or node owns, writes only when the
// status changes and the endpoint rests (a new pod's CEP is created once,
// ready), leaves the CEP of a deleted endpoint to Kubernetes' garbage
// collector and deletes it itself only when the collector has not
// (GCGrace) or the pod lives on, and at start (once the endpoint restore is
// done) deletes CEPs of this node that match no endpoint. Its budget: one
// API write per pod life (Documentation/operations/api-write-budget.md).
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
