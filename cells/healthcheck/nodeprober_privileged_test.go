package healthcheck_test

import (
	"context"
	"net"
	"net/http"
	"net/netip"
	"os"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/statedb"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/containernetworking/plugins/pkg/testutils"
	"github.com/vishvananda/netlink"

	"github.com/cellium/cellium/cells/healthcheck"
	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/statedb/health"
	"github.com/cellium/cellium/statedb/nodes"
	"github.com/cellium/cellium/test/privileged"
)

type nopHealth struct{}

func (nopHealth) OK(string)                {}
func (nopHealth) Degraded(string, error)   {}
func (nopHealth) Stopped(string)           {}
func (nopHealth) Scope(string) hive.Health { return nopHealth{} }

func newNetns(t *testing.T) ns.NetNS {
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

// TestPrivilegedNodeProberCutLink plays two nodes with two network
// namespaces joined by a veth: node A runs the prober, node B answers
// ICMP on its address and on its health IP, where a real HTTP responder
// serves GET /hello. Every path is reachable; with B's end of the link
// down, every path is unreachable within two intervals; with it up again,
// reachable again.
func TestPrivilegedNodeProberCutLink(t *testing.T) {
	privileged.Require(t)
	x := byte(os.Getpid()%200) + 20
	testRange := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 252, x, 0}), 24)
	// Nothing of the test range leaves the machine through the root
	// namespace.
	bh := &netlink.Route{Dst: &net.IPNet{IP: testRange.Addr().AsSlice(), Mask: net.CIDRMask(24, 32)},
		Type: syscall.RTN_BLACKHOLE, Table: syscall.RT_TABLE_MAIN}
	if err := netlink.RouteAdd(bh); err != nil {
		t.Fatalf("blackhole %s: %v", testRange, err)
	}
	t.Cleanup(func() { _ = netlink.RouteDel(bh) })

	a, b := newNetns(t), newNetns(t)
	aIP := netip.AddrFrom4([4]byte{10, 252, x, 1})
	bIP := netip.AddrFrom4([4]byte{10, 252, x, 2})
	bHealth := netip.AddrFrom4([4]byte{10, 252, x, 3})
	var bLink string
	if err := a.Do(func(ns.NetNS) error {
		veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "nha"}, PeerName: "nhb"}
		if err := netlink.LinkAdd(veth); err != nil {
			return err
		}
		peer, err := netlink.LinkByName("nhb")
		if err != nil {
			return err
		}
		if err := netlink.LinkSetNsFd(peer, int(b.Fd())); err != nil {
			return err
		}
		l, err := netlink.LinkByName("nha")
		if err != nil {
			return err
		}
		if err := netlink.AddrAdd(l, &netlink.Addr{IPNet: &net.IPNet{IP: aIP.AsSlice(), Mask: net.CIDRMask(24, 32)}}); err != nil {
			return err
		}
		return netlink.LinkSetUp(l)
	}); err != nil {
		t.Fatalf("node A's link: %v", err)
	}
	var srv *http.Server
	var port int
	if err := b.Do(func(ns.NetNS) error {
		l, err := netlink.LinkByName("nhb")
		if err != nil {
			return err
		}
		bLink = l.Attrs().Name
		for _, ip := range []netip.Addr{bIP, bHealth} {
			if err := netlink.AddrAdd(l, &netlink.Addr{IPNet: &net.IPNet{IP: ip.AsSlice(), Mask: net.CIDRMask(24, 32)}}); err != nil {
				return err
			}
		}
		if err := netlink.LinkSetUp(l); err != nil {
			return err
		}
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		if err := netlink.LinkSetUp(lo); err != nil {
			return err
		}
		// The responder, listening inside B on the health IP.
		ln, err := net.Listen("tcp", net.JoinHostPort(bHealth.String(), "0"))
		if err != nil {
			return err
		}
		port = ln.Addr().(*net.TCPAddr).Port
		mux := http.NewServeMux()
		mux.HandleFunc("GET "+health.Path, func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("OK\n")) })
		srv = &http.Server{Handler: mux, ReadHeaderTimeout: time.Second}
		go func() { _ = srv.Serve(ln) }()
		return nil
	}); err != nil {
		t.Fatalf("node B: %v", err)
	}
	t.Cleanup(func() { _ = srv.Close() })

	db := statedb.New()
	nodeTable, err := nodes.NewNodesTable(db)
	if err != nil {
		t.Fatal(err)
	}
	paths, err := health.NewNodePathsTable(db)
	if err != nil {
		t.Fatal(err)
	}
	w := db.WriteTxn(nodeTable)
	_, _, _ = nodeTable.Insert(w, &nodes.Node{Name: "b", BootID: "boot-b", HealthIPv4: bHealth,
		Addresses: []nodes.Address{{Type: nodes.AddressInternalIP, IP: bIP}}})
	w.Commit()

	const interval = time.Second
	p := healthcheck.NewNodeProber(healthcheck.NodeProberOptions{Interval: interval, Timeout: 500 * time.Millisecond,
		Port: port, NetnsPath: a.Path()}, db, nodeTable, paths)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); p.Run(ctx, nopHealth{}) }()
	t.Cleanup(func() { cancel(); wg.Wait() })

	wait := func(what string, within time.Duration, want bool) {
		t.Helper()
		start := time.Now()
		deadline := time.After(within)
		for {
			rows, watch := paths.AllWatch(db.ReadTxn())
			n, ok := 0, true
			var last []*health.NodePath
			for r := range rows {
				n++
				last = append(last, r)
				ok = ok && r.Probed && r.Reachable == want
			}
			if n == 3 && ok {
				t.Logf("%s after %s", what, time.Since(start).Round(time.Millisecond))
				return
			}
			select {
			case <-watch:
			case <-deadline:
				for _, r := range last {
					t.Logf("  %s: %+v", r.Key(), *r)
				}
				t.Fatalf("%s: not within %s", what, within)
			}
		}
	}
	wait("every path reachable", 10*time.Second, true)

	setLink := func(up bool) {
		t.Helper()
		if err := b.Do(func(ns.NetNS) error {
			l, err := netlink.LinkByName(bLink)
			if err != nil {
				return err
			}
			if up {
				return netlink.LinkSetUp(l)
			}
			return netlink.LinkSetDown(l)
		}); err != nil {
			t.Fatalf("set B's link up=%v: %v", up, err)
		}
	}
	setLink(false)
	wait("every path unreachable with B's link down", 2*interval+500*time.Millisecond, false)
	setLink(true)
	wait("every path reachable again", 2*interval+500*time.Millisecond, true)
}
