package hubble

import (
	"context"
	"log/slog"

	"github.com/cilium/statedb"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/cells/hubble/parser"
	"github.com/cellium/cellium/cells/k8s"
	"github.com/cellium/cellium/statedb/endpoints"
	"github.com/cellium/cellium/statedb/ipcache"
	"github.com/cellium/cellium/statedb/lb"
	"github.com/cellium/cellium/statedb/monitor"
	"github.com/cellium/cellium/statedb/nodes"
	"github.com/cellium/cellium/statedb/policy"
)

// Cell produces Hubble flows from the monitor hub's datapath events for
// every Sink provided into the "hubble-sinks" group.
var Cell = hive.Module("hubble", "Hubble flows from datapath events",
	// --enable-hubble, --hubble-event-queue-size, --hubble-lost-event-send-interval.
	hive.Config(DefaultConfig),
	// Job "hubble-flows": subscribe to the hub, parse, enrich, hand to the sinks;
	// cellium_hubble_* counters.
	hive.Invoke(register),
)

// params are register's inputs: the hub, the tables flows are enriched
// from (the lb frontends only exist with the socket load balancer) and
// the sinks.
type params struct {
	hive.In

	Config    Config
	NodeName  k8s.NodeName
	Hub       *monitor.Hub
	Log       *slog.Logger
	Jobs      hive.Jobs
	Lifecycle hive.Lifecycle
	Registry  prometheus.Registerer `optional:"true"`
	Sinks     []Sink                `group:"hubble-sinks"`

	DB         *statedb.DB
	Endpoints  statedb.Table[*endpoints.Endpoint]
	Pods       statedb.Table[*corev1.Pod]
	IPCache    statedb.Table[*ipcache.Entry]
	Nodes      statedb.Table[*nodes.Node]
	Identities statedb.Table[*ciliumv2.CiliumIdentity]
	Policies   statedb.Table[*policy.EndpointPolicyRow]
	Frontends  statedb.Table[*lb.Frontend] `optional:"true"`
	K8sNodes   statedb.Table[*corev1.Node] `optional:"true"`
}

func register(p params) error {
	if !p.Config.EnableHubble {
		return nil
	}
	m, err := newMetrics(p.Registry)
	if err != nil {
		return err
	}
	src := NewSources(Tables{DB: p.DB, Endpoints: p.Endpoints, Pods: p.Pods, IPCache: p.IPCache, Nodes: p.Nodes,
		Identities: p.Identities, Frontends: p.Frontends, Policies: p.Policies, K8sNodes: p.K8sNodes})
	prod := newProducer(p.Hub, parser.New(string(p.NodeName), src), p.Sinks, p.Config.queueSize(), p.Config.HubbleLostEventSendInterval, m, p.Log)
	// Subscribe when the hive starts, before the job's goroutine runs, so
	// that no event published after start is missed.
	p.Lifecycle.Append(hive.Hook{Name: "hubble-subscribe",
		OnStart: func(context.Context) error {
			prod.Subscribe()
			return nil
		},
		// After the job stopped (hooks stop in reverse order); closing
		// twice is harmless.
		OnStop: func(context.Context) error {
			prod.sub.Close()
			return nil
		}})
	p.Jobs.Add(hive.OneShot("hubble-flows", prod.Run))
	return nil
}
