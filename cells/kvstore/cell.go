package kvstore

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/cellium/cellium/cells/hive"
)

// Cell provides *Client: nil without --kvstore, else the etcd client
// (connected at start) and its session lease (kept alive by a job).
var Cell = hive.Module("kvstore", "etcd kvstore client and session lease",
	// --kvstore, --kvstore-opt, --kvstore-lease-ttl (Cilium's names and defaults).
	hive.Config(DefaultConfig),
	// The client; identities, nodes and ipcache entries use it in kvstore mode.
	hive.Provide(newClient),
)

// clientParams are newClient's inputs.
type clientParams struct {
	hive.In

	Config    Config
	Log       *slog.Logger
	Lifecycle hive.Lifecycle
	Jobs      hive.Jobs
	// Registerer takes cellium_kvstore_quorum_errors_total (none in
	// tests that do not provide one).
	Registerer prometheus.Registerer `optional:"true"`
}

// newClient reads the etcd configuration (a broken etcd.config stops the
// agent at start) and registers the start/stop hooks and the session
// job. nil without --kvstore.
func newClient(p clientParams) (*Client, error) {
	if !p.Config.Enabled() {
		return nil, nil
	}
	cfg, err := EtcdConfig(p.Config.KVStoreOpt)
	if err != nil {
		return nil, err
	}
	c := NewClient(p.Log, cfg, p.Config.KVStoreLeaseTTL)
	c.configFile = p.Config.KVStoreOpt[OptConfig]
	p.Lifecycle.Append(hive.Hook{
		OnStart: func(context.Context) error { return c.Start() },
		OnStop:  func(context.Context) error { return c.Close() },
	})
	p.Jobs.Add(hive.Service("kvstore-session", nil, c.RunSession))
	quorumErrors := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "cellium_kvstore_quorum_errors_total",
		Help: "Number of quorum errors (Cilium's cilium_kvstore_quorum_errors_total); error=\"" + QuorumErrorNoHeartbeat + "\" counts checks that found no heartbeat within " + HeartbeatTimeout.String(),
	}, []string{"error"})
	if p.Registerer != nil {
		if err := p.Registerer.Register(quorumErrors); err != nil {
			return nil, fmt.Errorf("register kvstore metrics: %w", err)
		}
	}
	noHeartbeat := quorumErrors.WithLabelValues(QuorumErrorNoHeartbeat)
	// The operator's heartbeat (cilium/.heartbeat): stale after two
	// missed writes, shown in the module's health.
	p.Jobs.Add(hive.Service("kvstore-heartbeat", nil, func(ctx context.Context, h hive.Health) {
		c.WatchHeartbeat(ctx, h, HeartbeatTimeout, noHeartbeat.Inc)
	}))
	return c, nil
}
