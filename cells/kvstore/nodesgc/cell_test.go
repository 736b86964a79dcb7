package nodesgc

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/cilium/statedb"
	clientv3 "go.etcd.io/etcd/client/v3"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/cells/hive/hivetest"
	"github.com/cellium/cellium/cells/k8s"
	"github.com/cellium/cellium/cells/k8s/k8stest"
	"github.com/cellium/cellium/cells/kvstore"
	"github.com/cellium/cellium/cells/leaderelection"
	k8stables "github.com/cellium/cellium/statedb/k8s"
	"github.com/cellium/cellium/test/harness"
)

// The collector is a leader job only with --kvstore and
// --synchronize-k8s-nodes (the default).
func TestLeaderJob(t *testing.T) {
	kv := kvstore.NewClient(hivetest.Logger(t), clientv3.Config{Endpoints: []string{"http://127.0.0.1:1"}}, time.Minute)
	for _, tc := range []struct {
		name   string
		kv     *kvstore.Client
		enable bool
		jobs   int
	}{
		{"no kvstore", nil, true, 0},
		{"disabled", kv, false, 0},
		{"enabled", kv, true, 1},
	} {
		cfg := DefaultConfig
		cfg.SynchronizeK8sNodes = tc.enable
		out := newLeaderJob(leaderJobParams{
			Config: cfg, Clientset: k8stest.NewClientset(), Log: hivetest.Logger(t),
			Health: &k8stest.HealthRecorder{}, KVStore: tc.kv,
		})
		if len(out.Jobs) != tc.jobs {
			t.Errorf("%s: %d leader jobs, want %d", tc.name, len(out.Jobs), tc.jobs)
		}
		if tc.jobs == 1 && out.Jobs[0].Name != "kvstore-nodes-gc" {
			t.Errorf("%s: job %q", tc.name, out.Jobs[0].Name)
		}
	}
}

// TestCellAsLeaderJob runs the cell as the operator wires it: under the
// leader election (disabled: this replica leads at once), with the kvstore
// client of --kvstore=etcd against a real etcd and the tables from the
// hive. Deleting a CiliumNode deletes its node's key at once (no grace
// period once the CiliumNode was seen); the key of another node with a
// CiliumNode stays.
func TestCellAsLeaderJob(t *testing.T) {
	if testing.Short() {
		t.Skip("needs etcd")
	}
	etcd := harness.StartEtcd(t)
	var (
		db     *statedb.DB
		cns    statedb.RWTable[*ciliumv2.CiliumNode]
		health hive.HealthReporter
	)
	h := hivetest.New(t, []string{
		"--leader-election=false", "--kvstore=etcd", "--kvstore-opt=" + kvstore.OptAddress + "=" + etcd.URL(), "--cluster-name=c1",
	},
		hive.Provide(
			func() k8s.Clientset { return k8stest.NewClientset() },
			k8stables.NewCiliumNodesTable, statedb.RWTable[*ciliumv2.CiliumNode].ToTable,
			k8stables.NewPodsTable, statedb.RWTable[*corev1.Pod].ToTable,
		),
		kvstore.Cell, leaderelection.Cell, Cell,
		hivetest.Capture(&db), hivetest.Capture(&cns), hivetest.Capture(&health),
	)
	if err := h.Populate(); err != nil {
		t.Fatal(err)
	}
	setCN := func(name string, present bool) {
		t.Helper()
		txn := db.WriteTxn(cns)
		cn := &ciliumv2.CiliumNode{ObjectMeta: metav1.ObjectMeta{Name: name}}
		var err error
		if present {
			_, _, err = cns.Insert(txn, cn)
		} else {
			_, _, err = cns.Delete(txn, cn)
		}
		if err != nil {
			t.Fatal(err)
		}
		txn.Commit()
	}
	setCN("a", true)
	setCN("b", true)
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{etcd.URL()}, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, n := range []string{"a", "b"} {
		if _, err := cli.Put(ctx, kvstore.NodeKey("c1", n), nodeJSON(t, "c1", n)); err != nil {
			t.Fatal(err)
		}
	}
	exists := func(n string) bool {
		t.Helper()
		resp, err := cli.Get(ctx, kvstore.NodeKey("c1", n))
		if err != nil {
			t.Fatal(err)
		}
		return len(resp.Kvs) == 1
	}
	if err := h.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := h.Stop(context.Background()); err != nil {
			t.Error(err)
		}
	})
	waitFor(t, "the collector to watch the keys", func() bool {
		for _, s := range health.Statuses() {
			if strings.HasSuffix(s.Module, "kvstore-nodes-gc") && strings.HasPrefix(s.Message, "watching the node keys of cluster c1 (2)") {
				return true
			}
		}
		return false
	})
	setCN("a", false)
	waitFor(t, "the key of the deleted CiliumNode to be deleted", func() bool { return !exists("a") })
	if !exists("b") {
		t.Error("the key of a node with a CiliumNode was deleted")
	}
}
