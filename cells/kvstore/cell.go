package kvstore

import (
	"context"
	"log/slog"

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
	return c, nil
}
