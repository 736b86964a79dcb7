package healthendpoint_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cilium/statedb"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/containernetworking/plugins/pkg/testutils"
	"github.com/vishvananda/netlink"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	"github.com/cellium/cellium/cells/healthcheck"
	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/cells/hive/hivetest"
	"github.com/cellium/cellium/daemon/healthendpoint"
	"github.com/cellium/cellium/daemon/hostrouting"
	"github.com/cellium/cellium/datapath/healthep"
	"github.com/cellium/cellium/datapath/link"
	"github.com/cellium/cellium/datapath/routing"
	"github.com/cellium/cellium/statedb/endpoints"
	"github.com/cellium/cellium/statedb/health"
	"github.com/cellium/cellium/statedb/nodes"
	"github.com/cellium/cellium/test/privileged"
)

var (
	routerIP = netip.MustParseAddr("10.216.0.1")
	healthIP = netip.MustParseAddr("10.216.0.7")
)

func newTestNS(t *testing.T) ns.NetNS {
	t.Helper()
	n, err := testutils.NewNS()
	if err != nil {
		t.Fatalf("create netns: %v", err)
	}
	t.Cleanup(func() {
		_ = n.Close()
		if err := testutils.UnmountNS(n); err != nil {
			t.Errorf("remove netns %s: %v", n.Path(), err)
		}
	})
	return n
}

// agent is one run of the cells under test on the node namespace, with
// stand-ins for the endpoint manager's and node discovery's tables.
type agent struct {
	h      *hive.Hive
	db     *statedb.DB
	ops    *healthep.Ops
	ifaces statedb.Table[*health.Interface]
	probes statedb.Table[*health.Probe]
	netns  statedb.Table[*health.Netns]

	nodePath, healthPath string
	stopped              bool
}

// The prober's timeout is generous: tests run niced on a busy machine.

// startAgent starts the health endpoint cell, the prober and host routing
// acting on node, with the health endpoint row and the router IP in the
// stand-in tables, and a stand-in for the endpoint manager's copy of the
// health-interface row into the health endpoint row.
func startAgent(t *testing.T, node ns.NetNS, names healthep.Names) *agent {
	t.Helper()
	a := &agent{nodePath: node.Path(), healthPath: names.NetnsPath()}
	var (
		eps   statedb.RWTable[*endpoints.Endpoint]
		local statedb.RWTable[*nodes.LocalNode]
	)
	a.h = hivetest.New(t, []string{"--enable-ipv4-masquerade=false"},
		hive.Provide(endpoints.NewTable, nodes.NewLocalNodeTable,
			statedb.RWTable[*endpoints.Endpoint].ToTable, statedb.RWTable[*nodes.LocalNode].ToTable),
		hostrouting.NewCell(routing.Netns{Path: node.Path()}),
		healthendpoint.NewCell(healthendpoint.Options{Host: link.Host{NetnsPath: node.Path()}, Names: names, FullInterval: time.Second}),
		healthcheck.NewCell(healthcheck.Options{NetnsPath: node.Path(), Interval: 100 * time.Millisecond, Timeout: 5 * time.Second, Port: names.Port}),
		hivetest.Capture(&a.db), hivetest.Capture(&eps), hivetest.Capture(&local), hivetest.Capture(&a.ops),
		hivetest.Capture(&a.ifaces), hivetest.Capture(&a.probes), hivetest.Capture(&a.netns),
		hive.Invoke(func(jobs hive.Jobs, db *statedb.DB, ifaces statedb.Table[*health.Interface]) {
			jobs.Add(hive.Service("copy-health-interface", nil, func(ctx context.Context, _ hive.Health) {
				copyInterface(ctx, db, ifaces, eps)
			}))
		}),
	)
	if err := a.h.Start(context.Background()); err != nil {
		t.Fatalf("start hive: %v", err)
	}
	t.Cleanup(func() { a.stop(t) })
	wtxn := a.db.WriteTxn(eps, local)
	_, _, _ = local.Insert(wtxn, &nodes.LocalNode{Name: "node", RouterIP: routerIP})
	_, _, _ = eps.Insert(wtxn, &endpoints.Endpoint{ID: 1, IPv4: healthIP, Health: true, State: ciliumv2.EndpointStateReady})
	eps.RegisterInitializer(wtxn, "test")(wtxn)
	wtxn.Commit()
	return a
}

func (a *agent) stop(t *testing.T) {
	t.Helper()
	if a.stopped {
		return
	}
	a.stopped = true
	if err := a.h.Stop(context.Background()); err != nil {
		t.Errorf("stop hive: %v", err)
	}
}

