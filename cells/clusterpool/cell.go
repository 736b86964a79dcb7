package clusterpool

import (
	"log/slog"

	"github.com/cilium/statedb"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/cells/k8s"
	"github.com/cellium/cellium/cells/leaderelection"
)

// Cell is the operator's cluster-pool IPAM: node CIDRs into CiliumNodes.
var Cell = hive.Module("cluster-pool-ipam", "Cluster-pool IPAM, pod CIDRs of CiliumNodes",
	// --cluster-pool-ipv4-cidr and --cluster-pool-ipv4-mask-size, checked at start-up.
	hive.Config(DefaultConfig),
	// The controller runs only on the leader, so that one allocator owns the pool.
	hive.Provide(newLeaderJob),
)

// leaderJobParams are newLeaderJob's inputs.
type leaderJobParams struct {
	hive.In

	Config    Config
	Clientset k8s.Clientset
	DB        *statedb.DB
	Nodes     statedb.Table[*ciliumv2.CiliumNode]
	Log       *slog.Logger
	Health    hive.Health
}

// newLeaderJob makes the controller and contributes it as a leader job.
func newLeaderJob(p leaderJobParams) (leaderelection.LeaderJobsOut, error) {
	if !p.Clientset.IsEnabled() {
		p.Log.Info("cluster-pool IPAM disabled", "reason", k8s.ErrNotConfigured)
		return leaderelection.LeaderJobsOut{}, nil
	}
	c, err := NewController(p.Config.allocConfig(), p.Clientset.Cilium().CiliumV2().CiliumNodes(),
		p.DB, p.Nodes, p.Log, p.Health.Scope("node-cidrs"))
	if err != nil {
		return leaderelection.LeaderJobsOut{}, err
	}
	return leaderelection.LeaderJobsOut{Jobs: []leaderelection.LeaderJob{{Name: "cluster-pool-node-cidrs", Run: c.Run}}}, nil
}
