package healthcheck

import (
	"context"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"sync"
	"time"

	"github.com/cilium/statedb"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/cells/identity"
	"github.com/cellium/cellium/cells/k8s"
	"github.com/cellium/cellium/statedb/health"
	"github.com/cellium/cellium/statedb/nodes"
)

// nodeParams are registerNodeProber's inputs.
type nodeParams struct {
	hive.In
	Config   Config
	DB       *statedb.DB
	NodeName k8s.NodeName `optional:"true"`
	// Nodes is absent in hives without node discovery: nothing to probe.
	Nodes statedb.Table[*nodes.Node] `optional:"true"`
	Paths statedb.RWTable[*health.NodePath]
	// Identity's config names the cluster (source_cluster).
	Identity   identity.Config       `optional:"true"`
	Registerer prometheus.Registerer `optional:"true"`
	Jobs       hive.Jobs
}

func registerNodeProber(p nodeParams, o Options) error {
	if p.Nodes == nil {
		return nil
	}
	np := NewNodeProber(NodeProberOptions{Interval: p.Config.HealthCheckInterval, Timeout: o.Timeout,
		Port: o.Port, NetnsPath: o.NetnsPath, ICMP: o.NodeICMP, HTTP: o.NodeHTTP}, p.DB, p.Nodes, p.Paths)
	m, err := registerNodeMetrics(p.Registerer, p.Identity.ClusterName, string(p.NodeName), p.DB, p.Paths)
	if err != nil {
		return err
	}
	np.metrics = m
	p.Jobs.Add(hive.Service("probe-nodes", nil, np.Run))
	return nil
}

// ProbeFunc probes ip once and returns the round trip, or why it failed;
// it returns when ctx ends at the latest.
type ProbeFunc func(ctx context.Context, ip netip.Addr) (time.Duration, error)

// NodeProberOptions are what a NodeProber needs besides its tables.
type NodeProberOptions struct {
	// Interval between rounds of probes of every path.
	Interval time.Duration
	// Timeout of one probe.
	Timeout time.Duration
	// ICMP and HTTP probe one address; nil: Ping and an HTTP GET of
	// health.Path on Port.
	ICMP, HTTP ProbeFunc
	// Port is the responder's port for the default HTTP probe
	// (health.Port).
	Port int
	// NetnsPath is the namespace the default probes' sockets are made
	// in; "": the agent's own.
	NetnsPath string
	// Now is the clock (time.Now).
	Now func() time.Time
}

// NodeProber probes every other node of the nodes table, as cilium-health
// does: an ICMP echo to its InternalIP, and an ICMP echo and GET /hello
// to its health endpoint, every Interval (a node that appears at once),
// and keeps the outcome per path in the node-health table. A node that
// leaves takes its rows with it; one with a new boot ID starts afresh.
type NodeProber struct {
	opts    NodeProberOptions
	db      *statedb.DB
	nodes   statedb.Table[*nodes.Node]
	paths   statedb.RWTable[*health.NodePath]
	metrics *nodeMetrics
}

