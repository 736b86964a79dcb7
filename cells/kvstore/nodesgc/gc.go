package nodesgc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/cilium/statedb"
	clientv3 "go.etcd.io/etcd/client/v3"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/cells/kvstore"
	k8stables "github.com/cellium/cellium/statedb/k8s"
	"github.com/cellium/cellium/statedb/tables"
)

// Tables are what the collector decides from; both must be initialized
// (fully listed) before it deletes anything.
type Tables struct {
	DB          *statedb.DB
	CiliumNodes statedb.Table[*ciliumv2.CiliumNode]
	Pods        statedb.Table[*corev1.Pod]
}

// GC deletes the node keys of the cluster's nodes that have no CiliumNode.
// It is the body of the cell's leader job; NewGC makes one without a hive.
type GC struct {
	cli     *clientv3.Client
	cluster string
	agents  labels.Selector
	tables  Tables
	log     *slog.Logger
	health  hive.Health
	// Grace is how long after a key is written it is first checked
	// (DefaultGrace); tests shorten it.
	Grace time.Duration

	prefix  string           // cilium/state/nodes/v1/<cluster>/
	invalid map[string]int64 // keys warned about, at their revision
}

// NewGC returns a collector of cfg.ClusterName's node keys in cli. cfg
// must be valid (Config.Validate).
func NewGC(cfg Config, cli *clientv3.Client, t Tables, log *slog.Logger, health hive.Health) (*GC, error) {
	sel, err := labels.Parse(cfg.CiliumPodLabels)
	if err != nil {
		return nil, fmt.Errorf("invalid --%s=%q: %w", FlagCiliumPodLabels, cfg.CiliumPodLabels, err)
	}
	return &GC{
		cli: cli, cluster: cfg.ClusterName, agents: sel, tables: t, log: log, health: health,
		Grace:   DefaultGrace,
		prefix:  kvstore.NodesPrefix + "/" + cfg.ClusterName + "/",
		invalid: map[string]int64{},
	}, nil
}

// Run waits for the tables, then watches the node keys and deletes the
// stale ones until ctx ends. When the watch fails (etcd unreachable, the
// revision compacted) the keys are listed again after a backoff. It
// returns nil.
func (g *GC) Run(ctx context.Context) error {
	defer g.health.Stopped("not leading")
	g.health.OK("waiting for the CiliumNodes and pods tables")
	if err := tables.WaitInitialized(ctx, g.tables.DB, g.tables.CiliumNodes, g.tables.Pods); err != nil {
		return nil // cancelled
	}
	t := newTracker(g.Grace)
	backoff := minRetry
	for {
		started := time.Now()
		err := g.watch(ctx, t)
		if ctx.Err() != nil {
			return nil
		}
		if time.Since(started) > maxRetry {
			backoff = minRetry // it had worked for a while
		}
		g.log.Warn("kvstore nodes GC: watching node keys failed; listing them again", "prefix", g.prefix, "error", err, "retry-in", backoff)
		g.health.Degraded("watch node keys", err)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, maxRetry)
	}
}

// watch lists the keys, then follows their changes and deletes the stale
// ones, until ctx ends or the watch fails.
func (g *GC) watch(ctx context.Context, t *tracker) error {
	lctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	resp, err := g.cli.Get(lctx, g.prefix, clientv3.WithPrefix())
	cancel()
	if err != nil {
		return fmt.Errorf("list %s: %w", g.prefix, err)
	}
	now := time.Now()
	l := g.lookups()
	listed := map[string]bool{}
	for _, kv := range resp.Kvs {
		listed[string(kv.Key)] = true
		g.observe(t, string(kv.Key), kv.Value, kv.ModRevision, l, now)
	}
	// Keys deleted while not watched.
	t.retain(func(k string) bool { return listed[k] })
	maps.DeleteFunc(g.invalid, func(k string, _ int64) bool { return !listed[k] })
	g.health.OK(fmt.Sprintf("watching the node keys of cluster %s (%d)", g.cluster, len(t.keys)))

	wctx, wcancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer wcancel()
	wch := g.cli.Watch(wctx, g.prefix, clientv3.WithPrefix(), clientv3.WithRev(resp.Header.Revision+1))
	timer := time.NewTimer(0)
	defer timer.Stop()
	var cnRev statedb.Revision // of the CiliumNodes table last looked at
	for {
		// The revision and the watch come from one snapshot: no change
		// falls between them.
		txn := g.tables.DB.ReadTxn()
		if rev := g.tables.CiliumNodes.Revision(txn); rev != cnRev {
			t.ciliumNodesChanged(g.lookupsAt(txn), time.Now())
			cnRev = rev
		}
		_, cnWatch := g.tables.CiliumNodes.AllWatch(txn)
		g.collect(ctx, t)
		wait := time.Hour
		if next := t.next(); !next.IsZero() {
			wait = time.Until(next)
		}
		timer.Reset(wait)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-timer.C:
		case <-cnWatch:
		case w, ok := <-wch:
			if !ok {
				return errors.New("watch closed")
			}
			if err := w.Err(); err != nil {
				return fmt.Errorf("watch %s: %w", g.prefix, err)
			}
			now, l := time.Now(), g.lookups()
			for _, ev := range w.Events {
				key := string(ev.Kv.Key)
				if ev.Type == clientv3.EventTypeDelete {
					t.forget(key)
					delete(g.invalid, key)
					continue
				}
				g.observe(t, key, ev.Kv.Value, ev.Kv.ModRevision, l, now)
			}
		}
	}
}

