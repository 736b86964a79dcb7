package ipcache

import (
	"testing"
	"time"

	"github.com/cilium/statedb"
	"go.uber.org/goleak"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/cells/hive/hivetest"
	"github.com/cellium/cellium/statedb/endpoints"
	"github.com/cellium/cellium/statedb/ipcache"
	"github.com/cellium/cellium/statedb/lb"
	k8stables "github.com/cellium/cellium/statedb/k8s"
	"github.com/cellium/cellium/statedb/nodes"
	"github.com/cellium/cellium/statedb/policy"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The cell, in a hive with stand-ins for its input tables, derives rows as
// inputs change and marks the table initialized.
func TestCellDerives(t *testing.T) {
	var (
		db    *statedb.DB
		eps   statedb.RWTable[*endpoints.Endpoint]
		local statedb.RWTable[*nodes.LocalNode]
		ipc   statedb.Table[*ipcache.Entry]
		st    ipcache.StatusTable
	)
	hivetest.Start(t, nil,
		hive.Provide(endpoints.NewTable, nodes.NewLocalNodeTable, nodes.NewNodesTable,
			k8stables.NewCiliumEndpointsTable, policy.NewCIDRTable,
			statedb.RWTable[*endpoints.Endpoint].ToTable, statedb.RWTable[*nodes.LocalNode].ToTable,
			statedb.RWTable[*nodes.Node].ToTable, statedb.RWTable[*ciliumv2.CiliumEndpoint].ToTable,
			statedb.RWTable[*policy.CIDRIdentity].ToTable),
		Cell,
		hivetest.Capture(&db), hivetest.Capture(&eps), hivetest.Capture(&local),
		hivetest.Capture(&ipc), hivetest.Capture(&st),
	)
	if st.RWTable == nil {
		t.Fatal("no StatusTable provided")
	}
	wtxn := db.WriteTxn(eps, local)
	_, _, _ = local.Insert(wtxn, &nodes.LocalNode{Name: "n1", InternalIP: addr("192.168.0.1"), RouterIP: addr("10.1.0.1")})
	_, _, _ = eps.Insert(wtxn, &endpoints.Endpoint{ID: 3, IPv4: addr("10.1.0.3"), Identity: 4242})
	wtxn.Commit()

	timeout := time.After(10 * time.Second)
	for {
		txn := db.ReadTxn()
		_, watch := ipc.AllWatch(txn)
		e, _, ok := ipc.Get(txn, ipcache.PrefixIndex.Query(pfx("10.1.0.3/32")))
		init, initWatch := ipc.Initialized(txn)
		if ok && e.Identity == 4242 && init && ipc.NumObjects(txn) == 3 {
			return
		}
		select {
		case <-watch:
		case <-initWatch:
		case <-timeout:
			t.Fatalf("ipcache not derived within 10s: %d rows, initialized %v", ipc.NumObjects(txn), init)
		}
	}
}

// With the socket load balancer on (lb.SocketLB from its cell), a
// frontend in lb-frontends gives a marked world row, and its removal
// removes it; off, or without the socket LB's cell at all (no BPF
// datapath), the same frontend gives none.
func TestCellServiceFrontends(t *testing.T) {
	for _, c := range []struct {
		name      string
		socketLB  hive.Cell
		wantGuard bool
	}{
		{"on", hive.Provide(func() lb.SocketLB { return lb.SocketLB{Enabled: true} }), true},
		{"off", hive.Provide(func() lb.SocketLB { return lb.SocketLB{} }), false},
		{"absent", hive.Group(), false},
	} {
		t.Run(c.name, func(t *testing.T) {
			var (
				db    *statedb.DB
				eps   statedb.RWTable[*endpoints.Endpoint]
				local statedb.RWTable[*nodes.LocalNode]
				fes   statedb.RWTable[*lb.Frontend]
				ipc   statedb.Table[*ipcache.Entry]
			)
			hivetest.Start(t, nil,
				hive.Provide(endpoints.NewTable, nodes.NewLocalNodeTable, nodes.NewNodesTable,
					k8stables.NewCiliumEndpointsTable, policy.NewCIDRTable, lb.NewFrontendsTable,
					statedb.RWTable[*endpoints.Endpoint].ToTable, statedb.RWTable[*nodes.LocalNode].ToTable,
					statedb.RWTable[*nodes.Node].ToTable, statedb.RWTable[*ciliumv2.CiliumEndpoint].ToTable,
					statedb.RWTable[*policy.CIDRIdentity].ToTable, statedb.RWTable[*lb.Frontend].ToTable),
				c.socketLB,
				Cell,
				hivetest.Capture(&db), hivetest.Capture(&eps), hivetest.Capture(&local), hivetest.Capture(&fes),
				hivetest.Capture(&ipc),
			)
			vip := pfx("10.96.0.10/32")
			// waitEndpoint waits for the row of endpoint 3 with identity
			// id: written in the same transaction as the frontend
			// change, it proves the deriver has seen that change.
			waitEndpoint := func(id uint32) statedb.ReadTxn {
				t.Helper()
				timeout := time.After(10 * time.Second)
				for {
					txn := db.ReadTxn()
					_, watch := ipc.AllWatch(txn)
					if e, _, ok := ipc.Get(txn, ipcache.PrefixIndex.Query(pfx("10.1.0.3/32"))); ok && uint32(e.Identity) == id {
						return txn
					}
					select {
					case <-watch:
					case <-timeout:
						t.Fatalf("endpoint 3 with identity %d not derived within 10s", id)
					}
				}
			}
			wtxn := db.WriteTxn(eps, local, fes)
			_, _, _ = local.Insert(wtxn, &nodes.LocalNode{Name: "n1", InternalIP: addr("192.168.0.1"), RouterIP: addr("10.1.0.1")})
			_, _, _ = eps.Insert(wtxn, &endpoints.Endpoint{ID: 3, IPv4: addr("10.1.0.3"), Identity: 4242})
			_, _, _ = fes.Insert(wtxn, &lb.Frontend{Address: lb.L4Addr{Addr: vip.Addr(), Port: 53, Proto: lb.UDP}, Service: "kube-system/kube-dns"})
			wtxn.Commit()
			txn := waitEndpoint(4242)
			e, _, ok := ipc.Get(txn, ipcache.PrefixIndex.Query(vip))
			if c.wantGuard {
				if !ok || !e.ServiceFrontend || e.Identity != 2 || e.Source != ipcache.SourceServiceFrontend {
					t.Fatalf("%s: %+v, %v; want a world row marked ServiceFrontend", vip, e, ok)
				}
			} else if ok {
				t.Fatalf("%s: %+v with the socket LB %s, want no row", vip, *e, c.name)
			}

			wtxn = db.WriteTxn(eps, fes)
			_, _, _ = fes.Delete(wtxn, &lb.Frontend{Address: lb.L4Addr{Addr: vip.Addr(), Port: 53, Proto: lb.UDP}})
			_, _, _ = eps.Insert(wtxn, &endpoints.Endpoint{ID: 3, IPv4: addr("10.1.0.3"), Identity: 4243})
			wtxn.Commit()
			txn = waitEndpoint(4243)
			if e, _, ok := ipc.Get(txn, ipcache.PrefixIndex.Query(vip)); ok {
				t.Errorf("%s after its frontend's removal: %+v, want no row", vip, *e)
			}
		})
	}
}