// NewNodeProber returns a prober of the nodes in nodeTable writing paths;
// it starts nothing (Run does).
func NewNodeProber(o NodeProberOptions, db *statedb.DB, nodeTable statedb.Table[*nodes.Node], paths statedb.RWTable[*health.NodePath]) *NodeProber {
	if o.Port == 0 {
		o.Port = health.Port
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Timeout <= 0 || o.Timeout > o.Interval {
		o.Timeout = min(DefaultTimeout, o.Interval)
	}
	p := &NodeProber{opts: o, db: db, nodes: nodeTable, paths: paths}
	if p.opts.ICMP == nil {
		p.opts.ICMP = p.inNetns(Ping)
	}
	if p.opts.HTTP == nil {
		p.opts.HTTP = p.inNetns(p.httpGet)
	}
	return p
}

// inNetns makes f's sockets in the prober's namespace: f runs on a
// thread switched into it (sockets keep the namespace they were made
// in).
func (p *NodeProber) inNetns(f ProbeFunc) ProbeFunc {
	if p.opts.NetnsPath == "" {
		return f
	}
	return func(ctx context.Context, ip netip.Addr) (time.Duration, error) {
		n, err := ns.GetNS(p.opts.NetnsPath)
		if err != nil {
			return 0, err
		}
		defer n.Close()
		var d time.Duration
		err = n.Do(func(ns.NetNS) error {
			var err error
			d, err = f(ctx, ip)
			return err
		})
		return d, err
	}
}

// httpGet does GET http://ip:port/hello.
func (p *NodeProber) httpGet(ctx context.Context, ip netip.Addr) (time.Duration, error) {
	addr := net.JoinHostPort(ip.String(), strconv.Itoa(p.opts.Port))
	start := time.Now()
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return 0, fmt.Errorf("GET %s%s: %w", addr, health.Path, err)
	}
	tr := &http.Transport{DisableKeepAlives: true,
		DialContext: func(context.Context, string, string) (net.Conn, error) { return conn, nil }}
	defer tr.CloseIdleConnections()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+health.Path, nil)
	if err != nil {
		conn.Close()
		return 0, err
	}
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		return 0, fmt.Errorf("GET %s%s: %w", addr, health.Path, err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("GET %s%s: %s", addr, health.Path, resp.Status)
	}
	return time.Since(start), nil
}

// desired returns the paths the nodes in txn call for, unprobed, by key.
func (p *NodeProber) desired(txn statedb.ReadTxn) (map[string]*health.NodePath, <-chan struct{}) {
	out := map[string]*health.NodePath{}
	all, watch := p.nodes.AllWatch(txn)
	for n := range all {
		if n.Local {
			continue // the local health endpoint has its own prober
		}
		add := func(typ, proto string, ip netip.Addr) {
			if ip.IsValid() {
				r := &health.NodePath{Node: n.Name, Type: typ, Protocol: proto, IP: ip, BootID: n.BootID}
				out[r.Key()] = r
			}
		}
		ip, _ := n.Address(nodes.AddressInternalIP)
		add(health.PathNode, health.ProtocolICMP, ip)
		add(health.PathEndpoint, health.ProtocolICMP, n.HealthIPv4)
		add(health.PathEndpoint, health.ProtocolHTTP, n.HealthIPv4)
	}
	return out, watch
}

// sync makes the table's rows the desired paths: rows of paths gone, or
// whose address or boot ID changed, are dropped (a rebooted node is a new
// node); new paths get an unprobed row. It returns the keys that are new.
// A failed write aborts the transaction and is returned.
func (p *NodeProber) sync(want map[string]*health.NodePath) (fresh []string, err error) {
	wtxn := p.db.WriteTxn(p.paths)
	for cur := range p.paths.All(wtxn) {
		w, ok := want[cur.Key()]
		if !ok || w.IP != cur.IP || w.BootID != cur.BootID {
			if _, _, err := p.paths.Delete(wtxn, cur); err != nil {
				wtxn.Abort()
				return nil, fmt.Errorf("delete node path %s: %w", cur.Key(), err)
			}
		}
	}
	for k, w := range want {
		if _, _, ok := p.paths.Get(wtxn, health.NodePathIndex.Query(k)); !ok {
			if _, _, err := p.paths.Insert(wtxn, w); err != nil {
				wtxn.Abort()
				return nil, fmt.Errorf("insert node path %s: %w", k, err)
			}
			fresh = append(fresh, k)
		}
	}
	wtxn.Commit()
	return fresh, nil
}

