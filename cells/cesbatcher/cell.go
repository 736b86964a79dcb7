package cesbatcher

import (
	"log/slog"

	"github.com/cilium/statedb"
	"github.com/prometheus/client_golang/prometheus"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	"github.com/cellium/cellium/api/cilium.io/v2alpha1"
	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/cells/k8s"
	"github.com/cellium/cellium/cells/leaderelection"
	k8stables "github.com/cellium/cellium/statedb/k8s"
)

// Cell is the operator's CiliumEndpointSlice batcher, off unless
// --enable-cilium-endpoint-slice.
var Cell = hive.Module("ces-batcher", "Batches CiliumEndpoints into CiliumEndpointSlices",
	hive.Feature(k8s.FlagEnableCiliumEndpointSlice, false,
		"Batch the CiliumEndpoints into CiliumEndpointSlices, which agents with the same flag watch instead",
		// --ces-max-ciliumendpoints-per-ces, --ces-rate-limits (Cilium's
		// names and defaults), --ces-slice-mode and the deprecated
		// --ces-write-qps-*.
		hive.Config(DefaultConfig),
		// The slices in the cluster: what a new leader adopts.
		k8s.CiliumEndpointSlicesCell,
		// Runs only on the leader, so that replicas do not write the same slices.
		hive.Provide(newLeaderJob),
	),
)

type leaderJobParams struct {
	hive.In

	Config    Config
	Clientset k8s.Clientset
	DB        *statedb.DB
	CEPs      statedb.Table[*ciliumv2.CiliumEndpoint]
	Slices    statedb.Table[*v2alpha1.CiliumEndpointSlice]
	Nodes     statedb.Table[*ciliumv2.CiliumNode]
	Log       *slog.Logger
	Health    hive.Health
	// Registerer, when metrics are on, gets the write rate's gauges.
	Registerer prometheus.Registerer `optional:"true"`
}

func newLeaderJob(p leaderJobParams) (leaderelection.LeaderJobsOut, error) {
	if !p.Clientset.IsEnabled() {
		p.Log.Info("CiliumEndpointSlice batcher disabled", "reason", k8s.ErrNotConfigured)
		return leaderelection.LeaderJobsOut{}, nil
	}
	s, err := NewSyncer(p.Config, Tables{DB: p.DB, CEPs: p.CEPs, Slices: p.Slices, Nodes: p.Nodes},
		p.Clientset.Cilium().CiliumV2alpha1(), p.Log, p.Health.Scope("batch"))
	if err != nil {
		return leaderelection.LeaderJobsOut{}, err
	}
	if err := registerRateMetrics(p.Registerer, s.WriteLimit); err != nil {
		return leaderelection.LeaderJobsOut{}, err
	}
	cur := s.WriteLimit()
	p.Log.Info("CES controller workqueue configuration", "workQueueQPSLimit", cur.Limit, "workQueueBurstLimit", cur.Burst)
	return leaderelection.LeaderJobsOut{Jobs: []leaderelection.LeaderJob{{Name: "ces-batcher", Run: s.Run}}}, nil
}

// sliceName queries the slice table by name.
func sliceName(name string) statedb.Query[*v2alpha1.CiliumEndpointSlice] {
	return k8stables.NameIndex[*v2alpha1.CiliumEndpointSlice]().Query(name)
}
