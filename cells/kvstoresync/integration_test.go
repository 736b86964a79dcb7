package kvstoresync

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/cilium/statedb"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	clientv3 "go.etcd.io/etcd/client/v3"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/cells/hive/hivetest"
	"github.com/cellium/cellium/cells/identity"
	ipcachecell "github.com/cellium/cellium/cells/ipcache"
	"github.com/cellium/cellium/cells/k8s"
	"github.com/cellium/cellium/cells/kvstore"
	"github.com/cellium/cellium/statedb/endpoints"
	statedbid "github.com/cellium/cellium/statedb/identity"
	"github.com/cellium/cellium/statedb/ipcache"
	k8stables "github.com/cellium/cellium/statedb/k8s"
	kvtables "github.com/cellium/cellium/statedb/kvstore"
	"github.com/cellium/cellium/statedb/nodes"
	"github.com/cellium/cellium/statedb/policy"
	"github.com/cellium/cellium/statedb/tables"
	"github.com/cellium/cellium/test/harness"
)

// agent is one agent's partial hive: the kvstore client (with a short
// lease), this cell, the ipcache cell, and stand-ins for their input
// tables.
type agent struct {
	name  string
	h     *hive.Hive
	db    *statedb.DB
	eps   statedb.RWTable[*endpoints.Endpoint]
	ceps  statedb.RWTable[*ciliumv2.CiliumEndpoint]
	ids   statedb.RWTable[*ciliumv2.CiliumIdentity]
	ipc   statedb.Table[*ipcache.Entry]
	nodes statedb.RWTable[*nodes.Node]
	kvn   statedb.Table[*kvtables.Node]
	kvip  statedb.Table[*kvtables.IPEntry]
	kv    *kvstore.Client
	reg   *prometheus.Registry

	stopOnce sync.Once
}

// startAgent starts the agent of node name with InternalIP nodeIP and
// pod CIDR podCIDR.
func startAgent(t *testing.T, url, name, nodeIP, podCIDR string, ttl time.Duration) *agent {
	t.Helper()
	a := &agent{name: name, reg: prometheus.NewPedanticRegistry()}
	var local statedb.RWTable[*nodes.LocalNode]
	newKV := func(lc hive.Lifecycle, jobs hive.Jobs, log *slog.Logger) (*kvstore.Client, error) {
		cfg, err := kvstore.EtcdConfig(map[string]string{kvstore.OptAddress: url})
		if err != nil {
			return nil, err
		}
		c := kvstore.NewClient(log, cfg, ttl)
		lc.Append(hive.Hook{
			OnStart: func(context.Context) error { return c.Start() },
			OnStop:  func(context.Context) error { return c.Close() },
		})
		jobs.Add(hive.Service("kvstore-session", nil, c.RunSession))
		return c, nil
	}
	a.h = hivetest.New(t, nil,
		hive.Provide(endpoints.NewTable, nodes.NewLocalNodeTable, nodes.NewNodesTable,
			k8stables.NewCiliumEndpointsTable, k8stables.NewCiliumIdentitiesTable, policy.NewCIDRTable,
			statedb.RWTable[*endpoints.Endpoint].ToTable, statedb.RWTable[*nodes.LocalNode].ToTable,
			statedb.RWTable[*nodes.Node].ToTable, statedb.RWTable[*ciliumv2.CiliumEndpoint].ToTable,
			statedb.RWTable[*policy.CIDRIdentity].ToTable, statedb.RWTable[*ciliumv2.CiliumIdentity].ToTable,
			func() k8s.NodeName { return k8s.NodeName(name) },
			func() identity.ClusterName { return "default" },
			func() prometheus.Registerer { return a.reg },
			newKV),
		Cell, ipcachecell.Cell,
		hivetest.Capture(&a.db), hivetest.Capture(&a.eps), hivetest.Capture(&local), hivetest.Capture(&a.ceps),
		hivetest.Capture(&a.ids), hivetest.Capture(&a.ipc), hivetest.Capture(&a.kvn), hivetest.Capture(&a.kvip),
		hivetest.Capture(&a.kv), hivetest.Capture(&a.nodes),
	)
	if err := a.h.Start(context.Background()); err != nil {
		t.Fatalf("start agent %s: %v", name, err)
	}
	t.Cleanup(a.stop)
	ip := netip.MustParseAddr(nodeIP)
	wtxn := a.db.WriteTxn(local)
	_, _, _ = local.Insert(wtxn, &nodes.LocalNode{Name: name, InternalIP: ip,
		NodeAddresses: []nodes.Address{{Type: nodes.AddressInternalIP, IP: ip}},
		PodCIDRs:      []netip.Prefix{netip.MustParsePrefix(podCIDR)},
		RouterIP:      netip.MustParsePrefix(podCIDR).Addr().Next()})
	wtxn.Commit()
	return a
}

