// Package benchkpr is the cluster-level benchmark of the kube-proxy
// replacement (make bench-kpr): the same two-node real cluster
// (test/realnode) once with kube-proxy in nftables mode and cellium's socket
// load balancer off, once with --kube-proxy-replacement=true and no
// kube-proxy, measured the same way: per-packet cost (TCP throughput with
// iperf3 and 1-byte request/response on one connection) pod -> pod without
// a Service, pod -> ClusterIP -> pod on the other node and a client outside
// the nodes -> NodePort -> pod; connect latency and the time a Service
// change (a backend added or removed) takes to apply on every node with 1,
// 1,000 and 10,000 Services of 10 backends present; the agent's (and
// kube-proxy's) memory and the load balancer maps' size.
//
// It prints figures; it asserts nothing timed.
package benchkpr

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"time"

	"github.com/cellium/cellium/test/realnode"
)

// Modes of a run.
const (
	// ModeKubeProxy is kube-proxy (nftables mode) serving every Service,
	// cellium's socket load balancer off (agent.socketLB.enabled=false),
	// as Cilium without kube-proxy replacement.
	ModeKubeProxy = "kube-proxy"
	// ModeKPR is cellium's kube-proxy replacement, no kube-proxy.
	ModeKPR = "kpr"
)

// Config is a run of the benchmark.
type Config struct {
	// Modes run one after the other, each on a cluster of its own of the
	// same shape; default both, kube-proxy first.
	Modes []string
	// Sizes are the numbers of Services present when connect latency and
	// Service changes are measured, ascending; default 1, 1000, 10000.
	Sizes []int
	// BackendsPerService are the (unreachable, never contacted) backends
	// of each of those Services; default 10.
	BackendsPerService int
	// Changes are the Service changes timed at each size; default 30.
	Changes int
	// Connects are the connects timed at each size; default 2000.
	Connects int
	// RoundTrips are the request/response round trips of a measurement;
	// default 10000.
	RoundTrips int
	// IperfSeconds is the length of a throughput measurement; default 3.
	IperfSeconds int
	// Rounds is how often each per-packet path is measured (medians are
	// reported); default 3.
	Rounds int
	// LBMapMax is --bpf-lb-map-max with the replacement (Helm
	// bpf.lbMapMax); default 262144, room for 10,000 Services x 10.
	LBMapMax int
	// BinDir is make build's bin/ (cellium's image is packed from it).
	BinDir string
	// Self is this benchmark's binary, started as the probes ("probe"
	// subcommand); default os.Executable.
	Self string
	// Logger receives progress; nil discards it.
	Logger *slog.Logger
}

func (c *Config) defaults() error {
	if len(c.Modes) == 0 {
		c.Modes = []string{ModeKubeProxy, ModeKPR}
	}
	for _, m := range c.Modes {
		if m != ModeKubeProxy && m != ModeKPR {
			return fmt.Errorf("mode %q: want %s or %s", m, ModeKubeProxy, ModeKPR)
		}
	}
	if len(c.Sizes) == 0 {
		c.Sizes = []int{1, 1000, 10000}
	}
	if !slices.IsSorted(c.Sizes) || c.Sizes[0] < 1 {
		return fmt.Errorf("sizes %v: want ascending numbers of Services, at least 1", c.Sizes)
	}
	set := func(v *int, def int) {
		if *v <= 0 {
			*v = def
		}
	}
	set(&c.BackendsPerService, 10)
	set(&c.Changes, 30)
	set(&c.Connects, 2000)
	set(&c.RoundTrips, 10000)
	set(&c.IperfSeconds, 3)
	set(&c.Rounds, 3)
	set(&c.LBMapMax, 262144)
	if need := c.Sizes[len(c.Sizes)-1] * (c.BackendsPerService + 1); need+1000 > c.LBMapMax {
		return fmt.Errorf("%d Services x %d backends need about %d load balancer map entries: raise the map size (%d)",
			c.Sizes[len(c.Sizes)-1], c.BackendsPerService, need, c.LBMapMax)
	}
	if c.Self == "" {
		self, err := os.Executable()
		if err != nil {
			return fmt.Errorf("the probes' binary: %w", err)
		}
		c.Self = self
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return nil
}

// Run runs every mode of cfg and writes the report to w.
func Run(ctx context.Context, cfg Config, w io.Writer) (Result, error) {
	if err := cfg.defaults(); err != nil {
		return Result{}, err
	}
	res := Result{Config: cfg, Started: time.Now()}
	for _, mode := range cfg.Modes {
		m, err := runMode(ctx, cfg, mode)
		if err != nil {
			return res, fmt.Errorf("%s: %w", mode, err)
		}
		res.Modes = append(res.Modes, m)
	}
	res.Took = time.Since(res.Started)
	res.Write(w)
	return res, nil
}

// runMode brings a cluster up in mode, measures it and takes it down.
func runMode(ctx context.Context, cfg Config, mode string) (m ModeResult, err error) {
	log := cfg.Logger.With("mode", mode)
	dir, err := os.MkdirTemp("", "bkpr-")
	if err != nil {
		return m, err
	}
	opts := realnode.ClusterOptions{Dir: dir, Nodes: 2, BinDir: cfg.BinDir, Logger: log, KubeProxyReplacement: mode == ModeKPR}
	if mode == ModeKubeProxy {
		opts.Values = []string{"agent.socketLB.enabled=false"}
	} else {
		opts.Values = []string{fmt.Sprintf("bpf.lbMapMax=%d", cfg.LBMapMax)}
	}
	began := time.Now()
	c, err := realnode.Up(ctx, opts)
	if err != nil {
		// Up stopped and removed what it started; its files remain.
		return m, errors.Join(err, os.RemoveAll(dir))
	}
	defer func() {
		serr := c.Stop(context.WithoutCancel(ctx))
		if left := c.Leftovers(); len(left) > 0 {
			serr = errors.Join(serr, fmt.Errorf("left on the host: %v", left))
		}
		if serr == nil {
			serr = os.RemoveAll(dir)
		}
		err = errors.Join(err, serr)
	}()
	log.Info("cluster up", "took", time.Since(began).Round(time.Second))
	b, err := newBench(ctx, cfg, c, mode, log)
	if err != nil {
		return m, err
	}
	defer b.close()
	return b.measure(ctx)
}