// copyInterface does what the endpoint manager does: the health endpoint
// row follows the health-interface row.
func copyInterface(ctx context.Context, db *statedb.DB, ifaces statedb.Table[*health.Interface], eps statedb.RWTable[*endpoints.Endpoint]) {
	for {
		wtxn := db.WriteTxn(eps)
		rows, watch := ifaces.AllWatch(wtxn)
		ep, _, ok := eps.Get(wtxn, endpoints.IDIndex.Query(1))
		for r := range rows {
			if ok && (ep.HostIfName != r.HostIfName || ep.HostIfIndex != r.HostIfIndex) {
				c := ep.Clone()
				c.HostIfName, c.HostIfIndex, c.NetnsPath = r.HostIfName, r.HostIfIndex, r.NetnsPath
				_, _, _ = eps.Insert(wtxn, c)
			}
		}
		wtxn.Commit()
		select {
		case <-ctx.Done():
			return
		case <-watch:
		}
	}
}

// waitInterface waits for a health-interface row that ok accepts.
func (a *agent) waitInterface(t *testing.T, what string, ok func(*health.Interface) bool) *health.Interface {
	t.Helper()
	timeout := time.After(60 * time.Second)
	for {
		rows, watch := a.ifaces.AllWatch(a.db.ReadTxn())
		for r := range rows {
			if ok(r) {
				return r
			}
		}
		select {
		case <-watch:
		case <-timeout:
			t.Fatalf("no health interface %s within 60s; health-netns: %s", what, a.netnsStatus())
		}
	}
}

// waitProbe waits for a probe that ok accepts.
func (a *agent) waitProbe(t *testing.T, what string, ok func(*health.Probe) bool) *health.Probe {
	t.Helper()
	timeout := time.After(60 * time.Second)
	var last *health.Probe
	for {
		p, _, watch, found := a.probes.GetWatch(a.db.ReadTxn(), health.ProbeIndex.Query(health.ProbeHealthEndpoint))
		if found {
			last = p
			if ok(p) {
				return p
			}
		}
		select {
		case <-watch:
		case <-timeout:
			t.Fatalf("health endpoint not %s within 60s: last probe %+v; health-netns: %s\n%s", what, last, a.netnsStatus(), a.dump())
		}
	}
}

// dump shows the namespaces' links, addresses, routes, neighbours and
// sysctls, to tell why a probe failed.
func (a *agent) dump() string {
	var b strings.Builder
	for _, n := range []string{a.nodePath, a.healthPath} {
		name := filepath.Base(n)
		for _, args := range [][]string{{"-d", "link"}, {"addr"}, {"route"}, {"neigh"}} {
			out, _ := exec.Command("ip", append([]string{"-n", name}, args...)...).CombinedOutput()
			fmt.Fprintf(&b, "ip -n %s %s:\n%s", name, strings.Join(args, " "), out)
		}
		out, _ := exec.Command("ip", "netns", "exec", name, "sh", "-c", "sysctl -a 2>/dev/null | grep -E 'rp_filter|arp_ignore|arp_filter|ip_forward |accept_local|route_localnet'; nstat -az 2>/dev/null | grep -v ' 0 '").CombinedOutput()
		fmt.Fprintf(&b, "%s sysctls and counters:\n%s", name, out)
	}
	for _, tbl := range []string{"host-routes", "host-devices", "host-sysctls"} {
		var buf strings.Builder
		_ = a.db.ReadTxn().WriteJSON(&buf, tbl)
		fmt.Fprintf(&b, "%s: %s\n", tbl, buf.String())
	}
	return b.String()
}

func (a *agent) netnsStatus() string {
	var out []string
	for n := range a.netns.All(a.db.ReadTxn()) {
		out = append(out, n.NetnsPath+": "+n.Status.String())
	}
	return strings.Join(out, "; ")
}

