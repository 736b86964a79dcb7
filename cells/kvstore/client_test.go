package kvstore

import (
	"context"
	"fmt"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/cellium/cellium/cells/hive/hivetest"
	"github.com/cellium/cellium/test/harness"
)

func ctxTimeout(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// startClient starts a Client with a short lease against url, with its
// session job, until the test ends.
func startClient(t *testing.T, url string, ttl time.Duration) *Client {
	t.Helper()
	cfg, err := EtcdConfig(map[string]string{OptAddress: url})
	if err != nil {
		t.Fatal(err)
	}
	cfg.DialTimeout = 2 * time.Second
	c := NewClient(hivetest.Logger(t), cfg, ttl)
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { c.RunSession(ctx, hivetest.NopHealth{}); close(done) }()
	t.Cleanup(func() { cancel(); <-done; _ = c.Close() })
	return c
}

// TestIntegrationCellSession: the cell with --kvstore=etcd against a real
// etcd grants a lease of --kvstore-lease-ttl, and a leased key is there.
func TestIntegrationCellSession(t *testing.T) {
	if testing.Short() {
		t.Skip("needs etcd")
	}
	e := harness.StartEtcd(t)
	var c *Client
	hivetest.Start(t, []string{"--kvstore=etcd", "--kvstore-opt=etcd.address=" + e.URL(), "--kvstore-lease-ttl=30s"},
		Cell, hivetest.Capture(&c))
	ctx := ctxTimeout(t, 30*time.Second)
	lease, err := c.WaitSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ttl, err := c.Etcd().TimeToLive(ctx, lease)
	if err != nil {
		t.Fatal(err)
	}
	if ttl.GrantedTTL != 30 {
		t.Errorf("granted TTL %d s, want 30", ttl.GrantedTTL)
	}
	// Without --kvstore the cell provides nil.
	var none *Client
	hivetest.Start(t, nil, Cell, hivetest.Capture(&none))
	if none != nil {
		t.Error("client without --kvstore")
	}
}

// TestIntegrationLeaseLostAndRegranted: etcd down for longer than the TTL
// loses the lease (and its keys); once etcd is back the client grants a
// new lease and says so on the Session channel.
func TestIntegrationLeaseLostAndRegranted(t *testing.T) {
	if testing.Short() {
		t.Skip("needs etcd")
	}
	e := harness.StartEtcd(t)
	c := startClient(t, e.URL(), 2*time.Second)
	ctx := ctxTimeout(t, 60*time.Second)
	first, err := c.WaitSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Etcd().Put(ctx, "cilium/state/test/k", "v", clientv3.WithLease(first)); err != nil {
		t.Fatal(err)
	}
	_, changed := c.Session()

	// A short outage (less than the TTL) keeps the lease: etcd renews
	// leases on restart.
	if err := e.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := e.Start(); err != nil {
		t.Fatal(err)
	}
	if got, _ := c.Session(); got != first {
		t.Errorf("lease changed over a short outage: %x -> %x", first, got)
	}

	// A long one loses it.
	if err := e.Stop(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-changed:
	case <-ctx.Done():
		t.Fatal("lease never reported lost")
	}
	if got, _ := c.Session(); got != 0 {
		t.Errorf("lease %x while etcd is down for longer than the TTL", got)
	}
	// etcd expires the old lease about its TTL after it is back.
	if err := e.Start(); err != nil {
		t.Fatal(err)
	}
	second, err := c.WaitSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if second == first {
		t.Fatalf("same lease %x after it expired", first)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		resp, err := c.Etcd().Get(ctx, "cilium/state/test/k")
		if err == nil && len(resp.Kvs) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal(fmt.Errorf("key of the expired lease still there: %v %v", resp, err))
		}
		time.Sleep(100 * time.Millisecond)
	}
}
