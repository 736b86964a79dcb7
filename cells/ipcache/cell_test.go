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
