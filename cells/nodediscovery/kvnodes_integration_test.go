package nodediscovery

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"testing"
	"time"

	"github.com/cilium/statedb"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/cells/hive/hivetest"
	"github.com/cellium/cellium/cells/identity"
	"github.com/cellium/cellium/cells/k8s"
	"github.com/cellium/cellium/cells/kvstore"
	"github.com/cellium/cellium/cells/kvstoresync"
	"github.com/cellium/cellium/statedb/endpoints"
	k8stables "github.com/cellium/cellium/statedb/k8s"
	"github.com/cellium/cellium/statedb/nodes"
	"github.com/cellium/cellium/test/harness"
)

// TestIntegrationRemoteNodesFromEtcd: agent A publishes its node in a
// real etcd; agent B (the kvstoresync cell and the nodes-table job, with
// the real etcd client) gets a row of node-a in its nodes table with
// source kvstore, the key's addresses, pod CIDR and health IP, as if it
// came from a CiliumNode. When node-a also has a CiliumNode, the key
// wins; when A dies, its key expires with its lease and the row falls
// back to the CiliumNode; without either the row goes.
func TestIntegrationRemoteNodesFromEtcd(t *testing.T) {
	if testing.Short() {
		t.Skip("needs etcd")
	}
	e := harness.StartEtcd(t)
	const ttl = 2 * time.Second
	cfg, err := kvstore.EtcdConfig(map[string]string{kvstore.OptAddress: e.URL()})
	if err != nil {
		t.Fatal(err)
	}

	// Agent B.
	var (
		db  *statedb.DB
		cns statedb.RWTable[*ciliumv2.CiliumNode]
		tbl statedb.Table[*nodes.Node]
	)
	newKV := func(lc hive.Lifecycle, jobs hive.Jobs, log *slog.Logger) *kvstore.Client {
		c := kvstore.NewClient(log, cfg, ttl)
		lc.Append(hive.Hook{
			OnStart: func(context.Context) error { return c.Start() },
			OnStop:  func(context.Context) error { return c.Close() },
		})
		jobs.Add(hive.Service("kvstore-session", nil, c.RunSession))
		return c
	}
	hivetest.Start(t, nil,
		hive.Provide(k8stables.NewCiliumNodesTable, statedb.RWTable[*ciliumv2.CiliumNode].ToTable,
			nodes.NewNodesTable, statedb.RWTable[*nodes.Node].ToTable,
			nodes.NewLocalNodeTable, statedb.RWTable[*nodes.LocalNode].ToTable,
			endpoints.NewTable, statedb.RWTable[*endpoints.Endpoint].ToTable,
			func() k8s.NodeName { return "node-b" },
			func() identity.ClusterName { return "default" },
			newKV),
		kvstoresync.Cell,
		hive.Invoke(registerNodesSync),
		hivetest.Capture(&db), hivetest.Capture(&cns), hivetest.Capture(&tbl),
	)

	// Agent A: its node publisher, on a DB of its own.
	adb := statedb.New()
	aTable, err := nodes.NewLocalNodeTable(adb)
	if err != nil {
		t.Fatal(err)
	}
	akv := kvstore.NewClient(hivetest.Logger(t), cfg, ttl)
	if err := akv.Start(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{}, 2)
	go func() { akv.RunSession(ctx, hivetest.NopHealth{}); done <- struct{}{} }()
	pub := &kvNodePublisher{kv: akv, db: adb, table: aTable, name: "node-a", cluster: "default", log: hivetest.Logger(t)}
	go func() { pub.run(ctx, hivetest.NopHealth{}); done <- struct{}{} }()
	aStopped := false
	stopA := func() {
		if !aStopped {
			aStopped = true
			cancel()
			<-done
			<-done
			_ = akv.Close()
		}
	}
	defer stopA()
	wtxn := adb.WriteTxn(aTable)
	_, _, _ = aTable.Insert(wtxn, &nodes.LocalNode{
		Name: "node-a", InternalIP: netip.MustParseAddr("192.168.20.1"),
		NodeAddresses: []nodes.Address{{Type: nodes.AddressInternalIP, IP: netip.MustParseAddr("192.168.20.1")}},
		RouterIP:      netip.MustParseAddr("10.20.1.1"),
		PodCIDRs:      []netip.Prefix{netip.MustParsePrefix("10.20.1.0/24")},
		HealthIPv4:    netip.MustParseAddr("10.20.1.7"),
		BootID:        "boot-a",
	})
	wtxn.Commit()

	row := func(name string) (*nodes.Node, bool) {
		n, _, ok := tbl.Get(db.ReadTxn(), nodes.NodeNameIndex.Query(name))
		return n, ok
	}
	wait := func(what string, cond func() error) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for {
			err := cond()
			if err == nil {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: %v", what, err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	fromKV := func() error {
		n, ok := row("node-a")
		if !ok {
			return fmt.Errorf("no row of node-a")
		}
		ip, _ := n.Address(nodes.AddressInternalIP)
		router, _ := n.Address(nodes.AddressCiliumInternalIP)
		if n.Source != nodes.SourceKVStore || ip != netip.MustParseAddr("192.168.20.1") || router != netip.MustParseAddr("10.20.1.1") ||
			len(n.PodCIDRs) != 1 || n.PodCIDRs[0] != netip.MustParsePrefix("10.20.1.0/24") ||
			n.HealthIPv4 != netip.MustParseAddr("10.20.1.7") || n.BootID != "boot-a" || n.Local {
			return fmt.Errorf("row of node-a: %+v", n)
		}
		return nil
	}
	wait("node-a from etcd in B's nodes table", fromKV)
	if init, _ := tbl.Initialized(db.ReadTxn()); !init {
		t.Error("nodes table not initialized")
	}

	// node-a's CiliumNode (another address, as a stale one might have):
	// the key wins. node-c has only a CiliumNode.
	wtxn = db.WriteTxn(cns)
	_, _, _ = cns.Insert(wtxn, &ciliumv2.CiliumNode{ObjectMeta: metav1.ObjectMeta{Name: "node-a"},
		Spec: ciliumv2.NodeSpec{Addresses: []ciliumv2.NodeAddress{{Type: ciliumv2.NodeInternalIP, IP: "192.168.20.99"}}}})
	_, _, _ = cns.Insert(wtxn, &ciliumv2.CiliumNode{ObjectMeta: metav1.ObjectMeta{Name: "node-c"},
		Spec: ciliumv2.NodeSpec{Addresses: []ciliumv2.NodeAddress{{Type: ciliumv2.NodeInternalIP, IP: "192.168.20.3"}}}})
	wtxn.Commit()
	wait("node-c from its CiliumNode", func() error {
		if n, ok := row("node-c"); !ok || n.Source != nodes.SourceCustomResource {
			return fmt.Errorf("node-c: %+v", n)
		}
		return nil
	})
	if err := fromKV(); err != nil {
		t.Errorf("with a CiliumNode of node-a too, the key must win: %v", err)
	}

	// A dies: its key expires after the lease TTL, and the row is the
	// CiliumNode's again.
	stopA()
	start := time.Now()
	wait("node-a falls back to its CiliumNode", func() error {
		n, ok := row("node-a")
		ip, _ := n.Address(nodes.AddressInternalIP)
		if !ok || n.Source != nodes.SourceCustomResource || ip != netip.MustParseAddr("192.168.20.99") {
			return fmt.Errorf("node-a: %+v", n)
		}
		return nil
	})
	t.Logf("node-a's key expired %s after A stopped (TTL %s)", time.Since(start).Round(time.Millisecond), ttl)
	wtxn = db.WriteTxn(cns)
	_, _, _ = cns.Delete(wtxn, &ciliumv2.CiliumNode{ObjectMeta: metav1.ObjectMeta{Name: "node-a"}})
	wtxn.Commit()
	wait("node-a gone", func() error {
		if n, ok := row("node-a"); ok {
			return fmt.Errorf("node-a still there: %+v", n)
		}
		return nil
	})
}
