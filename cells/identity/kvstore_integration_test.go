package identity

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cilium/statedb"
	clientv3 "go.etcd.io/etcd/client/v3"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/cells/hive/hivetest"
	"github.com/cellium/cellium/cells/k8s"
	"github.com/cellium/cellium/cells/kvstore"
	"github.com/cellium/cellium/statedb/identity"
	k8stables "github.com/cellium/cellium/statedb/k8s"
	"github.com/cellium/cellium/statedb/labels"
	"github.com/cellium/cellium/statedb/nodes"
	"github.com/cellium/cellium/test/harness"
)

// kvAgent is the identity allocator of one agent in kvstore mode against
// a real etcd: the kvstore client (short lease), its local node, the
// CiliumIdentity table fed from etcd, and this cell.
type kvAgent struct {
	h     *hive.Hive
	db    *statedb.DB
	cids  statedb.Table[*ciliumv2.CiliumIdentity]
	alloc Allocator
	ip    string
}

func startKVAgent(t *testing.T, etcdURL, node, ip string, ttl time.Duration) *kvAgent {
	t.Helper()
	ag := &kvAgent{ip: ip}
	ag.h = hivetest.Start(t, []string{"--identity-allocation-mode=kvstore"},
		hive.Provide(func() k8s.Clientset { return k8s.DisabledClientset() }),
		hive.Provide(func() k8s.NodeName { return k8s.NodeName(node) }),
		hive.Provide(func(lc hive.Lifecycle, jobs hive.Jobs, log *slog.Logger) (*kvstore.Client, error) {
			cfg, err := kvstore.EtcdConfig(map[string]string{kvstore.OptAddress: etcdURL})
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
		}),
		hive.Provide(nodes.NewLocalNodeTable, statedb.RWTable[*nodes.LocalNode].ToTable),
		hive.Invoke(func(db *statedb.DB, t statedb.RWTable[*nodes.LocalNode]) error {
			txn := db.WriteTxn(t)
			if _, _, err := t.Insert(txn, &nodes.LocalNode{Name: node, InternalIP: netip.MustParseAddr(ip)}); err != nil {
				return err
			}
			txn.Commit()
			return nil
		}),
		k8s.CiliumIdentitiesCell,
		Cell,
		hivetest.Capture(&ag.alloc), hivetest.Capture(&ag.db), hivetest.Capture(&ag.cids),
	)
	return ag
}

func kvLabels(app string) labels.Labels {
	return labels.ParseLabels("k8s:app="+app, "k8s:io.kubernetes.pod.namespace=kv", "k8s:io.cilium.k8s.policy.cluster=default")
}

