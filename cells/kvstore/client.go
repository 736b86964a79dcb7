package kvstore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	clientyaml "go.etcd.io/etcd/client/v3/yaml"
	"go.uber.org/zap"

	"github.com/cellium/cellium/cells/hive"
)

// ErrNoSession is returned while the agent holds no lease: etcd has been
// unreachable for longer than the lease TTL, or the first lease is not
// granted yet. Writes of leased keys are retried once a new lease exists.
var ErrNoSession = errors.New("no kvstore session lease (is etcd reachable?)")

// EtcdConfig builds the etcd client configuration from the options: the
// etcd.config file (Cilium's format, read by etcd's own clientv3 yaml
// package) or the etcd.address list.
func EtcdConfig(opts map[string]string) (clientv3.Config, error) {
	var cfg clientv3.Config
	if path := opts[OptConfig]; path != "" {
		c, err := clientyaml.NewConfig(path)
		if err != nil {
			return cfg, fmt.Errorf("read --kvstore-opt %s=%s: %w", OptConfig, path, err)
		}
		cfg = *c
		if cfg.TLS != nil {
			reload, err := clientCertificateReloader(path)
			if err != nil {
				return cfg, fmt.Errorf("read --kvstore-opt %s=%s: %w", OptConfig, path, err)
			}
			cfg.TLS.GetClientCertificate = reload
		}
	}
	if addr := opts[OptAddress]; addr != "" {
		cfg.Endpoints = nil
		for a := range strings.SplitSeq(addr, ",") {
			if a = strings.TrimSpace(a); a != "" {
				cfg.Endpoints = append(cfg.Endpoints, a)
			}
		}
	}
	if len(cfg.Endpoints) == 0 {
		return cfg, fmt.Errorf("no etcd endpoints: list them under \"endpoints:\" in the %s file or pass %s", OptConfig, OptAddress)
	}
	tls := false
	for _, ep := range cfg.Endpoints {
		if strings.HasPrefix(ep, "https://") {
			tls = true
		}
	}
	if !tls {
		// Plain http endpoints: a TLS config the yaml reader always sets
		// would make the client dial TLS.
		cfg.TLS = nil
	}
	if cfg.DialTimeout == 0 {
		cfg.DialTimeout = 15 * time.Second
	}
	// Cilium's keepalive: heartbeat 15 s, timeout 25 s.
	cfg.DialKeepAliveTime = 15 * time.Second
	cfg.DialKeepAliveTimeout = 25 * time.Second
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	return cfg, nil
}

// Client is the agent's etcd connection and its session lease. Every key
// the agent owns (identity value keys, its node, its ipcache entries) is
// written with the current lease; when the lease is lost (etcd was
// unreachable for longer than its TTL) the client grants a new one and
// tells the owners to write their keys again (Session's channel).
type Client struct {
	log        *slog.Logger
	cfg        clientv3.Config
	ttl        time.Duration
	configFile string // the etcd.config file, for error messages

	etcd *clientv3.Client // set by Start

	mu      sync.Mutex
	lease   clientv3.LeaseID // 0 while none
	changed chan struct{}    // closed when lease changes
}

// NewClient returns a client for cfg whose leases live ttl. It connects
// nothing: Start does.
func NewClient(log *slog.Logger, cfg clientv3.Config, ttl time.Duration) *Client {
	return &Client{log: log, cfg: cfg, ttl: ttl, changed: make(chan struct{})}
}

// Start creates the etcd client (the connection is made in the
// background; calls block until it is up or their context ends).
func (c *Client) Start() error {
	cli, err := clientv3.New(c.cfg)
	if err != nil {
		return fmt.Errorf("etcd client for %v: %w", c.cfg.Endpoints, err)
	}
	c.etcd = cli
	return nil
}

// Close closes the etcd client. The lease is not revoked: a restarting
// agent's keys stay until it writes them again with its new lease (or
// its old lease expires), so other nodes keep its identities and ipcache
// entries meanwhile.
func (c *Client) Close() error {
	if c.etcd == nil {
		return nil
	}
	return c.etcd.Close()
}

// Etcd is the etcd client; valid after Start.
func (c *Client) Etcd() *clientv3.Client { return c.etcd }

// LeaseTTL is the TTL of the session leases.
func (c *Client) LeaseTTL() time.Duration { return c.ttl }

// Session returns the current lease (0 while there is none) and a channel
// that is closed when it changes.
func (c *Client) Session() (clientv3.LeaseID, <-chan struct{}) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lease, c.changed
}

// WaitSession waits for a lease.
func (c *Client) WaitSession(ctx context.Context) (clientv3.LeaseID, error) {
	for {
		id, ch := c.Session()
		if id != 0 {
			return id, nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return 0, fmt.Errorf("%w: %w", ErrNoSession, ctx.Err())
		}
	}
}

func (c *Client) setLease(id clientv3.LeaseID) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.lease == id {
		return
	}
	c.lease = id
	close(c.changed)
	c.changed = make(chan struct{})
}

// RunSession keeps a lease alive until ctx ends: it grants one, keeps it
// alive, and when the keep-alive ends (the lease expired because etcd was
// unreachable for a TTL, or was revoked) grants a new one.
func (c *Client) RunSession(ctx context.Context, h hive.Health) {
	ttl := max(int64(c.ttl/time.Second), 1)
	backoff := 100 * time.Millisecond
	for ctx.Err() == nil {
		gctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		resp, err := c.etcd.Grant(gctx, ttl)
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			err = c.explainTLS(ctx, err)
			h.Degraded("grant lease", err)
			c.log.Warn("Cannot grant kvstore lease; retrying", "endpoints", c.cfg.Endpoints, "error", err)
			select {
			case <-ctx.Done():
				return
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, 10*time.Second)
			continue
		}
		backoff = 100 * time.Millisecond
		kctx, kcancel := context.WithCancel(ctx)
		ka, err := c.etcd.KeepAlive(kctx, resp.ID)
		if err != nil {
			kcancel()
			h.Degraded("keep lease alive", err)
			continue
		}
		c.setLease(resp.ID)
		c.log.Info("kvstore session lease granted", "lease", fmt.Sprintf("%x", int64(resp.ID)), "ttl", c.ttl)
		h.OK(fmt.Sprintf("lease %x, ttl %s", int64(resp.ID), c.ttl))
		for range ka {
		}
		kcancel()
		if ctx.Err() != nil {
			return
		}
		c.setLease(0)
		c.log.Warn("kvstore session lease lost (etcd unreachable for longer than its TTL?); granting a new one and writing this agent's keys again",
			"lease", fmt.Sprintf("%x", int64(resp.ID)))
		h.Degraded("lease lost", ErrNoSession)
	}
}
