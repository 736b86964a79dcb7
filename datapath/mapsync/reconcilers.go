package mapsync

import (
	"net/netip"

	"github.com/cellium/cellium/statedb/ipcache"
	"github.com/cellium/cellium/statedb/mapstate"
	"github.com/cellium/cellium/statedb/reconciler"
)

// Reconciler names (also the jobs' "reconcile-<name>" and the metrics'
// labels).
const (
	IPCacheReconciler   = "ipcache-map"
	EndpointsReconciler = "lxc-map"
	PoliciesReconciler  = "policy-maps"
)

// IPCacheConfig returns the configuration of the reconciler of the
// ipcache table into m.
func IPCacheConfig(t ipcache.StatusTable, m Map[netip.Prefix, IPCacheValue]) reconciler.Config[*ipcache.Entry] {
	return reconciler.Config[*ipcache.Entry]{
		Name: IPCacheReconciler, Table: t.RWTable, Operations: NewIPCacheOps(m),
		GetStatus: ipcache.GetStatus, SetStatus: (*ipcache.Entry).WithStatus,
		// A full ipcache is 512k entries; rounds are batches.
		RoundLimit: 10000,
	}
}

// EndpointsConfig returns the configuration of the reconciler of the
// lxc-map table into m.
func EndpointsConfig(t Tables, m Map[netip.Addr, EndpointInfo]) reconciler.Config[*mapstate.Endpoint] {
	return reconciler.Config[*mapstate.Endpoint]{
		Name: EndpointsReconciler, Table: t.LXC, Operations: NewEndpointOps(m),
		GetStatus: func(e *mapstate.Endpoint) reconciler.Status { return e.Status },
		SetStatus: (*mapstate.Endpoint).WithStatus,
	}
}

// PoliciesConfig returns the configuration of the reconciler of the
// policy-maps table with ops (NewPolicyOps over the policy maps and
// t.Endpoints).
func PoliciesConfig(t Tables, ops *PolicyOps) reconciler.Config[*mapstate.PolicyMap] {
	return reconciler.Config[*mapstate.PolicyMap]{
		Name: PoliciesReconciler, Table: t.PolicyMap, Operations: ops,
		GetStatus: func(p *mapstate.PolicyMap) reconciler.Status { return p.Status },
		SetStatus: (*mapstate.PolicyMap).WithStatus,
	}
}