// Run probes until ctx ends.
func (p *NodeProber) Run(ctx context.Context, h hive.Health) {
	var lastRound time.Time
	for {
		want, watch := p.desired(p.db.ReadTxn())
		due, err := p.sync(want)
		if err != nil {
			h.Degraded("record the node paths", err)
		}
		if lastRound.IsZero() || p.opts.Now().Sub(lastRound) >= p.opts.Interval {
			due = due[:0]
			for k := range want {
				due = append(due, k)
			}
			lastRound = p.opts.Now()
		}
		if len(due) > 0 {
			err := p.probe(ctx, want, due)
			if ctx.Err() != nil {
				return
			}
			if err != nil {
				h.Degraded("record the node probes", err)
			} else {
				h.OK(p.summary())
			}
		}
		wait := time.NewTimer(p.opts.Interval - p.opts.Now().Sub(lastRound))
		select {
		case <-ctx.Done():
			wait.Stop()
			return
		case <-watch:
		case <-wait.C:
		}
		wait.Stop()
	}
}

// probe probes the due paths at once and records the results in the rows
// that still stand for them. A failed write aborts the transaction and is
// returned.
func (p *NodeProber) probe(ctx context.Context, want map[string]*health.NodePath, due []string) error {
	type result struct {
		key string
		d   time.Duration
		err error
		at  time.Time
	}
	results := make([]result, len(due))
	var wg sync.WaitGroup
	for i, k := range due {
		w := want[k]
		f := p.opts.ICMP
		if w.Protocol == health.ProtocolHTTP {
			f = p.opts.HTTP
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			pctx, cancel := context.WithTimeout(ctx, p.opts.Timeout)
			defer cancel()
			d, err := f(pctx, w.IP)
			results[i] = result{key: k, d: d, err: err, at: p.opts.Now()}
		}()
	}
	wg.Wait()
	if ctx.Err() != nil {
		return nil
	}
	wtxn := p.db.WriteTxn(p.paths)
	for _, r := range results {
		cur, _, ok := p.paths.Get(wtxn, health.NodePathIndex.Query(r.key))
		if w := want[r.key]; !ok || cur.IP != w.IP || cur.BootID != w.BootID {
			continue // the node changed meanwhile
		}
		row := *cur
		row.Probed, row.LastProbed = true, r.at
		if r.err != nil {
			row.Reachable, row.Error, row.Latency = false, r.err.Error(), 0
		} else {
			row.Reachable, row.Error, row.Latency, row.LastReachable = true, "", r.d, r.at
			if p.metrics != nil {
				p.metrics.latency.WithLabelValues(p.metrics.cluster, p.metrics.node, row.Type, "primary", row.Protocol).Observe(r.d.Seconds())
			}
		}
		if _, _, err := p.paths.Insert(wtxn, &row); err != nil {
			wtxn.Abort()
			return fmt.Errorf("insert node path %s: %w", r.key, err)
		}
	}
	wtxn.Commit()
	return nil
}

// summary is the prober's health message: how many nodes answer on every
// path.
func (p *NodeProber) summary() string {
	s := Summarize(statedb.Collect(p.paths.All(p.db.ReadTxn())))
	return fmt.Sprintf("%d/%d other nodes reachable", s.Reachable, s.Total)
}

// NodeSummary counts the nodes of a set of node-health rows.
type NodeSummary struct {
	// Total is the number of nodes; Reachable of those whose every path
	// answered its last probe; Unknown of those not probed yet.
	Total, Reachable, Unknown int
}

// Summarize counts the nodes of rows: a node is reachable when every path
// to it answered its last probe, unknown while one is not probed yet.
func Summarize(rows []*health.NodePath) NodeSummary {
	type st struct{ ok, unknown bool }
	by := map[string]*st{}
	for _, r := range rows {
		s := by[r.Node]
		if s == nil {
			s = &st{ok: true}
			by[r.Node] = s
		}
		if !r.Probed {
			s.unknown = true
		} else if !r.Reachable {
			s.ok = false
		}
	}
	out := NodeSummary{Total: len(by)}
	for s := range maps.Values(by) {
		switch {
		case !s.ok:
		case s.unknown:
			out.Unknown++
		default:
			out.Reachable++
		}
	}
	return out
}
