package cesbatcher

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/cilium/statedb"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/rest"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	"github.com/cellium/cellium/api/cilium.io/v2alpha1"
	ciliumclient "github.com/cellium/cellium/api/client/clientset/versioned/typed/cilium.io/v2alpha1"
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
	Lifecycle hive.Lifecycle
	// Registerer, when metrics are on, gets the write rate's gauges.
	Registerer prometheus.Registerer `optional:"true"`
}

func newLeaderJob(p leaderJobParams) (leaderelection.LeaderJobsOut, error) {
	if !p.Clientset.IsEnabled() {
		p.Log.Info("CiliumEndpointSlice batcher disabled", "reason", k8s.ErrNotConfigured)
		return leaderelection.LeaderJobsOut{}, nil
	}
	client, err := writeClient(p.Clientset, p.Lifecycle)
	if err != nil {
		return leaderelection.LeaderJobsOut{}, err
	}
	s, err := NewSyncer(p.Config, Tables{DB: p.DB, CEPs: p.CEPs, Slices: p.Slices, Nodes: p.Nodes},
		client, p.Log, p.Health.Scope("batch"))
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

// The batcher's own client's rate limit: Cilium's operator client's
// defaults (--operator-k8s-client-qps, --operator-k8s-client-burst), far
// above the largest --ces-rate-limits step (MaxWriteQPS), so that the
// write limiter, not the client, paces the slice writes.
const (
	writeClientQPS   = 100
	writeClientBurst = 200
)

// writeClient is the client the batcher writes slices with: one of its
// own, as Cilium's CiliumEndpointSlice controller has. The operator's
// shared client is paced at --k8s-client-qps (10 a second by default)
// for everything the operator does, which would hold the slice writes
// below the rate --ces-rate-limits allows (up to 50 a second). A
// clientset without a server (tests' fakes) is used as it is.
func writeClient(cs k8s.Clientset, lc hive.Lifecycle) (ciliumclient.CiliumEndpointSlicesGetter, error) {
	rc := cs.RESTConfig()
	if rc == nil || rc.Host == "" {
		return cs.Cilium().CiliumV2alpha1(), nil
	}
	rc = rest.CopyConfig(rc)
	rc.QPS, rc.Burst, rc.RateLimiter = writeClientQPS, writeClientBurst, nil
	own, err := k8s.NewClientsetFromConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("CiliumEndpointSlice batcher's client: %w", err)
	}
	// Its connections end with the hive (the shared client's do too).
	lc.Append(hive.Hook{Name: "ces-batcher-client-close-idle", OnStop: func(context.Context) error {
		k8s.CloseIdleConnections(own)
		return nil
	}})
	return own.Cilium().CiliumV2alpha1(), nil
}
