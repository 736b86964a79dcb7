package lbipam

import (
	"log/slog"

	"github.com/cilium/statedb"
	corev1 "k8s.io/api/core/v1"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/cells/k8s"
	"github.com/cellium/cellium/cells/leaderelection"
)

// Cell is the operator's LB IPAM: addresses of LoadBalancer Services from
// CiliumLoadBalancerIPPools.
var Cell = hive.Module("lbipam", "LB IPAM, addresses of LoadBalancer Services from CiliumLoadBalancerIPPools",
	// --enable-lb-ipam and --default-lb-service-ipam.
	hive.Config(DefaultConfig),
	// The controller runs only on the leader, so that one allocator owns
	// the addresses.
	hive.Provide(newLeaderJob),
)

// leaderJobParams are newLeaderJob's inputs.
type leaderJobParams struct {
	hive.In

	Config      Config
	Clientset   k8s.Clientset
	DB          *statedb.DB
	Services    statedb.Table[*corev1.Service]
	Pools       statedb.Table[*ciliumv2.CiliumLoadBalancerIPPool]
	CiliumNodes statedb.Table[*ciliumv2.CiliumNode]
	Log         *slog.Logger
	Health      hive.Health
}

// newLeaderJob makes the controller and contributes it as a leader job.
func newLeaderJob(p leaderJobParams) leaderelection.LeaderJobsOut {
	if !p.Config.EnableLBIPAM {
		p.Log.Info("LB IPAM disabled", "flag", "--"+FlagEnableLBIPAM+"=false")
		return leaderelection.LeaderJobsOut{}
	}
	if !p.Clientset.IsEnabled() {
		p.Log.Info("LB IPAM disabled", "reason", k8s.ErrNotConfigured)
		return leaderelection.LeaderJobsOut{}
	}
	c := NewController(p.Config, p.Clientset, p.Clientset.Cilium().CiliumV2().CiliumLoadBalancerIPPools(),
		p.DB, Tables{Services: p.Services, Pools: p.Pools, CiliumNodes: p.CiliumNodes}, p.Log, p.Health.Scope("allocator"))
	return leaderelection.LeaderJobsOut{Jobs: []leaderelection.LeaderJob{{Name: "lbipam", Run: c.Run}}}
}
