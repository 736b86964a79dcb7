package nodesgc

import (
	"context"
	"log/slog"

	"github.com/cilium/statedb"
	corev1 "k8s.io/api/core/v1"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/cells/k8s"
	"github.com/cellium/cellium/cells/kvstore"
	"github.com/cellium/cellium/cells/leaderelection"
)

// Cell is the operator's collector of stale kvstore node keys (nothing
// without --kvstore, or with --synchronize-k8s-nodes=false).
var Cell = hive.Module("kvstore-nodes-gc", "GC of stale KVStore node entries",
	// --synchronize-k8s-nodes, --cluster-name, --cilium-pod-labels (Cilium's names).
	hive.Config(DefaultConfig),
	// The collector runs only on the leader, so that replicas do not race to delete.
	hive.Provide(newLeaderJob),
)

// leaderJobParams are newLeaderJob's inputs.
type leaderJobParams struct {
	hive.In

	Config      Config
	Clientset   k8s.Clientset
	DB          *statedb.DB
	CiliumNodes statedb.Table[*ciliumv2.CiliumNode]
	Pods        statedb.Table[*corev1.Pod]
	Log         *slog.Logger
	Health      hive.Health
	// KVStore is the etcd client (nil without --kvstore).
	KVStore *kvstore.Client `optional:"true"`
}

// newLeaderJob contributes the collector as a leader job when it is on.
func newLeaderJob(p leaderJobParams) leaderelection.LeaderJobsOut {
	switch {
	case p.KVStore == nil:
		return leaderelection.LeaderJobsOut{}
	case !p.Config.SynchronizeK8sNodes:
		p.Log.Info("kvstore nodes GC disabled (--" + FlagEnable + "=false)")
		return leaderelection.LeaderJobsOut{}
	case !p.Clientset.IsEnabled():
		p.Log.Info("kvstore nodes GC disabled", "reason", k8s.ErrNotConfigured)
		return leaderelection.LeaderJobsOut{}
	}
	j := &job{p: p}
	return leaderelection.LeaderJobsOut{Jobs: []leaderelection.LeaderJob{{Name: "kvstore-nodes-gc", Run: j.run}}}
}

// job builds the collector when leading (the etcd client is started by
// then); its memory of the keys starts empty on each new term.
type job struct{ p leaderJobParams }

func (j *job) run(ctx context.Context) error {
	gc, err := NewGC(j.p.Config, j.p.KVStore.Etcd(),
		Tables{DB: j.p.DB, CiliumNodes: j.p.CiliumNodes, Pods: j.p.Pods},
		j.p.Log, j.p.Health.Scope("gc"))
	if err != nil {
		return err
	}
	return gc.Run(ctx)
}