// stop stops the hive as a killed agent would leave etcd: the lease is
// not revoked.
func (a *agent) stop() {
	a.stopOnce.Do(func() { _ = a.h.Stop(context.Background()) })
}

func (a *agent) addEndpoint(id uint16, ip string, ident uint32, pod string) {
	wtxn := a.db.WriteTxn(a.eps)
	_, _, _ = a.eps.Insert(wtxn, &endpoints.Endpoint{ID: id, IPv4: netip.MustParseAddr(ip), Identity: statedbid.NumericIdentity(ident),
		PodNamespace: "default", PodName: pod, CEPNamespace: "default", CEPName: pod})
	wtxn.Commit()
}

func (a *agent) removeEndpoint(id uint16) {
	wtxn := a.db.WriteTxn(a.eps)
	_, _, _ = a.eps.Delete(wtxn, &endpoints.Endpoint{ID: id})
	wtxn.Commit()
}

// row returns the ipcache row of ip.
func (a *agent) row(ip string) (*ipcache.Entry, bool) {
	p := netip.PrefixFrom(netip.MustParseAddr(ip), 32)
	e, _, ok := a.ipc.Get(a.db.ReadTxn(), ipcache.PrefixIndex.Query(p))
	return e, ok
}

// waitFor polls cond for up to d.
func waitFor(t *testing.T, d time.Duration, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(d)
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

// hasRow is a condition: ip's row has identity id, source kvstore and
// host IP host.
func (a *agent) hasRow(ip string, id uint32, host string) func() error {
	return func() error {
		e, ok := a.row(ip)
		if !ok {
			return fmt.Errorf("agent %s: no ipcache row of %s", a.name, ip)
		}
		if uint32(e.Identity) != id || e.Source != ipcache.SourceKVStore || e.HostIP != netip.MustParseAddr(host) {
			return fmt.Errorf("agent %s: row of %s is %+v, want identity %d, source kvstore, host %s", a.name, ip, e, id, host)
		}
		return nil
	}
}

func (a *agent) noRow(ip string) func() error {
	return func() error {
		if e, ok := a.row(ip); ok {
			return fmt.Errorf("agent %s: %s still has a row: %+v", a.name, ip, e)
		}
		return nil
	}
}

func etcdClient(t *testing.T, url string) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{url}, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	return cli
}

func put(t *testing.T, cli *clientv3.Client, key, val string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := cli.Put(ctx, key, val); err != nil {
		t.Fatalf("put %s: %v", key, err)
	}
}

func get(t *testing.T, cli *clientv3.Client, key string) (string, int64, bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := cli.Get(ctx, key)
	if err != nil {
		t.Fatalf("get %s: %v", key, err)
	}
	if len(resp.Kvs) == 0 {
		return "", 0, false
	}
	return string(resp.Kvs[0].Value), resp.Kvs[0].Lease, true
}

