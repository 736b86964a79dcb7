// Package heartbeat is the kvstore heartbeat (Cilium's
// pkg/kvstore/heartbeat and its etcd client's heartbeat watch): the
// operator's leader writes the current time to cilium/.heartbeat every
// minute, with its session lease (Cell), and agents watch the key
// (WatcherCell, kvstore.Client.WatchHeartbeat) and report their kvstore
// session stale when no write arrives for two minutes.
package heartbeat

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/cells/kvstore"
	"github.com/cellium/cellium/cells/leaderelection"
)

// Cell contributes the heartbeat writer as a leader job of the operator
// (nothing without --kvstore).
var Cell = hive.Module("kvstore-heartbeat-updater", "KVStore Heartbeat Updater",
	hive.Provide(newLeaderJob),
)

// WatcherCell watches the heartbeat in the agent (nothing without
// --kvstore): its health message (module kvstore-heartbeat, in `cellium
// status --verbose`) starts with "stale:" while the heartbeat is stale,
// at level OK as in Cilium, and each check that finds it so counts in cellium_kvstore_quorum_errors_total{error="no event
// received"}.
var WatcherCell = hive.Module("kvstore-heartbeat", "KVStore heartbeat watcher",
	hive.Invoke(registerWatcher),
)

type watcherParams struct {
	hive.In

	KVStore    *kvstore.Client `optional:"true"`
	Jobs       hive.Jobs
	Registerer prometheus.Registerer `optional:"true"`
}

func registerWatcher(p watcherParams) error {
	if p.KVStore == nil {
		return nil
	}
	quorumErrors := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "cellium_kvstore_quorum_errors_total",
		Help: "Number of quorum errors (Cilium's cilium_kvstore_quorum_errors_total); error=\"" + kvstore.QuorumErrorNoHeartbeat +
			"\" counts the checks that found no heartbeat within " + kvstore.HeartbeatTimeout.String(),
	}, []string{"error"})
	if p.Registerer != nil {
		if err := p.Registerer.Register(quorumErrors); err != nil {
			return fmt.Errorf("register kvstore heartbeat metrics: %w", err)
		}
	}
	noHeartbeat := quorumErrors.WithLabelValues(kvstore.QuorumErrorNoHeartbeat)
	p.Jobs.Add(hive.Service("kvstore-heartbeat", nil, func(ctx context.Context, h hive.Health) {
		p.KVStore.WatchHeartbeat(ctx, h, kvstore.HeartbeatTimeout, noHeartbeat.Inc)
	}))
	return nil
}

// writeTimeout bounds one write (Cilium's lock lease TTL, 25 s).
const writeTimeout = 25 * time.Second

type params struct {
	hive.In

	KVStore *kvstore.Client `optional:"true"`
	Log     *slog.Logger
	Health  hive.Health
}

func newLeaderJob(p params) leaderelection.LeaderJobsOut {
	if p.KVStore == nil {
		return leaderelection.LeaderJobsOut{}
	}
	w := &Writer{KV: p.KVStore, Interval: kvstore.HeartbeatWriteInterval, Log: p.Log, Health: p.Health}
	return leaderelection.LeaderJobsOut{Jobs: []leaderelection.LeaderJob{{Name: "kvstore-heartbeat", Run: w.Run}}}
}

// Writer writes kvstore.HeartbeatPath every Interval.
type Writer struct {
	KV       *kvstore.Client
	Interval time.Duration
	Log      *slog.Logger
	Health   hive.Health
}

// Run writes the heartbeat at once and then every Interval until ctx
// ends. A failed write is logged and reported on Health; the next tick
// tries again.
func (w *Writer) Run(ctx context.Context) error {
	t := time.NewTicker(w.Interval)
	defer t.Stop()
	for {
		if err := w.Write(ctx); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			w.Log.Warn("Unable to update heartbeat key", "key", kvstore.HeartbeatPath, "error", err)
			w.Health.Degraded("write heartbeat", err)
		} else {
			w.Health.OK(fmt.Sprintf("%s written every %s", kvstore.HeartbeatPath, w.Interval))
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// Write puts the current time (RFC 3339, as Cilium) to the heartbeat key
// with the client's session lease.
func (w *Writer) Write(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, writeTimeout)
	defer cancel()
	lease, err := w.KV.WaitSession(ctx)
	if err != nil {
		return fmt.Errorf("update heartbeat key %s: %w", kvstore.HeartbeatPath, err)
	}
	if _, err := w.KV.Etcd().Put(ctx, kvstore.HeartbeatPath, time.Now().Format(time.RFC3339), clientv3.WithLease(lease)); err != nil {
		return fmt.Errorf("update heartbeat key %s: %w", kvstore.HeartbeatPath, err)
	}
	return nil
}
