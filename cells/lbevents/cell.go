package lbevents

import (
	"context"
	"log/slog"

	"github.com/cilium/statedb"
	corev1 "k8s.io/api/core/v1"

	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/cells/k8s"
	"github.com/cellium/cellium/statedb/lb"
)

// Cell writes the Events about refused and degraded Services; it runs
// when the agent has the lb-service-states table (the socket load
// balancer, daemon/socklb) and a Kubernetes client.
var Cell = hive.Module("lb-events", "Warning Events on Services the load balancer refuses or serves degraded",
	hive.Invoke(register),
)

type params struct {
	hive.In
	DB *statedb.DB
	// States is provided by the socket load balancer (daemon/socklb).
	States    statedb.Table[*lb.ServiceState] `optional:"true"`
	Services  statedb.Table[*corev1.Service]  `optional:"true"`
	Pods      statedb.Table[*corev1.Pod]      `optional:"true"`
	Clientset k8s.Clientset                   `optional:"true"`
	NodeName  k8s.NodeName                    `optional:"true"`
	Jobs      hive.Jobs
	Log       *slog.Logger
}

func register(p params) {
	if p.States == nil || p.Clientset == nil {
		return
	}
	e := New(Config{DB: p.DB, States: p.States, Services: p.Services, Pods: p.Pods, Core: p.Clientset,
		NodeName: string(p.NodeName), Log: p.Log})
	p.Jobs.Add(hive.Service("lb-service-events", nil, func(ctx context.Context, h hive.Health) { e.Run(ctx, h) }))
}