// observe feeds a written key to the tracker if it is a node key of the
// cluster whose value is that node; anything else is left alone, with a
// warning once per revision.
func (g *GC) observe(t *tracker, key string, value []byte, rev int64, l lookups, now time.Time) {
	node, err := g.parse(key, value)
	if err != nil {
		t.forget(key)
		if g.invalid[key] != rev {
			g.invalid[key] = rev
			g.log.Warn("Ignoring invalid kvstore node key; the nodes GC leaves it alone", "key", key, "revision", rev, "error", err)
		}
		return
	}
	delete(g.invalid, key)
	t.put(key, node, rev, l, now)
}

// parse returns the node a key of the cluster's prefix names, if its value
// is Cilium's node JSON of that node and cluster.
func (g *GC) parse(key string, value []byte) (string, error) {
	name := strings.TrimPrefix(key, g.prefix)
	if name == "" || strings.Contains(name, "/") {
		return "", fmt.Errorf("not %s<node>", g.prefix)
	}
	var n kvstore.NodeJSON
	if err := json.Unmarshal(value, &n); err != nil {
		return "", fmt.Errorf("not a node: %w", err)
	}
	if n.Name != name || n.Cluster != g.cluster {
		return "", fmt.Errorf("value is node %q of cluster %q, not the key's", n.Name, n.Cluster)
	}
	return name, nil
}

// collect checks the due keys and deletes the stale ones.
func (g *GC) collect(ctx context.Context, t *tracker) {
	now := time.Now()
	due := t.dueKeys(now)
	if len(due) == 0 {
		return
	}
	slices.Sort(due)
	l := g.lookups()
	for _, key := range due {
		c := t.keys[key]
		switch t.check(key, l, now) {
		case agentRunning:
			g.log.Info("Delaying deletion of stale kvstore node key: an agent pod still runs on the node", "node", c.node, "key", key, "retry-at", c.due)
		case remove:
			deleted, err := g.delete(ctx, key, c.rev)
			switch {
			case err != nil:
				t.failed(key, now)
				g.log.Warn("Deleting stale kvstore node key failed; retrying", "node", c.node, "key", key, "error", err, "retry-at", c.due)
				g.health.Degraded("delete node key", err)
			case deleted:
				t.forget(key)
				g.log.Info("Deleted stale node key from kvstore: the node has no CiliumNode", "node", c.node, "key", key)
				g.health.OK(fmt.Sprintf("deleted the node key of %s", c.node))
			default:
				// Rewritten (or deleted) since: the watch brings it.
				t.forget(key)
			}
		}
	}
}

// delete deletes key if it is still at rev.
func (g *GC) delete(ctx context.Context, key string, rev int64) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	resp, err := g.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.ModRevision(key), "=", rev)).
		Then(clientv3.OpDelete(key)).Commit()
	if err != nil {
		return false, fmt.Errorf("delete %s: %w", key, err)
	}
	return resp.Succeeded, nil
}

// lookups reads the tables at the current revision.
func (g *GC) lookups() lookups { return g.lookupsAt(g.tables.DB.ReadTxn()) }

// lookupsAt reads the tables at txn.
func (g *GC) lookupsAt(txn statedb.ReadTxn) lookups {
	return tableLookups{txn: txn, tables: g.tables, agents: g.agents}
}

type tableLookups struct {
	txn    statedb.ReadTxn
	tables Tables
	agents labels.Selector
}

func (l tableLookups) ciliumNodeExists(name string) bool {
	_, _, ok := l.tables.CiliumNodes.Get(l.txn, k8stables.NameIndex[*ciliumv2.CiliumNode]().Query(name))
	return ok
}

func (l tableLookups) agentRunning(node string) bool {
	for p := range l.tables.Pods.List(l.txn, k8stables.PodNodeIndex.Query(node)) {
		if podRunning(p) && l.agents.Matches(labels.Set(p.Labels)) {
			return true
		}
	}
	return false
}

// podRunning is Cilium's: every phase but Succeeded and Failed.
func podRunning(p *corev1.Pod) bool {
	return p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed
}
