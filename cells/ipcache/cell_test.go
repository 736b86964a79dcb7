package ipcache

import (
	"net/netip"
	"testing"
	"time"

	"github.com/cilium/statedb"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/cells/hive/hivetest"
	"github.com/cellium/cellium/statedb/endpoints"
	"github.com/cellium/cellium/statedb/ipcache"
	k8stables "github.com/cellium/cellium/statedb/k8s"
	"github.com/cellium/cellium/statedb/lb"
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
			k8stables.NewCiliumEndpointsTable, k8stables.NewCiliumIdentitiesTable, policy.NewCIDRTable,
			statedb.RWTable[*endpoints.Endpoint].ToTable, statedb.RWTable[*nodes.LocalNode].ToTable,
			statedb.RWTable[*nodes.Node].ToTable, statedb.RWTable[*ciliumv2.CiliumEndpoint].ToTable,
			statedb.RWTable[*policy.CIDRIdentity].ToTable, statedb.RWTable[*ciliumv2.CiliumIdentity].ToTable),
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

// The cell, in a hive with stand-ins for its input tables and a metrics
// registry, is fed CiliumEndpoints that claim remote addresses with a
// reserved identity, an unknown identity, another namespace's identity,
// a node nobody knows and an address outside their node's pod CIDR, and
// then an honest one. Once the honest CEP's row is in, none of the others
// has one, and the metrics count one refusal of each reason.
func TestCellRefusesUntrustedCEPs(t *testing.T) {
	var (
		db    *statedb.DB
		local statedb.RWTable[*nodes.LocalNode]
		nds   statedb.RWTable[*nodes.Node]
		ceps  statedb.RWTable[*ciliumv2.CiliumEndpoint]
		ids   statedb.RWTable[*ciliumv2.CiliumIdentity]
		ipc   statedb.Table[*ipcache.Entry]
	)
	reg := prometheus.NewPedanticRegistry()
	hivetest.Start(t, nil,
		hive.Provide(endpoints.NewTable, nodes.NewLocalNodeTable, nodes.NewNodesTable,
			k8stables.NewCiliumEndpointsTable, k8stables.NewCiliumIdentitiesTable, policy.NewCIDRTable,
			statedb.RWTable[*endpoints.Endpoint].ToTable, statedb.RWTable[*nodes.LocalNode].ToTable,
			statedb.RWTable[*nodes.Node].ToTable, statedb.RWTable[*ciliumv2.CiliumEndpoint].ToTable,
			statedb.RWTable[*policy.CIDRIdentity].ToTable, statedb.RWTable[*ciliumv2.CiliumIdentity].ToTable,
			func() prometheus.Registerer { return reg }),
		Cell,
		hivetest.Capture(&db), hivetest.Capture(&local), hivetest.Capture(&nds), hivetest.Capture(&ceps),
		hivetest.Capture(&ids), hivetest.Capture(&ipc),
	)
	wtxn := db.WriteTxn(local, nds, ids, ceps)
	_, _, _ = local.Insert(wtxn, &nodes.LocalNode{Name: "n1", InternalIP: addr("192.168.0.1"), RouterIP: addr("10.1.0.1"),
		PodCIDRs: []netip.Prefix{pfx("10.1.0.0/24")}})
	_, _, _ = nds.Insert(wtxn, &nodes.Node{Name: "n2", PodCIDRs: []netip.Prefix{pfx("10.2.0.0/24")},
		Addresses: []nodes.Address{{Type: nodes.AddressInternalIP, IP: addr("192.168.0.2")}}})
	_, _, _ = ids.Insert(wtxn, cid(2000, "default"))
	_, _, _ = ids.Insert(wtxn, cid(3000, "kube-system"))
	bad := map[string]*ciliumv2.CiliumEndpoint{
		"10.2.0.20/32":   cep("default", "as-host", "192.168.0.2", 1, "10.2.0.20"),
		"10.2.0.21/32":   cep("default", "ghost", "192.168.0.2", 4242, "10.2.0.21"),
		"10.2.0.22/32":   cep("default", "as-dns", "192.168.0.2", 3000, "10.2.0.22"),
		"10.2.0.23/32":   cep("default", "no-node", "192.168.0.99", 2000, "10.2.0.23"),
		"203.0.113.7/32": cep("default", "outside", "192.168.0.2", 2000, "203.0.113.7"),
	}
	for _, c := range bad {
		_, _, _ = ceps.Insert(wtxn, c)
	}
	wtxn.Commit()
	wtxn = db.WriteTxn(ceps)
	_, _, _ = ceps.Insert(wtxn, cep("default", "web", "192.168.0.2", 2000, "10.2.0.9"))
	wtxn.Commit()

	timeout := time.After(10 * time.Second)
	for {
		txn := db.ReadTxn()
		_, watch := ipc.AllWatch(txn)
		if e, _, ok := ipc.Get(txn, ipcache.PrefixIndex.Query(pfx("10.2.0.9/32"))); ok && e.Identity == 2000 {
			break
		}
		select {
		case <-watch:
		case <-timeout:
			t.Fatal("the honest CEP's row did not appear within 10s")
		}
	}
	txn := db.ReadTxn()
	for p, c := range bad {
		if e, _, ok := ipc.Get(txn, ipcache.PrefixIndex.Query(pfx(p))); ok {
			t.Errorf("%s: row %+v from the untrusted CEP %s/%s", p, *e, c.Namespace, c.Name)
		}
	}

	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	refused := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "cellium_ipcache_cep_refused" {
			continue
		}
		for _, m := range mf.GetMetric() {
			refused[m.GetLabel()[0].GetValue()] = m.GetGauge().GetValue()
		}
	}
	for _, why := range Refusals {
		if refused[string(why)] != 1 {
			t.Errorf("cellium_ipcache_cep_refused{reason=%q} = %v, want 1", why, refused[string(why)])
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
					k8stables.NewCiliumEndpointsTable, k8stables.NewCiliumIdentitiesTable, policy.NewCIDRTable, lb.NewFrontendsTable,
					statedb.RWTable[*endpoints.Endpoint].ToTable, statedb.RWTable[*nodes.LocalNode].ToTable,
					statedb.RWTable[*nodes.Node].ToTable, statedb.RWTable[*ciliumv2.CiliumEndpoint].ToTable,
					statedb.RWTable[*ciliumv2.CiliumIdentity].ToTable,
					statedb.RWTable[*policy.CIDRIdentity].ToTable, statedb.RWTable[*lb.Frontend].ToTable),
				c.socketLB,
				Cell,
				hivetest.Capture(&db), hivetest.Capture(&eps), hivetest.Capture(&local), hivetest.Capture(&fes),
				hivetest.Capture(&ipc),
			)
			vip := pfx("10.96.0.10/32")
			// waitFor waits until the ipcache holds endpoint 3 with
			// identity id and the VIP's row is as want says (nil: no
			// row). One commit writes the endpoint and the frontend, but
			// the deriver may write their rows in two steps, so the
			// endpoint's row alone does not prove the frontend was seen.
			waitFor := func(id uint32, want func(e *ipcache.Entry, ok bool) bool) (*ipcache.Entry, bool) {
				t.Helper()
				timeout := time.After(10 * time.Second)
				for {
					txn := db.ReadTxn()
					_, watch := ipc.AllWatch(txn)
					ep, _, epOK := ipc.Get(txn, ipcache.PrefixIndex.Query(pfx("10.1.0.3/32")))
					e, _, ok := ipc.Get(txn, ipcache.PrefixIndex.Query(vip))
					if epOK && uint32(ep.Identity) == id && want(e, ok) {
						return e, ok
					}
					select {
					case <-watch:
					case <-timeout:
						return e, ok
					}
				}
			}
			guarded := func(e *ipcache.Entry, ok bool) bool {
				return ok && e.ServiceFrontend && e.Identity == 2 && e.Source == ipcache.SourceServiceFrontend
			}
			absent := func(_ *ipcache.Entry, ok bool) bool { return !ok }
			wtxn := db.WriteTxn(eps, local, fes)
			_, _, _ = local.Insert(wtxn, &nodes.LocalNode{Name: "n1", InternalIP: addr("192.168.0.1"), RouterIP: addr("10.1.0.1")})
			_, _, _ = eps.Insert(wtxn, &endpoints.Endpoint{ID: 3, IPv4: addr("10.1.0.3"), Identity: 4242})
			_, _, _ = fes.Insert(wtxn, &lb.Frontend{Address: lb.L4Addr{Addr: vip.Addr(), Port: 53, Proto: lb.UDP}, Service: "kube-system/kube-dns"})
			wtxn.Commit()
			if c.wantGuard {
				if e, ok := waitFor(4242, guarded); !guarded(e, ok) {
					t.Fatalf("%s: %+v, %v; want a world row marked ServiceFrontend", vip, e, ok)
				}
			} else if e, ok := waitFor(4242, absent); ok {
				t.Fatalf("%s: %+v with the socket LB %s, want no row", vip, *e, c.name)
			}

			wtxn = db.WriteTxn(eps, fes)
			_, _, _ = fes.Delete(wtxn, &lb.Frontend{Address: lb.L4Addr{Addr: vip.Addr(), Port: 53, Proto: lb.UDP}})
			_, _, _ = eps.Insert(wtxn, &endpoints.Endpoint{ID: 3, IPv4: addr("10.1.0.3"), Identity: 4243})
			wtxn.Commit()
			if e, ok := waitFor(4243, absent); ok {
				t.Errorf("%s after its frontend's removal: %+v, want no row", vip, *e)
			}
		})
	}
}
