package integration

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	"github.com/cellium/cellium/api/client/clientset/versioned"
	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/cells/identity"
	"github.com/cellium/cellium/cells/k8s"
	"github.com/cellium/cellium/cells/kvstore"
	"github.com/cellium/cellium/statedb/labels"
	"github.com/cellium/cellium/test/harness"
)

// identityModes are the two identity backends, for the tests that run
// once in each (subtests identity=crd and identity=kvstore).
var identityModes = []string{identity.AllocationModeCRD, identity.AllocationModeKVStore}

// identityBackend is where a test's hand-made identities live, and how
// its partial agent hives read them: CiliumIdentity objects through the
// API server, or etcd master keys (cilium/state/identities/v1/id/<ID>)
// through the kvstore cell, as --identity-allocation-mode=kvstore does.
type identityBackend struct {
	mode string
	// etcd is the test's own client of the mode's etcd (kvstore only).
	etcd *clientv3.Client
	// args are the agents' kvstore flags (kvstore only).
	args []string
}

// newIdentityBackend starts an etcd for the kvstore mode. Call it before
// goleak.IgnoreCurrent: the test's etcd client lives until the test ends.
func newIdentityBackend(t *testing.T, mode string) *identityBackend {
	t.Helper()
	b := &identityBackend{mode: mode}
	if mode != identity.AllocationModeKVStore {
		return b
	}
	e := harness.StartEtcd(t)
	conf := filepath.Join(t.TempDir(), "etcd.config")
	if err := os.WriteFile(conf, []byte("endpoints:\n- "+e.URL()+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	b.args = []string{"--kvstore=etcd", "--kvstore-opt=etcd.config=" + conf}
	var err error
	if b.etcd, err = clientv3.New(clientv3.Config{Endpoints: []string{e.URL()}, DialTimeout: 5 * time.Second}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.etcd.Close() })
	// Connect now, so that goleak.IgnoreCurrent sees the connection's
	// goroutines.
	if _, err := b.etcd.Get(t.Context(), kvstore.IdentityIDPrefix, clientv3.WithCountOnly()); err != nil {
		t.Fatalf("etcd: %v", err)
	}
	return b
}

// cells are what an agent hive adds to k8s.CiliumIdentitiesCell to read
// the backend: nothing for CRDs; the kvstore client and the etcd source
// of the CiliumIdentity table for kvstore (what the identity cell provides
// in a whole agent).
func (b *identityBackend) cells() []hive.Cell {
	if b.etcd == nil {
		return nil
	}
	return []hive.Cell{kvstore.Cell, hive.Provide(func(c *kvstore.Client, log *slog.Logger) k8s.CiliumIdentitiesSource {
		return k8s.CiliumIdentitiesSource{LW: c.IdentitiesListerWatcher(log)}
	})}
}

// create makes identity id with securityLabels ("k8s:app" -> "web") in
// the backend, and removes it when the test ends.
func (b *identityBackend) create(t *testing.T, admin versioned.Interface, id int, securityLabels map[string]string) {
	t.Helper()
	ctx := t.Context()
	name := strconv.Itoa(id)
	if b.etcd == nil {
		obj := &ciliumv2.CiliumIdentity{ObjectMeta: metav1.ObjectMeta{Name: name}, SecurityLabels: securityLabels}
		if _, err := admin.CiliumV2().CiliumIdentities().Create(ctx, obj, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = admin.CiliumV2().CiliumIdentities().Delete(context.Background(), name, metav1.DeleteOptions{})
		})
		return
	}
	var ls []string
	for k, v := range securityLabels {
		ls = append(ls, k+"="+v)
	}
	slices.Sort(ls)
	if _, err := b.etcd.Put(ctx, kvstore.IdentityIDPrefix+name, labelsKey(ls)); err != nil {
		t.Fatalf("put identity %s in etcd: %v", name, err)
	}
}

// labelsKey is an etcd master key's value for labels ("source:key=value"
// each): Cilium's sorted list, "source:key=value;" per label.
func labelsKey(ls []string) string {
	return labels.ParseLabels(ls...).SortedList()
}
