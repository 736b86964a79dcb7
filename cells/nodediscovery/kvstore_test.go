package nodediscovery

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/cilium/statedb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/cellium/cellium/cells/hive/hivetest"
	"github.com/cellium/cellium/cells/kvstore"
	"github.com/cellium/cellium/statedb/nodes"
	"github.com/cellium/cellium/test/harness"
)

// TestIntegrationKVStoreNode publishes the local-node row to a real etcd:
// the key and JSON field names are Cilium's, a change of the row is
// written, an etcd outage longer than the lease is followed by a new
// write, and when the agent is gone the key expires with its lease.
func TestIntegrationKVStoreNode(t *testing.T) {
	if testing.Short() {
		t.Skip("needs etcd")
	}
	e := harness.StartEtcd(t)
	db := statedb.New()
	table, err := nodes.NewLocalNodeTable(db)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := kvstore.EtcdConfig(map[string]string{kvstore.OptAddress: e.URL()})
	if err != nil {
		t.Fatal(err)
	}
	const ttl = 2 * time.Second
	kv := kvstore.NewClient(hivetest.Logger(t), cfg, ttl)
	if err := kv.Start(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{}, 2)
	go func() { kv.RunSession(ctx, hivetest.NopHealth{}); done <- struct{}{} }()
	pub := &kvNodePublisher{kv: kv, db: db, table: table, name: "node-a", cluster: "default", log: hivetest.Logger(t)}
	go func() { pub.run(ctx, hivetest.NopHealth{}); done <- struct{}{} }()
	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			cancel()
			<-done
			<-done
			_ = kv.Close()
		}
	}
	defer stop()

	row := &nodes.LocalNode{
		Name: "node-a", InternalIP: netip.MustParseAddr("192.168.1.10"),
		NodeAddresses: []nodes.Address{{Type: nodes.AddressInternalIP, IP: netip.MustParseAddr("192.168.1.10")}},
		RouterIP:      netip.MustParseAddr("10.0.1.1"),
		PodCIDRs:      []netip.Prefix{netip.MustParsePrefix("10.0.1.0/24")},
		HealthIPv4:    netip.MustParseAddr("10.0.1.7"),
		BootID:        "boot-1",
		Labels:        map[string]string{"kubernetes.io/hostname": "node-a"},
	}
	insert := func(n *nodes.LocalNode) {
		txn := db.WriteTxn(table)
		if _, _, err := table.Insert(txn, n); err != nil {
			t.Fatal(err)
		}
		txn.Commit()
	}
	insert(row)

	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{e.URL()}, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	const key = "cilium/state/nodes/v1/default/node-a"
	read := func() (map[string]any, int64) {
		tctx, c := context.WithTimeout(context.Background(), 5*time.Second)
		defer c()
		resp, err := cli.Get(tctx, key)
		if err != nil || len(resp.Kvs) == 0 {
			return nil, 0
		}
		var m map[string]any
		if err := json.Unmarshal(resp.Kvs[0].Value, &m); err != nil {
			t.Fatalf("node key is not JSON: %v", err)
		}
		return m, resp.Kvs[0].Lease
	}
	waitFor := func(what string, cond func(map[string]any, int64) error) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for {
			m, lease := read()
			err := cond(m, lease)
			if err == nil {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: %v (key %v)", what, err, m)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	var firstLease int64
	waitFor("node key written", func(m map[string]any, lease int64) error {
		if m == nil {
			return fmt.Errorf("no key")
		}
		firstLease = lease
		return nil
	})
	m, _ := read()
	addrs, _ := json.Marshal(m["IPAddresses"])
	if m["Name"] != "node-a" || m["Cluster"] != "default" || m["BootID"] != "boot-1" || m["IPv4HealthIP"] != "10.0.1.7" ||
		string(addrs) != `[{"IP":"192.168.1.10","Type":"InternalIP"},{"IP":"10.0.1.1","Type":"CiliumInternalIP"}]` {
		t.Errorf("node JSON: %v (addresses %s)", m, addrs)
	}
	cidr, _ := json.Marshal(m["IPv4AllocCIDR"])
	if string(cidr) != `{"IP":"10.0.1.0","Mask":"////AA=="}` {
		t.Errorf("IPv4AllocCIDR %s, want Cilium's cidr.CIDR JSON", cidr)
	}
	if firstLease == 0 {
		t.Error("node key without a lease")
	}

	// A change of the row is written.
	row2 := *row
	row2.BootID = "boot-2"
	insert(&row2)
	waitFor("row change written", func(m map[string]any, _ int64) error {
		if m["BootID"] != "boot-2" {
			return fmt.Errorf("BootID %v", m["BootID"])
		}
		return nil
	})

	// etcd down for longer than the lease: the key comes back with the
	// new lease.
	if err := e.Stop(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * ttl)
	if err := e.Start(); err != nil {
		t.Fatal(err)
	}
	waitFor("node key re-written with a new lease", func(m map[string]any, lease int64) error {
		if m == nil || lease == firstLease {
			return fmt.Errorf("lease %x (first %x)", lease, firstLease)
		}
		return nil
	})

	// The agent goes away (its lease is not revoked): the key expires.
	stop()
	waitFor("node key expired with the lease", func(m map[string]any, _ int64) error {
		if m != nil {
			return fmt.Errorf("still there")
		}
		return nil
	})
}
