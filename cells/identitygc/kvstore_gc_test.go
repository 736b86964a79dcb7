package identitygc

import (
	"context"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/cellium/cellium/cells/hive/hivetest"
	"github.com/cellium/cellium/cells/kvstore"
	"github.com/cellium/cellium/test/harness"
)

// TestIntegrationKVStoreGC runs passes of the kvstore collector against a
// real etcd: a master key is deleted only after two consecutive passes
// found it unused and unchanged; a used one, one that gets a user or is
// rewritten between passes, and keys whose name is not a number stay.
func TestIntegrationKVStoreGC(t *testing.T) {
	if testing.Short() {
		t.Skip("needs etcd")
	}
	e := harness.StartEtcd(t)
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{e.URL()}, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	put := func(k, v string) {
		t.Helper()
		if _, err := cli.Put(ctx, k, v); err != nil {
			t.Fatal(err)
		}
	}
	const (
		used      = "k8s:app=used;"
		getsUser  = "k8s:app=gets-user;"
		unused    = "k8s:app=unused;"
		rewritten = "k8s:app=rewritten;"
	)
	put(kvstore.IdentityIDPrefix+"1000", used)
	put(kvstore.IdentityValueKey(used, "10.0.0.1"), "1000")
	put(kvstore.IdentityIDPrefix+"1001", getsUser)
	put(kvstore.IdentityIDPrefix+"1002", unused)
	put(kvstore.IdentityIDPrefix+"1003", "\x00garbage") // nobody's: collected like any unused key
	put(kvstore.IdentityIDPrefix+"1004", rewritten)
	put(kvstore.IdentityIDPrefix+"not-a-number", unused)

	gc := NewKVStoreGC(DefaultConfig, cli, hivetest.Logger(t), hivetest.NopHealth{})
	exists := func(k string) bool {
		t.Helper()
		resp, err := cli.Get(ctx, kvstore.IdentityIDPrefix+k)
		if err != nil {
			t.Fatal(err)
		}
		return len(resp.Kvs) == 1
	}
	if n, err := gc.Pass(ctx); err != nil || n != 0 {
		t.Fatalf("first pass deleted %d (%v), want 0", n, err)
	}
	put(kvstore.IdentityValueKey(getsUser, "10.0.0.2"), "1001")
	put(kvstore.IdentityIDPrefix+"1004", rewritten)
	if n, err := gc.Pass(ctx); err != nil || n != 2 {
		t.Fatalf("second pass deleted %d (%v), want 2 (1002, 1003)", n, err)
	}
	for k, want := range map[string]bool{"1000": true, "1001": true, "1002": false, "1003": false, "1004": true, "not-a-number": true} {
		if got := exists(k); got != want {
			t.Errorf("after two passes: id/%s exists %v, want %v", k, got, want)
		}
	}
	// The rewritten one goes a pass later; the user's lease-less value key
	// keeps 1001.
	if n, err := gc.Pass(ctx); err != nil || n != 1 || exists("1004") || !exists("1001") {
		t.Fatalf("third pass deleted %d (%v); 1004 exists %v, 1001 exists %v", n, err, exists("1004"), exists("1001"))
	}
}
