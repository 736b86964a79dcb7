// Package daemon composes the cellium agent: its cells and its command.
package daemon

import (
	"github.com/cellium/cellium/cells/agentapi"
	"github.com/cellium/cellium/cells/cepsync"
	"github.com/cellium/cellium/cells/cniconfig"
	"github.com/cellium/cellium/cells/doctor"
	"github.com/cellium/cellium/cells/endpointmanager"
	"github.com/cellium/cellium/cells/endpointpolicy"
	"github.com/cellium/cellium/cells/healthcheck"
	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/cells/hubble"
	hubblemetrics "github.com/cellium/cellium/cells/hubble/metrics"
	"github.com/cellium/cellium/cells/hubble/observer"
	"github.com/cellium/cellium/cells/identity"
	"github.com/cellium/cellium/cells/ipam"
	"github.com/cellium/cellium/cells/ipcache"
	"github.com/cellium/cellium/cells/k8s"
	"github.com/cellium/cellium/cells/kvstore"
	"github.com/cellium/cellium/cells/kvstore/heartbeat"
	"github.com/cellium/cellium/cells/kvstoresync"
	"github.com/cellium/cellium/cells/lbevents"
	"github.com/cellium/cellium/cells/lbhealthserver"
	"github.com/cellium/cellium/cells/metrics"
	"github.com/cellium/cellium/cells/monitor"
	"github.com/cellium/cellium/cells/nodediscovery"
	"github.com/cellium/cellium/cells/pprof"
	"github.com/cellium/cellium/cells/statedir"
)

// Infrastructure is what every agent feature stands on: the Kubernetes
// client, metrics, the API socket and the state directory.
var Infrastructure = hive.Module("infra", "Infrastructure",
	k8s.ClientCell,
	metrics.Cell,
	// Go runtime profiles over HTTP with --pprof (off by default).
	pprof.AgentCell,
	agentapi.Cell,
	statedir.Cell,
	// The etcd client and session lease with --kvstore=etcd (nil without).
	kvstore.Cell,
	// The operator's cilium/.heartbeat: degraded when stale (--kvstore=etcd).
	heartbeat.WatcherCell,
	// Requests to the API server say who we are.
	hive.Provide(func() k8s.UserAgent { return "cellium-agent" }),
)

// ControlPlane holds the agent's control-plane cells.
var ControlPlane = hive.Module("controlplane", "Control plane",
	// This node's name, from K8S_NODE_NAME.
	hive.Provide(k8s.NodeNameFromEnv),
	k8s.AgentResourcesCell,
	nodediscovery.Cell,
	ipam.Cell,
	identity.Cell,
	endpointmanager.Cell,
	cepsync.Cell,
	endpointpolicy.Cell,
	// With --kvstore=etcd: other nodes and ipcache entries from etcd, and
	// this node's endpoints' ipcache keys into it.
	kvstoresync.Cell,
	// Prefix -> identity for the datapath, from endpoints, nodes, CEPs and policy CIDRs.
	ipcache.Cell,
	cniconfig.Cell,
	// Probes the health endpoint (Cluster health in cellium status);
	// cellium-agent adds healthendpoint.Cell for its namespace and veth.
	healthcheck.Cell,
	// GET /v1/doctor. cellium-agent adds hostlinks.Cell for the veth checks.
	doctor.Cell,
	// The datapath event hub and GET /v1/monitor; cellium-agent adds
	// datapathmonitor.Cell, which fills the hub from the BPF ring buffer.
	monitor.Cell,
	// Hubble flows from the hub's events, enriched from the tables above,
	// handed to every hubble.Sink (--enable-hubble).
	hubble.Cell,
	// Hubble's flow metrics (hubble_*) on --hubble-metrics-server: a sink
	// of the Hubble flow producer.
	hubblemetrics.Cell,
	// Hubble's ring buffer of flows and its Observer and Peer gRPC services
	// (hubble.sock, --hubble-listen-address): the upstream hubble CLI and
	// hubble-relay read flows from it.
	observer.Cell,
	// The healthCheckNodePorts of Services with externalTrafficPolicy
	// Local, with --kube-proxy-replacement=true (reads the Services and
	// EndpointSlices tables).
	lbhealthserver.Cell,
	// Warning Events on the Services (and pods' hostPorts) the load
	// balancer refuses or serves degraded (reads lb-service-states).
	lbevents.Cell,
)

// Agent is the whole agent.
var Agent = hive.Module("agent", "Cellium Agent", Infrastructure, ControlPlane)