// TestIntegrationIPCacheThroughEtcd runs two agents' hives on one real
// etcd: agent A's endpoint reaches agent B's ipcache table through its
// key (Cilium's layout and JSON), with the right identity and host IP,
// wins over a CiliumEndpoint of the same address, and goes when the
// endpoint goes; keys with garbage are ignored, counted, and disturb
// nothing; an etcd outage keeps B's entries, a lost lease has A write its
// keys again; and when A is killed its keys expire with its lease and
// leave B's ipcache.
func TestIntegrationIPCacheThroughEtcd(t *testing.T) {
	if testing.Short() {
		t.Skip("needs etcd")
	}
	e := harness.StartEtcd(t)
	cli := etcdClient(t, e.URL())
	const ttl = 3 * time.Second
	// A key a previous run of A left behind for a pod that is gone.
	const staleKey = "cilium/state/ip/v1/default/10.1.0.99"
	put(t, cli, staleKey, `{"IP":"10.1.0.99","HostIP":"192.168.10.1","ID":40009,"Metadata":"cilium-global:default:node-a:99"}`)
	a := startAgent(t, e.URL(), "node-a", "192.168.10.1", "10.1.0.0/24", ttl)
	b := startAgent(t, e.URL(), "node-b", "192.168.10.2", "10.2.0.0/24", ttl)

	// A's endpoint: its key, Cilium's JSON, then B's row.
	a.addEndpoint(12, "10.1.0.12", 40000, "web-1")
	const keyA = "cilium/state/ip/v1/default/10.1.0.12"
	waitFor(t, 20*time.Second, "A writes its endpoint's key", func() error {
		v, lease, ok := get(t, cli, keyA)
		if !ok {
			return fmt.Errorf("no key %s", keyA)
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(v), &m); err != nil {
			return err
		}
		for _, f := range []string{"IP", "Mask", "HostIP", "ID", "Key", "Metadata", "K8sNamespace", "K8sPodName"} {
			if _, ok := m[f]; !ok {
				return fmt.Errorf("value %s has no field %s", v, f)
			}
		}
		if m["IP"] != "10.1.0.12" || m["HostIP"] != "192.168.10.1" || m["ID"] != float64(40000) ||
			m["Metadata"] != "cilium-global:default:node-a:12" || m["K8sPodName"] != "web-1" || m["Mask"] != nil {
			return fmt.Errorf("value %s", v)
		}
		if lease == 0 {
			return fmt.Errorf("key %s has no lease", keyA)
		}
		return nil
	})
	waitFor(t, 20*time.Second, "A's endpoint in B's ipcache", b.hasRow("10.1.0.12", 40000, "192.168.10.1"))
	waitFor(t, 20*time.Second, "A deletes the key its previous run left", func() error {
		if _, _, ok := get(t, cli, staleKey); ok {
			return fmt.Errorf("%s still there", staleKey)
		}
		return nil
	})
	waitFor(t, 20*time.Second, "B drops the stale key's row", b.noRow("10.1.0.99"))
	// A's own ipcache keeps its endpoint as an endpoint, not a kvstore entry.
	if r, ok := a.row("10.1.0.12"); ok && r.Source == ipcache.SourceKVStore {
		t.Errorf("A's own endpoint came back from etcd into A's ipcache: %+v", r)
	}

	// A CiliumEndpoint of the same address with another identity: the
	// kvstore wins (Cilium's kvstore over custom-resource).
	// (B knows node-a and the CEP's identity, so that the CEP passes
	// the ipcache's checks.)
	wtxn := b.db.WriteTxn(b.ceps, b.ids, b.nodes)
	_, _, _ = b.nodes.Insert(wtxn, &nodes.Node{Name: "node-a", PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.1.0.0/24")},
		Addresses: []nodes.Address{{Type: nodes.AddressInternalIP, IP: netip.MustParseAddr("192.168.10.1")}}})
	_, _, _ = b.ids.Insert(wtxn, &ciliumv2.CiliumIdentity{ObjectMeta: metav1.ObjectMeta{Name: "40001"},
		SecurityLabels: map[string]string{"k8s:app": "x", "k8s:io.kubernetes.pod.namespace": "default"}})
	_, _, _ = b.ceps.Insert(wtxn, &ciliumv2.CiliumEndpoint{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web-1"},
		Status: ciliumv2.EndpointStatus{Identity: &ciliumv2.EndpointIdentity{ID: 40001},
			Networking: &ciliumv2.EndpointNetworking{NodeIP: "192.168.10.1",
				Addressing: ciliumv2.AddressPairList{{IPV4: "10.1.0.12"}}}}})
	wtxn.Commit()
	time.Sleep(300 * time.Millisecond)
	if err := b.hasRow("10.1.0.12", 40000, "192.168.10.1")(); err != nil {
		t.Errorf("with a CEP of the same address: %v", err)
	}

	// Garbage under the prefixes, written by someone else.
	garbage := map[string]string{
		"cilium/state/ip/v1/default/10.9.0.1": "not json",
		"cilium/state/ip/v1/default/10.9.0.2": `{"IP":"10.9.0.99","HostIP":"192.168.10.9","ID":5000}`,
		"cilium/state/ip/v1/default/10.9.0.3": `{"IP":"10.9.0.3","HostIP":"192.168.10.9","ID":0}`,
		"cilium/state/ip/v1/default/bogus":    `{"IP":"bogus","ID":5000}`,
		"cilium/state/nodes/v1/default/evil":  `{"Name":"other","Cluster":"default"}`,
		"cilium/state/nodes/v1/default/junk":  `[1,2`,
	}
	for k, v := range garbage {
		put(t, cli, k, v)
	}
	// The nodes' keys (node-a's as its publisher writes it; B's own,
	// which B leaves out).
	for _, n := range []kvstore.NodeJSON{
		{Name: "node-a", Cluster: "default", IPAddresses: []kvstore.NodeAddressJSON{{Type: "InternalIP", IP: net.ParseIP("192.168.10.1")}}},
		{Name: "node-b", Cluster: "default", IPAddresses: []kvstore.NodeAddressJSON{{Type: "InternalIP", IP: net.ParseIP("192.168.10.2")}}},
	} {
		v, _ := json.Marshal(n)
		put(t, cli, kvstore.NodeKey(n.Cluster, n.Name), string(v))
	}
	// A valid key after the garbage: once it is in, the garbage was read.
	put(t, cli, "cilium/state/ip/v1/default/10.9.0.4", `{"IP":"10.9.0.4","Mask":null,"HostIP":"192.168.10.9","ID":5001,"Key":0,"Metadata":""}`)
	waitFor(t, 20*time.Second, "a valid key written by hand in B's ipcache", b.hasRow("10.9.0.4", 5001, "192.168.10.9"))
	waitFor(t, 20*time.Second, "node-a in B's kvstore-nodes", func() error {
		if _, _, ok := b.kvn.Get(b.db.ReadTxn(), kvtables.NodeNameIndex.Query("node-a")); !ok {
			return fmt.Errorf("no node-a")
		}
		return nil
	})
	for _, ip := range []string{"10.9.0.1", "10.9.0.2", "10.9.0.3", "10.9.0.99"} {
		if err := b.noRow(ip)(); err != nil {
			t.Errorf("garbage key: %v", err)
		}
	}
	if err := b.hasRow("10.1.0.12", 40000, "192.168.10.1")(); err != nil {
		t.Errorf("after garbage: %v", err)
	}
	if n := b.kvn.NumObjects(b.db.ReadTxn()); n != 1 {
		t.Errorf("B's kvstore-nodes table has %d rows, want 1 (node-a; garbage and B's own left out)", n)
	}
	waitFor(t, 10*time.Second, "garbage counted", func() error {
		ip := testutil.ToFloat64(b.invalid("ip"))
		nd := testutil.ToFloat64(b.invalid("nodes"))
		if ip != 4 || nd != 2 {
			return fmt.Errorf("cellium_kvstore_invalid_keys_total ip=%v nodes=%v, want 4 and 2", ip, nd)
		}
		return nil
	})
	// Garbage over a valid key takes its row away, not others.
	put(t, cli, "cilium/state/ip/v1/default/10.9.0.4", `{"IP":"10.9.0.4","ID":"x"}`)
	waitFor(t, 20*time.Second, "a key turned garbage leaves", b.noRow("10.9.0.4"))
	if err := b.hasRow("10.1.0.12", 40000, "192.168.10.1")(); err != nil {
		t.Errorf("after a key turned garbage: %v", err)
	}

	// etcd gone for longer than the lease TTL (3 TTLs, or
	// $CELLIUM_KVSTORE_OUTAGE, e.g. 60s): B keeps what it has.
	outage := 3 * ttl
	if s := os.Getenv("CELLIUM_KVSTORE_OUTAGE"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil {
			t.Fatalf("CELLIUM_KVSTORE_OUTAGE: %v", err)
		}
		outage = d
	}
	if err := e.Stop(); err != nil {
		t.Fatal(err)
	}
	t.Logf("etcd stopped for %s", outage)
	for deadline := time.Now().Add(outage); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		if err := b.hasRow("10.1.0.12", 40000, "192.168.10.1")(); err != nil {
			t.Fatalf("etcd down: %v", err)
		}
	}
	if err := e.Start(); err != nil {
		t.Fatal(err)
	}
	// Back: a new endpoint of A travels again; the old one is still there.
	a.addEndpoint(13, "10.1.0.13", 40002, "web-2")
	waitFor(t, 30*time.Second, "after the outage, A's new endpoint in B", b.hasRow("10.1.0.13", 40002, "192.168.10.1"))
	waitFor(t, 30*time.Second, "after the outage, A's first endpoint in B", b.hasRow("10.1.0.12", 40000, "192.168.10.1"))

	// A's lease lost (revoked as its expiry would): its keys go, B drops
	// them, A gets a new lease and writes them again, B has them again.
	_, leaseBefore, _ := get(t, cli, keyA)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	if _, err := cli.Revoke(ctx, clientv3.LeaseID(leaseBefore)); err != nil {
		t.Fatalf("revoke A's lease: %v", err)
	}
	cancel()
	waitFor(t, 30*time.Second, "A writes its keys again with a new lease", func() error {
		_, lease, ok := get(t, cli, keyA)
		if !ok || lease == leaseBefore || lease == 0 {
			return fmt.Errorf("key %s: present %v, lease %x (was %x)", keyA, ok, lease, leaseBefore)
		}
		if _, l2, ok := get(t, cli, "cilium/state/ip/v1/default/10.1.0.13"); !ok || l2 != lease {
			return fmt.Errorf("second key: present %v, lease %x", ok, l2)
		}
		return nil
	})
	waitFor(t, 20*time.Second, "B has A's endpoints again", b.hasRow("10.1.0.12", 40000, "192.168.10.1"))

	// Someone deletes A's key: A writes it again.
	ctx, cancel = context.WithTimeout(context.Background(), 10*time.Second)
	if _, err := cli.Delete(ctx, keyA); err != nil {
		t.Fatal(err)
	}
	cancel()
	waitFor(t, 20*time.Second, "A writes a deleted key again", func() error {
		if _, _, ok := get(t, cli, keyA); !ok {
			return fmt.Errorf("no key %s", keyA)
		}
		return nil
	})

	// The endpoint goes: its key and B's row go.
	a.removeEndpoint(13)
	waitFor(t, 20*time.Second, "A deletes the key of a gone endpoint", func() error {
		if _, _, ok := get(t, cli, "cilium/state/ip/v1/default/10.1.0.13"); ok {
			return fmt.Errorf("key of 10.1.0.13 still there")
		}
		return nil
	})
	waitFor(t, 20*time.Second, "B drops the gone endpoint", b.noRow("10.1.0.13"))

	// A killed: after its lease TTL its key expires, and B drops the row
	// (the CEP of that address, which lost to the key, takes over).
	a.stop()
	start := time.Now()
	waitFor(t, 4*ttl+10*time.Second, "A's keys expire", func() error {
		if _, _, ok := get(t, cli, keyA); ok {
			return fmt.Errorf("key %s still there %s after A stopped", keyA, time.Since(start).Round(time.Millisecond))
		}
		return nil
	})
	waitFor(t, 20*time.Second, "B's row of A's endpoint falls back to the CEP", func() error {
		r, ok := b.row("10.1.0.12")
		if !ok || r.Source != ipcache.SourceCiliumEndpoint || r.Identity != 40001 {
			return fmt.Errorf("row %+v (found %v), want the CEP's (identity 40001)", r, ok)
		}
		return nil
	})
	t.Logf("A's key expired %s after A stopped (lease TTL %s)", time.Since(start).Round(time.Millisecond), ttl)
}

