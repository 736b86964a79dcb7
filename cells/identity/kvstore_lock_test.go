package identity

import (
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/cellium/cellium/cells/hive/hivetest"
	"github.com/cellium/cellium/cells/kvstore"
	"github.com/cellium/cellium/test/harness"
)

// TestIntegrationKVStoreStaleLock: an agent that dies holding the
// allocation lock of a label set (its etcd client closed without
// unlocking, as a killed process) blocks another agent's allocation of
// the same labels only until the lock's lease expires; a revoked lease
// frees it at once. Without the lease (a lock key that outlived its
// holder) the second allocation would wait for ever.
func TestIntegrationKVStoreStaleLock(t *testing.T) {
	if testing.Short() {
		t.Skip("needs etcd")
	}
	e := harness.StartEtcd(t)
	ctx := ctxTimeout(t, 2*time.Minute)
	b := startKVAgent(t, e.URL(), "node-b", "10.0.0.2", 30*time.Second)
	inspect, err := clientv3.New(clientv3.Config{Endpoints: []string{e.URL()}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = inspect.Close() })

	// deadAgent takes the lock of lbls with cellium's lock code and the
	// given lease TTL, and returns its etcd client, still open.
	deadAgent := func(app string, ttl time.Duration) (*kvstore.Client, *kvBackend) {
		cfg, err := kvstore.EtcdConfig(map[string]string{kvstore.OptAddress: e.URL()})
		if err != nil {
			t.Fatal(err)
		}
		c := kvstore.NewClient(hivetest.Logger(t), cfg, time.Minute)
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		a := &kvBackend{log: hivetest.Logger(t), kv: c, lockTTL: ttl}
		if _, err := a.lock(ctx, kvLabels(app).SortedList()); err != nil {
			t.Fatal(err)
		}
		return c, a
	}
	lockKeys := func(app string) []*clientv3.GetResponse {
		resp, err := inspect.Get(ctx, kvstore.IdentityLocksPrefix+kvLabels(app).SortedList(), clientv3.WithPrefix())
		if err != nil {
			t.Fatal(err)
		}
		return []*clientv3.GetResponse{resp}
	}

	// Killed: the lease expires after its TTL (4 s here; 25 s by default).
	const ttl = 4 * time.Second
	c, _ := deadAgent("stale-expired", ttl)
	held := lockKeys("stale-expired")[0]
	if len(held.Kvs) != 1 || held.Kvs[0].Lease == 0 {
		t.Fatalf("lock keys of the dead agent: %v (want one, with a lease)", held.Kvs)
	}
	if err := c.Close(); err != nil { // no unlock, no revoke
		t.Fatal(err)
	}
	start := time.Now()
	id, err := b.alloc.Allocate(ctx, kvLabels("stale-expired"))
	waited := time.Since(start)
	if err != nil {
		t.Fatalf("allocation behind a dead agent's lock: %v", err)
	}
	t.Logf("allocated %d after %s behind the lock of a killed agent (lease TTL %s)", id.ID, waited.Truncate(time.Millisecond), ttl)
	if waited < time.Second {
		t.Errorf("allocated after %s: the dead agent's lock (TTL %s) did not hold it", waited, ttl)
	}
	if waited > ttl+10*time.Second {
		t.Errorf("allocated only after %s, lock TTL %s", waited, ttl)
	}
	if n := len(lockKeys("stale-expired")[0].Kvs); n != 0 {
		t.Errorf("%d lock keys left after the allocation", n)
	}

	// Revoked (the operator or an admin revokes a dead agent's lease):
	// free at once, even with a long TTL.
	c2, _ := deadAgent("stale-revoked", time.Hour)
	held = lockKeys("stale-revoked")[0]
	if _, err := inspect.Revoke(ctx, clientv3.LeaseID(held.Kvs[0].Lease)); err != nil {
		t.Fatal(err)
	}
	_ = c2.Close()
	start = time.Now()
	if _, err := b.alloc.Allocate(ctx, kvLabels("stale-revoked")); err != nil {
		t.Fatal(err)
	}
	if waited := time.Since(start); waited > 10*time.Second {
		t.Errorf("allocated %s after the lock's lease was revoked", waited)
	}

	// cellium's own locks carry Cilium's 25 s lease.
	_, a := deadAgent("lock-ttl", 0)
	held = lockKeys("lock-ttl")[0]
	ttlResp, err := inspect.TimeToLive(ctx, clientv3.LeaseID(held.Kvs[0].Lease))
	if err != nil {
		t.Fatal(err)
	}
	if ttlResp.GrantedTTL != 25 || a.lockTTL != 0 {
		t.Errorf("allocation lock lease TTL %d s, want Cilium's 25 s", ttlResp.GrantedTTL)
	}
}
