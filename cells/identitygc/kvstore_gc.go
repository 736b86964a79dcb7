package identitygc

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"k8s.io/client-go/util/flowcontrol"

	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/cells/kvstore"
	"github.com/cellium/cellium/statedb/identity"
)

// KVStoreGC deletes identity master keys (cilium/state/identities/v1/id/)
// no node uses in --identity-allocation-mode=kvstore. A node uses an
// identity while its value key (value/<labels>/<node IP>, leased) exists.
// A master key is deleted only if it was found unused, unchanged, in two
// consecutive passes (Cilium's rule), and the deletion is a transaction
// that fails if the key changed or a value key appeared meanwhile.
type KVStoreGC struct {
	cfg      Config
	cli      *clientv3.Client
	log      *slog.Logger
	health   hive.Health
	limiter  flowcontrol.RateLimiter
	min, max identity.NumericIdentity
	// stale are the master keys found unused in the last pass, with
	// their mod revision.
	stale map[string]int64
}

// NewKVStoreGC returns a collector of the identities of the cluster's
// range in etcd.
func NewKVStoreGC(cfg Config, cli *clientv3.Client, log *slog.Logger, health hive.Health) *KVStoreGC {
	limit := min(max(cfg.IdentityGCRateLimit, 1), 1<<30)
	layout, _ := identity.NewLayout(0, identity.DefaultMaxConnectedClusters)
	return &KVStoreGC{
		cfg: cfg, cli: cli, log: log, health: health,
		limiter: flowcontrol.NewTokenBucketRateLimiter(float32(float64(limit)/cfg.IdentityGCRateInterval.Seconds()), int(limit)),
		min:     layout.MinAllocation(), max: layout.MaxAllocation(),
		stale: map[string]int64{},
	}
}

// Run runs a pass at once and then every --identity-gc-interval until ctx
// ends. Failed passes are logged and retried at the next interval.
func (g *KVStoreGC) Run(ctx context.Context) error {
	defer g.health.Stopped("not leading")
	t := time.NewTicker(g.cfg.IdentityGCInterval)
	defer t.Stop()
	for {
		deleted, err := g.Pass(ctx)
		switch {
		case ctx.Err() != nil:
			return nil
		case err != nil:
			g.log.Warn("kvstore identity GC pass failed", "error", err)
			g.health.Degraded("pass", err)
		default:
			g.health.OK(fmt.Sprintf("last pass deleted %d, %d unused identities pending", deleted, len(g.stale)))
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// Pass runs one pass and returns how many master keys it deleted.
func (g *KVStoreGC) Pass(ctx context.Context) (int, error) {
	ids, err := g.cli.Get(ctx, kvstore.IdentityIDPrefix, clientv3.WithPrefix())
	if err != nil {
		return 0, fmt.Errorf("list %s: %w", kvstore.IdentityIDPrefix, err)
	}
	vals, err := g.cli.Get(ctx, kvstore.IdentityValuePrefix, clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		return 0, fmt.Errorf("list %s: %w", kvstore.IdentityValuePrefix, err)
	}
	used := map[string]bool{} // labels keys with a value key
	for _, kv := range vals.Kvs {
		rest := strings.TrimPrefix(string(kv.Key), kvstore.IdentityValuePrefix)
		if i := strings.LastIndexByte(rest, '/'); i > 0 {
			used[rest[:i]] = true
		}
	}
	stale := map[string]int64{}
	deleted := 0
	for _, kv := range ids.Kvs {
		key := string(kv.Key)
		id, ok := kvstore.ParseIdentityIDKey(key)
		if !ok {
			g.log.Warn("Skipping kvstore identity key with an invalid number", "key", key)
			continue
		}
		if id < g.min || id > g.max || used[string(kv.Value)] {
			continue
		}
		if rev, ok := g.stale[key]; !ok || rev != kv.ModRevision {
			stale[key] = kv.ModRevision // first pass unused: next time
			continue
		}
		if err := g.limiter.Wait(ctx); err != nil {
			return deleted, fmt.Errorf("wait for the deletion rate limit (--%s): %w", FlagRateLimit, err)
		}
		resp, err := g.cli.Txn(ctx).If(
			clientv3.Compare(clientv3.ModRevision(key), "=", kv.ModRevision),
			clientv3.Compare(clientv3.CreateRevision(kvstore.IdentityValueKeysOf(string(kv.Value))), "=", 0).WithPrefix(),
		).Then(clientv3.OpDelete(key)).Commit()
		if err != nil {
			return deleted, fmt.Errorf("delete %s: %w", key, err)
		}
		if resp.Succeeded {
			deleted++
			g.log.Info("Deleted unused kvstore identity", "identity", id, "labels", string(kv.Value))
		}
	}
	g.stale = stale
	return deleted, nil
}
