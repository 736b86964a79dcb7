package identitygc

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/cilium/statedb"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/cells/k8s"
	"github.com/cellium/cellium/cells/kvstore"
	"github.com/cellium/cellium/cells/leaderelection"
)

// Cell is the operator's CiliumIdentity garbage collector.
var Cell = hive.Module("k8s-identities-gc", "Deletes CiliumIdentities no endpoint uses",
	// --identity-gc-interval, --identity-heartbeat-timeout and the rate limit (Cilium's names and defaults).
	hive.Config(DefaultConfig),
	// The collector runs only on the leader: its heartbeats are in memory and one replica must own them.
	hive.Provide(newLeaderJob),
)

// leaderJobParams are newLeaderJob's inputs.
type leaderJobParams struct {
	hive.In

	Config     Config
	Clientset  k8s.Clientset
	DB         *statedb.DB
	Identities statedb.Table[*ciliumv2.CiliumIdentity]
	Endpoints  statedb.Table[*ciliumv2.CiliumEndpoint]
	Log        *slog.Logger
	Health     hive.Health
	// KVStore is the etcd client (nil without --kvstore).
	KVStore *kvstore.Client `optional:"true"`
}

// newLeaderJob makes the collector and contributes it as a leader job.
func newLeaderJob(p leaderJobParams) (leaderelection.LeaderJobsOut, error) {
	var out leaderelection.LeaderJobsOut
	mode := p.Config.IdentityAllocationMode
	// The double-write modes collect both backends, as Cilium does.
	if mode != modeCRD {
		if p.KVStore == nil {
			return leaderelection.LeaderJobsOut{}, fmt.Errorf("--identity-allocation-mode=%s needs --kvstore=etcd and --kvstore-opt etcd.config=<file>", mode)
		}
		scope := "gc"
		if mode != modeKVStore {
			scope = "kvstore-gc" // beside the CRD collector's "gc"
		}
		gc := &kvGCJob{cfg: p.Config, kv: p.KVStore, log: p.Log, health: p.Health.Scope(scope)}
		// Cilium's controller name.
		out.Jobs = append(out.Jobs, leaderelection.LeaderJob{Name: "kvstore-identity-gc", Run: gc.run})
	}
	if mode == modeKVStore {
		return out, nil
	}
	if !p.Clientset.IsEnabled() {
		p.Log.Info("identity GC disabled", "reason", k8s.ErrNotConfigured)
		return out, nil
	}
	gc := NewGC(p.Config, p.Clientset.Cilium().CiliumV2().CiliumIdentities(),
		Tables{DB: p.DB, Identities: p.Identities, Endpoints: p.Endpoints},
		p.Log, p.Health.Scope("gc"))
	// Cilium's controller name, so logs read the same.
	out.Jobs = append(out.Jobs, leaderelection.LeaderJob{Name: "crd-identity-gc", Run: gc.Run})
	return out, nil
}

// kvGCJob builds the kvstore collector when leading (the etcd client is
// started by then); its two-pass memory starts empty on each new term.
type kvGCJob struct {
	cfg    Config
	kv     *kvstore.Client
	log    *slog.Logger
	health hive.Health
}

func (j *kvGCJob) run(ctx context.Context) error {
	return NewKVStoreGC(j.cfg, j.kv.Etcd(), j.log, j.health).Run(ctx)
}
