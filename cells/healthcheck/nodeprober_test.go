package healthcheck_test

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cilium/statedb"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/cellium/cellium/cells/healthcheck"
	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/cells/hive/hivetest"
	"github.com/cellium/cellium/cells/k8s"
	"github.com/cellium/cellium/statedb/endpoints"
	"github.com/cellium/cellium/statedb/health"
	"github.com/cellium/cellium/statedb/nodes"
)

// fakeNet answers probes of the addresses it is told are up.
type fakeNet struct {
	mu    sync.Mutex
	up    map[netip.Addr]bool
	calls map[string]int
}

func (f *fakeNet) set(ip string, up bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.up[netip.MustParseAddr(ip)] = up
}

func (f *fakeNet) probe(proto string) healthcheck.ProbeFunc {
	return func(ctx context.Context, ip netip.Addr) (time.Duration, error) {
		f.mu.Lock()
		defer f.mu.Unlock()
		f.calls[proto+" "+ip.String()]++
		if f.up[ip] {
			return time.Millisecond, nil
		}
		return 0, errors.New(proto + " " + ip.String() + ": no answer")
	}
}

type nodeEnv struct {
	db    *statedb.DB
	nodes statedb.RWTable[*nodes.Node]
	paths statedb.Table[*health.NodePath]
	reg   *prometheus.Registry
}

func startNodes(t *testing.T, f *fakeNet) *nodeEnv {
	t.Helper()
	e := &nodeEnv{reg: prometheus.NewRegistry()}
	hivetest.Start(t, []string{"--health-check-interval=1s"},
		hive.Provide(endpoints.NewTable, statedb.RWTable[*endpoints.Endpoint].ToTable,
			nodes.NewNodesTable, statedb.RWTable[*nodes.Node].ToTable,
			func() k8s.NodeName { return "n1" },
			func() prometheus.Registerer { return e.reg }),
		healthcheck.NewCell(healthcheck.Options{Interval: time.Hour, NodeICMP: f.probe("icmp"), NodeHTTP: f.probe("http")}),
		hivetest.Capture(&e.db), hivetest.Capture(&e.nodes), hivetest.Capture(&e.paths),
	)
	return e
}

func (e *nodeEnv) upsert(n *nodes.Node) {
	w := e.db.WriteTxn(e.nodes)
	_, _, _ = e.nodes.Insert(w, n)
	w.Commit()
}

func (e *nodeEnv) remove(name string) {
	w := e.db.WriteTxn(e.nodes)
	_, _, _ = e.nodes.Delete(w, &nodes.Node{Name: name})
	w.Commit()
}

// waitPaths waits until the rows satisfy ok.
func (e *nodeEnv) waitPaths(t *testing.T, what string, ok func(map[string]*health.NodePath) bool) map[string]*health.NodePath {
	t.Helper()
	timeout := time.After(30 * time.Second)
	for {
		all, watch := e.paths.AllWatch(e.db.ReadTxn())
		m := map[string]*health.NodePath{}
		for p := range all {
			m[p.Key()] = p
		}
		if ok(m) {
			return m
		}
		select {
		case <-watch:
		case <-timeout:
			t.Fatalf("%s: not within 30s; rows %v", what, m)
		}
	}
}

func remote(name, ip, healthIP, boot string) *nodes.Node {
	return &nodes.Node{Name: name, BootID: boot, HealthIPv4: netip.MustParseAddr(healthIP),
		Addresses: []nodes.Address{{Type: nodes.AddressInternalIP, IP: netip.MustParseAddr(ip)}}}
}