// get asks the responder from the node namespace, as an operator's curl
// on the node would.
func get(node ns.NetNS, port int) (string, error) {
	var conn net.Conn
	err := node.Do(func(ns.NetNS) error {
		var err error
		conn, err = net.DialTimeout("tcp4", netip.AddrPortFrom(healthIP, uint16(port)).String(), 5*time.Second)
		return err
	})
	if err != nil {
		return "", err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := fmt.Fprintf(conn, "GET %s HTTP/1.0\r\nHost: health\r\n\r\n", health.Path); err != nil {
		return "", err
	}
	b, err := io.ReadAll(conn)
	return string(b), err
}

func hostLinks(t *testing.T, node ns.NetNS, name string) (n int) {
	t.Helper()
	err := node.Do(func(ns.NetNS) error {
		links, err := netlink.LinkList()
		for _, l := range links {
			if l.Attrs().Name == name || strings.Contains(l.Attrs().Alias, "health-test") {
				n++
			}
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestPrivilegedHealthEndpoint runs the health endpoint cell with the
// prober and host routing on a namespace playing the node: the namespace,
// veth and responder are made and a real GET from the node answers; the
// status turns unreachable when the responder is stopped and reachable
// once the reconciler restarts it; a removed namespace and a deleted veth
// are repaired; a second agent adopts what the first left (as after
// SIGKILL) without making anything twice.
func TestPrivilegedHealthEndpoint(t *testing.T) {
	privileged.Require(t)
	node := newTestNS(t)
	// A node's loopback is up: without any address the namespace has no
	// local routing table yet, and the kernel would take the health IP
	// for a broadcast address (a NOARP neighbour with ff:ff:ff:ff:ff:ff,
	// whose SYNs the health namespace's TCP ignores) if a packet went out
	// before cilium_host has the router IP.
	if err := node.Do(func(ns.NetNS) error {
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		return netlink.LinkSetUp(lo)
	}); err != nil {
		t.Fatal(err)
	}
	names := healthep.Names{
		NetnsName:   fmt.Sprintf("cellium-health-test-%d", os.Getpid()),
		HostIfName:  "lxc_hlthtest",
		ContainerID: "health-test",
	}.WithDefaults()
	t.Cleanup(func() {
		if err := healthep.Remove(context.Background(), link.Host{NetnsPath: node.Path()}, names.NetnsPath(), names.HostIfName); err != nil {
			t.Errorf("remove health endpoint: %v", err)
		}
	})

	a := startAgent(t, node, names)
	first := a.waitInterface(t, "made", func(*health.Interface) bool { return true })
	if first.NetnsPath != names.NetnsPath() || first.HostIfIndex == 0 || first.MAC == "" || first.IPv4 != healthIP {
		t.Errorf("health interface %+v", first)
	}
	p := a.waitProbe(t, "reachable", func(p *health.Probe) bool { return p.Reachable })
	if p.IP != healthIP || p.Latency <= 0 {
		t.Errorf("probe %+v", p)
	}
	body, err := get(node, names.Port)
	if err != nil || !strings.HasPrefix(body, "HTTP/1.0 200 OK") || !strings.HasSuffix(body, "OK\n") {
		t.Errorf("GET %s from the node: %v\n%s", health.Path, err, body)
	}

	t.Run("responder stopped", func(t *testing.T) {
		resume := a.ops.StopResponder()
		p := a.waitProbe(t, "unreachable", func(p *health.Probe) bool { return !p.Reachable })
		if !strings.Contains(p.Error, "connection refused") {
			t.Errorf("unreachable probe says %q, want connection refused", p.Error)
		}
		resume()
		a.waitProbe(t, "reachable again", func(p *health.Probe) bool { return p.Reachable })
	})

	t.Run("netns removed", func(t *testing.T) {
		before := a.waitInterface(t, "current", func(*health.Interface) bool { return true })
		if err := healthep.Remove(context.Background(), link.Host{NetnsPath: node.Path()}, names.NetnsPath(), "unused0"); err != nil {
			t.Fatal(err) // unpins the namespace only: no link named unused0
		}
		after := a.waitInterface(t, "in a new namespace", func(i *health.Interface) bool { return i.NetnsInode != before.NetnsInode })
		if after.HostIfIndex == before.HostIfIndex {
			t.Errorf("the veth of the removed namespace was kept (ifindex %d)", after.HostIfIndex)
		}
		since := time.Now()
		a.waitProbe(t, "reachable in the new namespace", func(p *health.Probe) bool { return p.Reachable && p.LastProbed.After(since) })
	})

	t.Run("veth deleted", func(t *testing.T) {
		before := a.waitInterface(t, "current", func(*health.Interface) bool { return true })
		if err := (link.Host{NetnsPath: node.Path()}).RemoveEndpoint(context.Background(), names.HostIfName, ""); err != nil {
			t.Fatal(err)
		}
		after := a.waitInterface(t, "on a new veth", func(i *health.Interface) bool { return i.HostIfIndex != before.HostIfIndex })
		if after.NetnsInode != before.NetnsInode {
			t.Errorf("the namespace was made anew for a deleted veth")
		}
		since := time.Now()
		a.waitProbe(t, "reachable over the new veth", func(p *health.Probe) bool { return p.Reachable && p.LastProbed.After(since) })
	})

	t.Run("restart adopts", func(t *testing.T) {
		before := a.waitInterface(t, "current", func(*health.Interface) bool { return true })
		a.stop(t)
		if _, err := get(node, names.Port); err == nil {
			t.Errorf("the responder still answers after the agent stopped")
		}
		b := startAgent(t, node, names)
		after := b.waitInterface(t, "adopted", func(*health.Interface) bool { return true })
		if after.HostIfIndex != before.HostIfIndex || after.NetnsInode != before.NetnsInode || after.MAC != before.MAC {
			t.Errorf("restart made the endpoint anew: before %+v, after %+v", before, after)
		}
		b.waitProbe(t, "reachable after restart", func(p *health.Probe) bool { return p.Reachable })
		if n := hostLinks(t, node, names.HostIfName); n != 1 {
			t.Errorf("%d health veths on the node, want 1", n)
		}
	})
}
