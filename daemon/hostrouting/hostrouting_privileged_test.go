package hostrouting_test

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/cilium/statedb"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/containernetworking/plugins/pkg/testutils"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/cells/hive/hivetest"
	"github.com/cellium/cellium/daemon/hostrouting"
	"github.com/cellium/cellium/datapath/link"
	"github.com/cellium/cellium/datapath/routing"
	"github.com/cellium/cellium/statedb/endpoints"
	"github.com/cellium/cellium/statedb/nodes"
	"github.com/cellium/cellium/statedb/reconciler"
	"github.com/cellium/cellium/statedb/routes"
	"github.com/cellium/cellium/test/privileged"
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

// TestPrivilegedCellConnectsPods runs the cell as the agent composes it
// (its tables, deriver and reconciler jobs in a hive), on a namespace that
// plays the node: from endpoint and local-node rows alone, two pods made
// by the CNI code reach each other. All addresses live only in the test's
// namespaces (the node has no default route).
func TestPrivilegedCellConnectsPods(t *testing.T) {
	privileged.Require(t)
	router := netip.MustParseAddr("10.214.0.1")
	ipA, ipB := netip.MustParseAddr("10.214.0.10"), netip.MustParseAddr("10.214.0.11")
	node := newTestNS(t)
	var pods []ns.NetNS
	var res []link.Result
	for i, ip := range []netip.Addr{ipA, ipB} {
		pod := newTestNS(t)
		r, err := link.Host{NetnsPath: node.Path()}.SetupEndpoint(context.Background(), link.Spec{
			ContainerID: "hostrouting-test-" + string(rune('a'+i)), NetnsPath: pod.Path(),
			IPv4: ip.AsSlice(), Gateway: router.AsSlice(),
		})
		if err != nil {
			t.Fatal(err)
		}
		pods, res = append(pods, pod), append(res, r)
	}

	var (
		db    *statedb.DB
		eps   statedb.RWTable[*endpoints.Endpoint]
		local statedb.RWTable[*nodes.LocalNode]
		rts   statedb.Table[*routes.Route]
		devs  statedb.Table[*routes.Device]
		scs   statedb.Table[*routes.Sysctl]
	)
	hivetest.Start(t, nil,
		// Stand-ins for the endpoint manager's and node discovery's tables.
		hive.Provide(endpoints.NewTable, nodes.NewLocalNodeTable,
			statedb.RWTable[*endpoints.Endpoint].ToTable, statedb.RWTable[*nodes.LocalNode].ToTable),
		hostrouting.NewCell(routing.Netns{Path: node.Path()}),
		hivetest.Capture(&db), hivetest.Capture(&eps), hivetest.Capture(&local),
		hivetest.Capture(&rts), hivetest.Capture(&devs), hivetest.Capture(&scs),
	)

	wtxn := db.WriteTxn(eps, local)
	_, _, _ = local.Insert(wtxn, &nodes.LocalNode{Name: "node", RouterIP: router})
	_, _, _ = eps.Insert(wtxn, &endpoints.Endpoint{ID: 1, IPv4: ipA, HostIfName: res[0].HostIfName, State: ciliumv2.EndpointStateReady})
	_, _, _ = eps.Insert(wtxn, &endpoints.Endpoint{ID: 2, IPv4: ipB, HostIfName: res[1].HostIfName, State: ciliumv2.EndpointStateReady})
	wtxn.Commit()

	timeout := time.After(15 * time.Second)
	for {
		txn := db.ReadTxn()
		routeRows, w1 := rts.AllWatch(txn)
		devRows, w2 := devs.AllWatch(txn)
		sysctlRows, w3 := scs.AllWatch(txn)
		done, pending := 0, 0
		for s := range sysctlRows {
			if s.Status.Kind != reconciler.StatusDone {
				pending++
			}
		}
		for r := range routeRows {
			if r.Status.Kind == reconciler.StatusDone {
				done++
			}
		}
		for d := range devRows {
			if d.Status.Kind == reconciler.StatusDone {
				done++
			}
		}
		if done == 3 && pending == 0 {
			break
		}
		select {
		case <-w1:
		case <-w2:
		case <-w3:
		case <-timeout:
			t.Fatalf("routes and cilium_host not reconciled within 15s (%d of 3 rows done, %d sysctls pending)", done, pending)
		}
	}
	if err := privileged.Ping(pods[0], ipB); err != nil {
		t.Errorf("pod A -> pod B: %v", err)
	}
	if _, err := privileged.TCPEcho(pods[0], ipA, pods[1], []byte("pod B to pod A")); err != nil {
		t.Errorf("pod B -> pod A over TCP: %v", err)
	}
	if err := privileged.Ping(pods[1], router); err != nil {
		t.Errorf("pod B -> node: %v", err)
	}
}