// Every other node is probed on three paths (node ICMP, endpoint ICMP
// and HTTP), never the local node; a path that stops answering is
// unreachable within two intervals, with its error and its last success
// kept, and reachable again after; metrics count by status.
func TestNodeProberPaths(t *testing.T) {
	f := &fakeNet{up: map[netip.Addr]bool{}, calls: map[string]int{}}
	for _, ip := range []string{"192.168.0.2", "10.2.0.9", "192.168.0.3", "10.3.0.9"} {
		f.set(ip, true)
	}
	e := startNodes(t, f)
	e.upsert(&nodes.Node{Name: "n1", Local: true, Addresses: []nodes.Address{{Type: nodes.AddressInternalIP, IP: netip.MustParseAddr("192.168.0.1")}}})
	e.upsert(remote("n2", "192.168.0.2", "10.2.0.9", "b2"))
	e.upsert(remote("n3", "192.168.0.3", "10.3.0.9", "b3"))
	all := e.waitPaths(t, "every path reachable", func(m map[string]*health.NodePath) bool {
		if len(m) != 6 {
			return false
		}
		for _, p := range m {
			if !p.Reachable {
				return false
			}
		}
		return true
	})
	for _, k := range []string{"n2/node/icmp", "n2/endpoint/icmp", "n2/endpoint/http", "n3/node/icmp", "n3/endpoint/icmp", "n3/endpoint/http"} {
		if p := all[k]; p == nil || p.Latency != time.Millisecond || p.LastReachable.IsZero() {
			t.Errorf("%s = %+v", k, p)
		}
	}
	if s := healthcheck.Summarize(statedb.Collect(e.paths.All(e.db.ReadTxn()))); s != (healthcheck.NodeSummary{Total: 2, Reachable: 2}) {
		t.Errorf("summary %+v", s)
	}

	// n3's health endpoint stops answering: unreachable within two
	// intervals (2s), the node path still reachable.
	cut := time.Now()
	f.set("10.3.0.9", false)
	down := e.waitPaths(t, "n3's endpoint unreachable", func(m map[string]*health.NodePath) bool {
		p := m["n3/endpoint/http"]
		return p != nil && !p.Reachable
	})
	if took := time.Since(cut); took > 2*time.Second+500*time.Millisecond {
		t.Errorf("unreachable after %s, more than two intervals", took)
	}
	p := down["n3/endpoint/http"]
	if !strings.Contains(p.Error, "no answer") || p.LastReachable.IsZero() || p.Latency != 0 {
		t.Errorf("unreachable path %+v", p)
	}
	if !down["n3/node/icmp"].Reachable {
		t.Errorf("n3's node path %+v", down["n3/node/icmp"])
	}
	if s := healthcheck.Summarize(statedb.Collect(e.paths.All(e.db.ReadTxn()))); s.Reachable != 1 || s.Total != 2 {
		t.Errorf("summary %+v", s)
	}
	if v := (metricWith(t, e.reg, "cilium_node_health_connectivity_status", "endpoint", "unreachable")); v != 1 {
		t.Errorf("endpoint unreachable = %v, want 1", v)
	}
	if v := (metricWith(t, e.reg, "cilium_node_health_connectivity_status", "node", "reachable")); v != 2 {
		t.Errorf("node reachable = %v, want 2", v)
	}
	f.set("10.3.0.9", true)
	e.waitPaths(t, "n3's endpoint reachable again", func(m map[string]*health.NodePath) bool {
		p := m["n3/endpoint/http"]
		return p != nil && p.Reachable && p.Error == ""
	})
	f.mu.Lock()
	local := f.calls["icmp 192.168.0.1"]
	f.mu.Unlock()
	if local != 0 {
		t.Errorf("the local node was probed %d times", local)
	}
}

// A node that leaves takes its rows with it; a node that comes back with
// a new boot ID (rebooted) starts afresh: its last success is not the old
// node's.
func TestNodeProberLifecycle(t *testing.T) {
	f := &fakeNet{up: map[netip.Addr]bool{}, calls: map[string]int{}}
	f.set("192.168.0.2", true)
	e := startNodes(t, f)
	e.upsert(remote("n2", "192.168.0.2", "10.2.0.9", "boot-1"))
	before := e.waitPaths(t, "n2 probed", func(m map[string]*health.NodePath) bool {
		return len(m) == 3 && m["n2/node/icmp"].Reachable && m["n2/endpoint/http"].Probed
	})
	if before["n2/endpoint/http"].Reachable {
		t.Errorf("endpoint answered: %+v", before["n2/endpoint/http"])
	}

	// Rebooted: the rows start over (unprobed, no last success) and are
	// probed at once, not an interval later.
	f.set("192.168.0.2", false)
	e.upsert(remote("n2", "192.168.0.2", "10.2.0.9", "boot-2"))
	after := e.waitPaths(t, "n2 probed after its reboot", func(m map[string]*health.NodePath) bool {
		p := m["n2/node/icmp"]
		return p != nil && p.BootID == "boot-2" && p.Probed
	})
	if p := after["n2/node/icmp"]; p.Reachable || !p.LastReachable.IsZero() {
		t.Errorf("after the reboot: %+v, want unreachable and never reachable", p)
	}

	e.remove("n2")
	e.waitPaths(t, "n2's rows gone", func(m map[string]*health.NodePath) bool { return len(m) == 0 })
}

// metricWith returns the value of one series of name.
func metricWith(t *testing.T, reg *prometheus.Registry, name, typ, status string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["type"] == typ && labels["status"] == status {
				return m.GetGauge().GetValue()
			}
		}
	}
	t.Fatalf("no %s{type=%q,status=%q}", name, typ, status)
	return 0
}
