package healthcheck

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"syscall"
	"time"

	"github.com/cilium/statedb"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/statedb/endpoints"
	"github.com/cellium/cellium/statedb/health"
)

// Defaults of Options.
const (
	DefaultInterval = 10 * time.Second
	DefaultTimeout  = 2 * time.Second
)

// Options tune the prober; the zero Options are the agent's.
type Options struct {
	// Interval between probes (DefaultInterval).
	Interval time.Duration
	// Timeout of one probe (DefaultTimeout).
	Timeout time.Duration
	// NetnsPath is the namespace to probe from; "" is the agent's own.
	NetnsPath string
	// Port is the responder's port (health.Port).
	Port int
	// NodeICMP and NodeHTTP replace the node prober's probes (nil: real
	// ICMP echo and GET /hello), for tests.
	NodeICMP, NodeHTTP ProbeFunc
}

func (o Options) withDefaults() Options {
	if o.Interval <= 0 {
		o.Interval = DefaultInterval
	}
	if o.Timeout <= 0 {
		o.Timeout = DefaultTimeout
	}
	if o.Port == 0 {
		o.Port = health.Port
	}
	return o
}

type params struct {
	hive.In
	DB        *statedb.DB
	Endpoints statedb.Table[*endpoints.Endpoint]
	Probes    statedb.RWTable[*health.Probe]
	Jobs      hive.Jobs
}

func register(p params, o Options) {
	pr := &Prober{opts: o.withDefaults(), db: p.DB, endpoints: p.Endpoints, probes: p.Probes, now: time.Now}
	p.Jobs.Add(hive.Service("probe-health-endpoint", nil, pr.Run))
}

// Prober probes the health endpoint and writes the health-probes table.
type Prober struct {
	opts      Options
	db        *statedb.DB
	endpoints statedb.Table[*endpoints.Endpoint]
	probes    statedb.RWTable[*health.Probe]
	now       func() time.Time
}

// target is what a probe goes to.
type target struct {
	ip     netip.Addr
	device string
	index  int
}

// healthTarget returns the health endpoint's address and host interface,
// and a channel closed when the endpoints change.
func (p *Prober) healthTarget() (target, <-chan struct{}) {
	eps, watch := p.endpoints.AllWatch(p.db.ReadTxn())
	for ep := range eps {
		if ep.Health {
			return target{ip: ep.IPv4, device: ep.HostIfName, index: ep.HostIfIndex}, watch
		}
	}
	return target{}, watch
}

// Run probes until ctx ends: every interval, and at once when the health
// endpoint's address or interface changes.
func (p *Prober) Run(ctx context.Context, h hive.Health) {
	var last target
	var lastProbe time.Time
	for {
		t, watch := p.healthTarget()
		if t != last || lastProbe.IsZero() || p.now().Sub(lastProbe) >= p.opts.Interval {
			row := p.probe(ctx, t)
			if ctx.Err() != nil {
				return
			}
			err := p.write(row)
			last, lastProbe = t, p.now()
			switch {
			case err != nil:
				h.Degraded("record the health endpoint's probe", err)
			case row.Reachable:
				h.OK(fmt.Sprintf("health endpoint %s reachable in %s", t.ip, row.Latency.Round(time.Microsecond)))
			default:
				// Not degraded: the agent works without it; status
				// shows the reason.
				h.OK("health endpoint unreachable: " + row.Error)
			}
		}
		wait := time.NewTimer(p.opts.Interval - p.now().Sub(lastProbe))
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

// probe asks the responder at t once.
func (p *Prober) probe(ctx context.Context, t target) *health.Probe {
	row := &health.Probe{Name: health.ProbeHealthEndpoint, IP: t.ip}
	switch {
	case !t.ip.IsValid():
		row.Error = "the node has no health endpoint yet"
	case t.device == "":
		row.Error = "the health endpoint has no interface (is --enable-endpoint-health-checking on?)"
	default:
		start := p.now()
		err := p.checkRoute(t)
		if err == nil {
			err = p.get(ctx, t)
		}
		row.LastProbed = p.now()
		if err != nil {
			row.Error = err.Error()
		} else {
			row.Reachable = true
			row.Latency = row.LastProbed.Sub(start)
		}
	}
	if row.LastProbed.IsZero() {
		row.LastProbed = p.now()
	}
	if row.Reachable {
		row.LastReachable = row.LastProbed
	} else if cur, _, ok := p.probes.Get(p.db.ReadTxn(), health.ProbeIndex.Query(row.Name)); ok {
		row.LastReachable = cur.LastReachable
	}
	return row
}

// get does GET http://ip:port/hello through t.device.
func (p *Prober) get(ctx context.Context, t target) error {
	ctx, cancel := context.WithTimeout(ctx, p.opts.Timeout)
	defer cancel()
	addr := net.JoinHostPort(t.ip.String(), strconv.Itoa(p.opts.Port))
	tr := &http.Transport{
		DisableKeepAlives: true,
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return p.dial(ctx, network, addr, t.device)
		},
	}
	defer tr.CloseIdleConnections()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+health.Path, nil)
	if err != nil {
		return err
	}
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		var uerr interface{ Unwrap() error }
		if errors.As(err, &uerr) {
			err = uerr.Unwrap()
		}
		return fmt.Errorf("GET %s%s: %w", addr, health.Path, err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s%s: %s", addr, health.Path, resp.Status)
	}
	return nil
}

// dial connects to addr from a socket bound to device, in the prober's
// namespace.
func (p *Prober) dial(ctx context.Context, network, addr, device string) (net.Conn, error) {
	d := net.Dialer{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		if err := c.Control(func(fd uintptr) { serr = unix.BindToDevice(int(fd), device) }); err != nil {
			return err
		}
		if serr != nil {
			return fmt.Errorf("bind to %s: %w", device, serr)
		}
		return nil
	}}
	var conn net.Conn
	err := p.inNetns(func() error {
		var err error
		conn, err = d.DialContext(ctx, network, addr)
		return err
	})
	return conn, err
}

// inNetns runs f in the prober's namespace.
func (p *Prober) inNetns(f func() error) error {
	if p.opts.NetnsPath == "" {
		return f()
	}
	n, err := ns.GetNS(p.opts.NetnsPath)
	if err != nil {
		return err
	}
	defer n.Close()
	return n.Do(func(ns.NetNS) error { return f() })
}

// checkRoute makes sure the node routes t.ip through t.device, as it
// routes a pod's address through its veth: a probe tests that path, and
// without it (host routing off) it is not sent at all.
func (p *Prober) checkRoute(t target) error {
	return p.inNetns(func() error {
		rs, err := netlink.RouteGet(t.ip.AsSlice())
		if err != nil || len(rs) == 0 {
			return fmt.Errorf("the node has no route to %s (is --enable-endpoint-routes on?)", t.ip)
		}
		l, err := netlink.LinkByIndex(rs[0].LinkIndex)
		if err != nil {
			return fmt.Errorf("route to %s: %w", t.ip, err)
		}
		if name := l.Attrs().Name; name != t.device {
			return fmt.Errorf("the node routes %s through %s, not through the health endpoint's %s (is --enable-endpoint-routes on?)", t.ip, name, t.device)
		}
		return nil
	})
}

// write stores row.
func (p *Prober) write(row *health.Probe) error {
	wtxn := p.db.WriteTxn(p.probes)
	if _, _, err := p.probes.Insert(wtxn, row); err != nil {
		wtxn.Abort()
		return fmt.Errorf("insert the probe of %s: %w", row.Name, err)
	}
	wtxn.Commit()
	return nil
}
