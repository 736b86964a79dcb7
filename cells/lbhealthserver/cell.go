package lbhealthserver

import (
	"context"
	"log/slog"
	"net/netip"

	"github.com/cilium/statedb"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/cells/k8s"
	"github.com/cellium/cellium/statedb/lb"
)

// Cell serves the healthCheckNodePorts (Cilium's
// loadbalancer-healthserver), with --kube-proxy-replacement=true and
// --enable-health-check-nodeport.
var Cell = hive.Module("loadbalancer-healthserver", "Serves healthCheckNodePort of Services with externalTrafficPolicy Local",
	// --enable-health-check-nodeport.
	hive.Config(DefaultConfig),
	// The job following the Services table and keeping the listeners.
	hive.Invoke(register),
)

type params struct {
	hive.In
	Config   Config
	DB       *statedb.DB
	Services statedb.Table[*corev1.Service]
	Slices   statedb.Table[*discoveryv1.EndpointSlice]
	// NodeName says which endpoints are local.
	NodeName k8s.NodeName `optional:"true"`
	// KPR is provided by the socket load balancer (daemon/socklb); absent
	// (no BPF datapath) is off.
	KPR  lb.KubeProxyReplacement `optional:"true"`
	Bind BindAddress             `optional:"true"`
	Jobs hive.Jobs
	Log  *slog.Logger
}

func register(p params) {
	if !p.Config.EnableHealthCheckNodePort || !p.KPR.Enabled {
		return
	}
	s := New(p.DB, p.Services, p.Slices, string(p.NodeName), netip.Addr(p.Bind), p.Log)
	p.Jobs.Add(hive.Service("health-check-nodeport", nil, func(ctx context.Context, h hive.Health) { s.Run(ctx, h) }))
}
