package routing

import (
	"net/netip"
	"testing"
	"time"

	"github.com/cilium/statedb"
	"github.com/vishvananda/netlink"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	"github.com/cellium/cellium/statedb/endpoints"
	"github.com/cellium/cellium/statedb/reconciler"
	"github.com/cellium/cellium/test/privileged"
)

// BenchmarkPrivilegedRoutes measures endpoints -> kernel routes: each
// iteration inserts 256 endpoint rows (all routed through one veth of a
// test node namespace), waits until every route row is reconciled, then
// deletes the rows and waits until the routes are gone from the tables.
// It reports routes programmed and removed per second.
func BenchmarkPrivilegedRoutes(b *testing.B) {
	privileged.Require(b)
	const n = 256
	node := newTestNS(b)
	nh := nodeHandle(b, node)
	if err := nh.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "cr-bench"}, PeerName: "cr-bench-p"}); err != nil {
		b.Fatal(err)
	}
	for _, name := range []string{"cr-bench", "cr-bench-p"} {
		l, _ := nh.LinkByName(name)
		if err := nh.LinkSetUp(l); err != nil {
			b.Fatal(err)
		}
	}
	h := startHarness(b, node, time.Hour)
	h.setLocalNode(testRouter)
	h.endpointsRestored()
	h.waitTables("cilium_host", func(txn statedb.ReadTxn) bool { return allDone(txn, h.tables, 0) })

	count := func(txn statedb.ReadTxn) (done, total int) {
		for r := range h.tables.Routes.All(txn) {
			total++
			if r.Status.Kind == reconciler.StatusDone {
				done++
			}
		}
		return done, total
	}
	b.ResetTimer()
	for range b.N {
		wtxn := h.db.WriteTxn(h.eps)
		for i := range n {
			ip := netip.AddrFrom4([4]byte{10, 213, 1 + byte(i/250), byte(2 + i%250)})
			_, _, _ = h.eps.Insert(wtxn, &endpoints.Endpoint{ID: uint16(100 + i), IPv4: ip, HostIfName: "cr-bench", State: ciliumv2.EndpointStateReady})
		}
		wtxn.Commit()
		h.waitTables("routes programmed", func(txn statedb.ReadTxn) bool { d, _ := count(txn); return d == n })
		wtxn = h.db.WriteTxn(h.eps)
		for i := range n {
			_, _, _ = h.eps.Delete(wtxn, &endpoints.Endpoint{ID: uint16(100 + i)})
		}
		wtxn.Commit()
		h.waitTables("routes removed", func(txn statedb.ReadTxn) bool { _, total := count(txn); return total == 0 })
	}
	waitKernel(b, "the last routes deleted from the kernel", func() (bool, error) {
		rs, err := h.routesOwned()
		return rs == 0, err
	})
	b.StopTimer()
	b.ReportMetric(float64(2*n*b.N)/b.Elapsed().Seconds(), "route-ops/s")
}