func etcdKeys(t *testing.T, cli *clientv3.Client, prefix string) map[string]string {
	t.Helper()
	resp, err := cli.Get(context.Background(), prefix, clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, kv := range resp.Kvs {
		out[strings.TrimPrefix(string(kv.Key), prefix)] = string(kv.Value)
	}
	return out
}

// TestIntegrationKVStoreMode runs two agents in kvstore mode against a real
// etcd: concurrent allocations of the same label sets end with one master
// key each and both agents' value keys; numbers taken by someone else's
// keys (valid other labels, garbage) are skipped; garbage keys stay out of
// the identity table; a release deletes the agent's value key; an etcd
// outage longer than the lease keeps the tables and the agents write their
// value keys again with new leases; a restarted agent gets the same IDs.
func TestIntegrationKVStoreMode(t *testing.T) {
	if testing.Short() {
		t.Skip("needs etcd")
	}
	e := harness.StartEtcd(t)
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{e.URL()}, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx := ctxTimeout(t, 3*time.Minute)

	// Someone else's keys: a valid identity of other labels and garbage at
	// the first numbers app-0 and app-1 would try, and junk keys.
	layout, _ := DefaultConfig.layout()
	lo, hi := layout.MinAllocation(), layout.MaxAllocation()
	span := uint64(hi-lo) + 1
	start0 := lo + identity.NumericIdentity(probeStart(kvLabels("app-0").SortedList(), span))
	start1 := lo + identity.NumericIdentity(probeStart(kvLabels("app-1").SortedList(), span))
	for k, v := range map[string]string{
		kvstore.IdentityIDKey(start0):                                              kvLabels("someone-else").SortedList(),
		kvstore.IdentityIDKey(start1):                                              "\x00garbage",
		kvstore.IdentityIDPrefix + "not-a-number":                                  "k8s:app=x;",
		kvstore.IdentityValuePrefix + kvLabels("app-2").SortedList() + "/10.9.9.9": "garbage-id",
	} {
		if _, err := cli.Put(ctx, k, v); err != nil {
			t.Fatal(err)
		}
	}

	const ttl = 2 * time.Second
	agents := []*kvAgent{
		startKVAgent(t, e.URL(), "node-a", "10.0.0.1", ttl),
		startKVAgent(t, e.URL(), "node-b", "10.0.0.2", ttl),
	}
	const sets = 10
	got := [2][sets]identity.NumericIdentity{}
	var (
		wg sync.WaitGroup
		mu sync.Mutex
	)
	t0 := time.Now()
	for ai, ag := range agents {
		for s := range sets {
			for range 2 { // two pods per set and agent
				wg.Go(func() {
					id, err := ag.alloc.Allocate(ctx, kvLabels(fmt.Sprintf("app-%d", s)))
					if err != nil {
						t.Errorf("agent %d set %d: %v", ai, s, err)
						return
					}
					mu.Lock()
					defer mu.Unlock()
					if prev := got[ai][s]; prev != 0 && prev != id.ID {
						t.Errorf("agent %d set %d: %d and %d", ai, s, prev, id.ID)
					}
					got[ai][s] = id.ID
				})
			}
		}
	}
	wg.Wait()
	t.Logf("%d concurrent kvstore allocations of %d label sets by 2 agents took %s", sets*4, sets, time.Since(t0))
	if t.Failed() {
		return
	}
	if got[0] != got[1] {
		t.Fatalf("agents disagree:\n a: %v\n b: %v", got[0], got[1])
	}
	if got[0][0] == start0 || got[0][1] == start1 {
		t.Errorf("took a number someone else holds: %v (taken %d, %d)", got[0], start0, start1)
	}

	// etcd: one master key per set (Cilium's layout and label format), a
	// value key per agent.
	ids := etcdKeys(t, cli, kvstore.IdentityIDPrefix)
	for s, id := range got[0] {
		key := kvLabels(fmt.Sprintf("app-%d", s)).SortedList()
		if ids[id.StringID()] != key {
			t.Errorf("id/%d = %q, want %q", id, ids[id.StringID()], key)
		}
		n := 0
		for _, v := range ids {
			if v == key {
				n++
			}
		}
		if n != 1 {
			t.Errorf("%d master keys for %s", n, key)
		}
	}
	waitValueKeys := func(what string, want map[string]string) {
		t.Helper()
		eventually(t, what, func() error {
			vals := etcdKeys(t, cli, kvstore.IdentityValuePrefix)
			for k, v := range want {
				if vals[k] != v {
					return fmt.Errorf("value/%s = %q, want %q", k, vals[k], v)
				}
			}
			return nil
		})
	}
	want := map[string]string{}
	for s, id := range got[0] {
		key := kvLabels(fmt.Sprintf("app-%d", s)).SortedList()
		want[key+"/10.0.0.1"] = id.StringID()
		want[key+"/10.0.0.2"] = id.StringID()
	}
	waitValueKeys("value keys of both agents", want)
	// Both identity tables hold the sets, and none of the garbage.
	for ai, ag := range agents {
		eventually(t, fmt.Sprintf("agent %d's identity table", ai), func() error {
			txn := ag.db.ReadTxn()
			for _, id := range got[0] {
				if _, _, ok := ag.cids.Get(txn, k8stables.NameIndex[*ciliumv2.CiliumIdentity]().Query(id.StringID())); !ok {
					return fmt.Errorf("identity %d missing", id)
				}
			}
			if _, _, ok := ag.cids.Get(txn, k8stables.NameIndex[*ciliumv2.CiliumIdentity]().Query(start1.StringID())); ok {
				return fmt.Errorf("garbage identity %d in the table", start1)
			}
			if _, _, ok := ag.cids.Get(txn, k8stables.NameIndex[*ciliumv2.CiliumIdentity]().Query(start0.StringID())); !ok {
				return fmt.Errorf("someone else's valid identity %d missing", start0)
			}
			return nil
		})
	}

	// Release: agent a's two references to app-9 go, its value key with them.
	for range 2 {
		if err := agents[0].alloc.Release(ctx, got[0][9]); err != nil {
			t.Fatal(err)
		}
	}
	key9 := kvLabels("app-9").SortedList()
	eventually(t, "agent a's value key of app-9 deleted", func() error {
		vals := etcdKeys(t, cli, kvstore.IdentityValuePrefix)
		if _, ok := vals[key9+"/10.0.0.1"]; ok {
			return fmt.Errorf("still there")
		}
		if vals[key9+"/10.0.0.2"] != got[0][9].StringID() {
			return fmt.Errorf("agent b's value key gone too")
		}
		return nil
	})
	delete(want, key9+"/10.0.0.1")

	// etcd down for longer than the lease TTL: the leases expire (with
	// the value keys); the tables keep their identities; once etcd is back
	// the agents write their value keys again with new leases.
	if err := e.Stop(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * ttl)
	for ai, ag := range agents {
		if n := ag.cids.NumObjects(ag.db.ReadTxn()); n < sets {
			t.Errorf("agent %d's identity table lost rows during the outage: %d", ai, n)
		}
	}
	if err := e.Start(); err != nil {
		t.Fatal(err)
	}
	t0 = time.Now()
	// First the old leases expire (a TTL after etcd is back)...
	eventually(t, "old leases expired", func() error {
		leases, err := cli.Leases(ctx)
		if err != nil {
			return err
		}
		if len(leases.Leases) > 2 {
			return fmt.Errorf("%d leases", len(leases.Leases))
		}
		return nil
	})
	// ...then the value keys are back.
	waitValueKeys("value keys re-registered after the outage", want)
	t.Logf("value keys back %s after etcd restarted", time.Since(t0))

	// A new agent on node a (a restart) gets the same numbers.
	a2 := startKVAgent(t, e.URL(), "node-a2", "10.0.0.3", ttl)
	for s := range sets {
		id, err := a2.alloc.Allocate(ctx, kvLabels(fmt.Sprintf("app-%d", s)))
		if err != nil {
			t.Fatal(err)
		}
		if id.ID != got[0][s] {
			t.Errorf("restarted agent: set %d got %d, want %d", s, id.ID, got[0][s])
		}
	}
	if ids := etcdKeys(t, cli, kvstore.IdentityIDPrefix); len(ids) != sets+3 {
		keys := slices.Sorted(func(yield func(string) bool) {
			for k := range ids {
				if !yield(k) {
					return
				}
			}
		})
		t.Errorf("%d master keys, want %d (sets + 3 foreign): %v", len(ids), sets+3, keys)
	}
}

// TestKVStoreModeNeedsKVStore: --identity-allocation-mode=kvstore (or a
// double-write mode) without --kvstore stops the agent at start with an
// error naming both flags.
func TestKVStoreModeNeedsKVStore(t *testing.T) {
	for _, mode := range []string{AllocationModeKVStore, AllocationModeDoubleWriteReadCRD, AllocationModeDoubleWriteReadKVStore} {
		h := hivetest.New(t, []string{"--identity-allocation-mode=" + mode},
			hive.Provide(func() k8s.Clientset { return k8s.DisabledClientset() }),
			hive.Provide(func() k8s.NodeName { return "n" }),
			kvstore.Cell, k8s.CiliumIdentitiesCell, Cell)
		err := h.Populate()
		if err == nil || !strings.Contains(err.Error(), "--kvstore=etcd") || !strings.Contains(err.Error(), mode) {
			t.Errorf("%s: got %v, want an error naming --kvstore=etcd and the mode", mode, err)
		}
	}
}

// TestIntegrationKVStoreIDCollision: two agents allocate two different
// label sets whose probes start at the same number, at the same time. The
// create-only master key lets one have it; the other moves on. Each set
// ends with its own number, and both agents agree.
func TestIntegrationKVStoreIDCollision(t *testing.T) {
	if testing.Short() {
		t.Skip("needs etcd")
	}
	layout, _ := DefaultConfig.layout()
	span := uint64(layout.MaxAllocation()-layout.MinAllocation()) + 1
	// Two label sets with the same first number (a birthday search).
	seen := map[uint64]string{}
	var x, y string
	for i := 0; x == ""; i++ {
		app := fmt.Sprintf("collide-%d", i)
		s := probeStart(kvLabels(app).SortedList(), span)
		if prev, ok := seen[s]; ok {
			x, y = prev, app
		}
		seen[s] = app
	}
	e := harness.StartEtcd(t)
	ctx := ctxTimeout(t, time.Minute)
	a := startKVAgent(t, e.URL(), "node-a", "10.0.0.1", 30*time.Second)
	b := startKVAgent(t, e.URL(), "node-b", "10.0.0.2", 30*time.Second)
	lx, ly := kvLabels(x), kvLabels(y)
	var (
		wg     sync.WaitGroup
		ix, iy Identity
		ex, ey error
	)
	wg.Go(func() { ix, ex = a.alloc.Allocate(ctx, lx) })
	wg.Go(func() { iy, ey = b.alloc.Allocate(ctx, ly) })
	wg.Wait()
	if ex != nil || ey != nil {
		t.Fatalf("%v, %v", ex, ey)
	}
	if ix.ID == iy.ID {
		t.Fatalf("%s and %s both got %d", lx, ly, ix.ID)
	}
	t.Logf("%s and %s both probe from %d: got %d and %d", x, y,
		layout.MinAllocation()+identity.NumericIdentity(probeStart(lx.SortedList(), span)), ix.ID, iy.ID)
	// Each agent gets the other's number for the other's labels.
	if jx, err := b.alloc.Allocate(ctx, lx); err != nil || jx.ID != ix.ID {
		t.Errorf("agent b got %d (%v) for %s, agent a %d", jx.ID, err, lx, ix.ID)
	}
	if jy, err := a.alloc.Allocate(ctx, ly); err != nil || jy.ID != iy.ID {
		t.Errorf("agent a got %d (%v) for %s, agent b %d", jy.ID, err, ly, iy.ID)
	}
}
