// Package operator composes the cellium operator: the agent's shared
// infrastructure cells plus operator-only cells.
package operator

import (
	"github.com/cellium/cellium/cells/cesbatcher"
	"github.com/cellium/cellium/cells/clusterpool"
	"github.com/cellium/cellium/cells/crdregister"
	"github.com/cellium/cellium/cells/endpointgc"
	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/cells/identitygc"
	"github.com/cellium/cellium/cells/k8s"
	"github.com/cellium/cellium/cells/kvstore"
	"github.com/cellium/cellium/cells/kvstore/heartbeat"
	"github.com/cellium/cellium/cells/kvstore/nodesgc"
	"github.com/cellium/cellium/cells/lbipam"
	"github.com/cellium/cellium/cells/leaderelection"
	"github.com/cellium/cellium/cells/metrics"
	"github.com/cellium/cellium/cells/operatorapi"
	"github.com/cellium/cellium/cells/policyvalidator"
	"github.com/cellium/cellium/cells/pprof"
	"github.com/cellium/cellium/cells/servicemap"
)

// Infrastructure is the operator's client, metrics, health API and CRDs.
var Infrastructure = hive.Module("operator-infra", "Operator infrastructure",
	k8s.OperatorClientCell,
	// The etcd client with --kvstore=etcd (the heartbeat, the kvstore
	// identity and node GCs).
	kvstore.Cell,
	metrics.Cell,
	// Go runtime profiles over HTTP with --operator-pprof (off by default).
	pprof.OperatorCell,
	// Before the health API: /healthz answers only once the CRDs are served.
	crdregister.Cell,
	operatorapi.Cell,
	// Requests to the API server say who we are.
	hive.Provide(func() k8s.UserAgent { return "cellium-operator" }),
)

// ControlPlane is the operator's resources and leader-only controllers.
var ControlPlane = hive.Module("operator-controlplane", "Operator control plane",
	leaderelection.Cell,
	k8s.OperatorResourcesCell,
	// Pod CIDRs into CiliumNodes (leader only).
	clusterpool.Cell,
	// Deletes CiliumEndpoints of gone or finished pods (leader only).
	endpointgc.Cell,
	// Deletes CiliumIdentities no CiliumEndpoint uses (leader only).
	identitygc.Cell,
	// Writes cilium/.heartbeat every minute with --kvstore=etcd (leader
	// only); agents report their kvstore session stale without it.
	heartbeat.Cell,
	// Deletes the kvstore node keys of nodes without a CiliumNode with
	// --kvstore=etcd (leader only; --synchronize-k8s-nodes).
	nodesgc.Cell,
	// CiliumEndpoints batched into CiliumEndpointSlices (leader only;
	// --enable-cilium-endpoint-slice).
	cesbatcher.Cell,
	// CNP/CCNP status conditions Valid and Supported (written by the leader only).
	policyvalidator.Cell,
	// Addresses of LoadBalancer Services from CiliumLoadBalancerIPPools
	// (leader only; --enable-lb-ipam, on by default as in Cilium).
	lbipam.Cell,
)

// Operator is the whole operator.
var Operator = hive.Module("operator", "Cellium Operator",
	Infrastructure,
	ControlPlane,
	// The Hubble service map page, on every replica (read-only, not
	// leader-only); off unless --hubble-service-map-listen-address.
	servicemap.Cell,
)