// invalid is the garbage counter of prefix.
func (a *agent) invalid(prefix string) prometheus.Collector {
	mfs, _ := a.reg.Gather()
	for _, mf := range mfs {
		if mf.GetName() != "cellium_kvstore_invalid_keys_total" {
			continue
		}
		for _, m := range mf.Metric {
			for _, l := range m.Label {
				if l.GetName() == "prefix" && l.GetValue() == prefix {
					c := prometheus.NewCounter(prometheus.CounterOpts{Name: "x"})
					c.Add(m.GetCounter().GetValue())
					return c
				}
			}
		}
	}
	return prometheus.NewCounter(prometheus.CounterOpts{Name: "x"})
}

// A list after missed events (what follows a failed watch, e.g. a
// compacted revision) makes the table equal to etcd: rows of keys
// deleted meanwhile go, new and changed keys come in, garbage stays out
// and is not warned about twice.
func TestIntegrationMirrorRelist(t *testing.T) {
	if testing.Short() {
		t.Skip("needs etcd")
	}
	e := harness.StartEtcd(t)
	cli := etcdClient(t, e.URL())
	db := statedb.New()
	tbl, err := kvtables.NewIPCacheTable(db)
	if err != nil {
		t.Fatal(err)
	}
	wtxn := db.WriteTxn(tbl)
	gate := tables.NewInitGate(tbl.RegisterInitializer(wtxn, "test"))
	wtxn.Commit()
	invalid := 0
	m := &mirror[*kvtables.IPEntry]{name: "ip", prefix: kvstore.IPKeysPrefix, etcd: cli, db: db, table: tbl,
		parse: func(key string, v []byte, rev int64) (*kvtables.IPEntry, bool, error) {
			e, err := ParseIPEntry(key, v, rev)
			return e, err == nil, err
		},
		invalid: func() { invalid++ }, log: hivetest.Logger(t), init: gate,
		rows: map[string]*kvtables.IPEntry{}, bad: map[string]int64{}}
	val := func(ip string, id int) string {
		return fmt.Sprintf(`{"IP":%q,"HostIP":"192.168.0.9","ID":%d}`, ip, id)
	}
	put(t, cli, kvstore.IPKeysPrefix+"10.0.0.1", val("10.0.0.1", 1000))
	put(t, cli, kvstore.IPKeysPrefix+"10.0.0.2", val("10.0.0.2", 1001))
	put(t, cli, kvstore.IPKeysPrefix+"10.0.0.3", "garbage")
	ctx := context.Background()
	if _, err := m.list(ctx); err != nil {
		t.Fatal(err)
	}
	if n := tbl.NumObjects(db.ReadTxn()); n != 2 || invalid != 1 {
		t.Fatalf("first list: %d rows, %d invalid; want 2 and 1", n, invalid)
	}
	if init, _ := tbl.Initialized(db.ReadTxn()); !init {
		t.Error("table not initialized by the first list")
	}
	if _, err := cli.Delete(ctx, kvstore.IPKeysPrefix+"10.0.0.1"); err != nil {
		t.Fatal(err)
	}
	put(t, cli, kvstore.IPKeysPrefix+"10.0.0.2", val("10.0.0.2", 2002))
	put(t, cli, kvstore.IPKeysPrefix+"10.0.0.4", val("10.0.0.4", 1004))
	if _, err := m.list(ctx); err != nil {
		t.Fatal(err)
	}
	got := map[string]uint32{}
	for r := range tbl.All(db.ReadTxn()) {
		got[r.Prefix.Addr().String()] = uint32(r.Identity)
	}
	if len(got) != 2 || got["10.0.0.2"] != 2002 || got["10.0.0.4"] != 1004 || invalid != 1 {
		t.Errorf("after the second list: rows %v, %d invalid; want 10.0.0.2=2002, 10.0.0.4=1004, 1 invalid", got, invalid)
	}
}
