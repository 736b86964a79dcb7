package endpointgc

import (
	"log/slog"

	"github.com/cilium/statedb"
	corev1 "k8s.io/api/core/v1"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/cells/k8s"
	"github.com/cellium/cellium/cells/leaderelection"
)

// Cell is the operator's CiliumEndpoint garbage collector.
var Cell = hive.Module("k8s-endpoints-gc", "Deletes CiliumEndpoints of pods that are gone",
	// --cilium-endpoint-gc-interval (Cilium's name and default).
	hive.Config(DefaultConfig),
	// The collector runs only on the leader, so that replicas do not race to delete.
	hive.Provide(newLeaderJob),
)

// leaderJobParams are newLeaderJob's inputs.
type leaderJobParams struct {
	hive.In

	Config    Config
	Clientset k8s.Clientset
	DB        *statedb.DB
	Pods      statedb.Table[*corev1.Pod]
	Endpoints statedb.Table[*ciliumv2.CiliumEndpoint]
	Nodes     statedb.Table[*ciliumv2.CiliumNode]
	Log       *slog.Logger
	Health    hive.Health
}

// newLeaderJob makes the collector and contributes it as a leader job,
// unless the interval is 0.
func newLeaderJob(p leaderJobParams) leaderelection.LeaderJobsOut {
	switch {
	case p.Config.CiliumEndpointGCInterval == 0:
		p.Log.Info("CiliumEndpoint GC disabled (--" + FlagInterval + "=0)")
		return leaderelection.LeaderJobsOut{}
	case !p.Clientset.IsEnabled():
		p.Log.Info("CiliumEndpoint GC disabled", "reason", k8s.ErrNotConfigured)
		return leaderelection.LeaderJobsOut{}
	}
	gc := NewGC(p.Config.CiliumEndpointGCInterval, p.Clientset.Cilium().CiliumV2(),
		Tables{DB: p.DB, Pods: p.Pods, Endpoints: p.Endpoints, Nodes: p.Nodes},
		p.Log, p.Health.Scope("gc"))
	// Cilium's controller name, so logs read the same.
	return leaderelection.LeaderJobsOut{Jobs: []leaderelection.LeaderJob{{Name: "to-k8s-ciliumendpoint-gc", Run: gc.Run}}}
}
