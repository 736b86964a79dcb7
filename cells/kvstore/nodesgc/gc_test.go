package nodesgc

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/cilium/statedb"
	clientv3 "go.etcd.io/etcd/client/v3"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/cells/hive/hivetest"
	"github.com/cellium/cellium/cells/k8s/k8stest"
	"github.com/cellium/cellium/cells/kvstore"
	k8stables "github.com/cellium/cellium/statedb/k8s"
	"github.com/cellium/cellium/test/harness"
)

// env is the two tables the collector reads, fed by the test.
type env struct {
	t     *testing.T
	db    *statedb.DB
	cns   statedb.RWTable[*ciliumv2.CiliumNode]
	pods  statedb.RWTable[*corev1.Pod]
	ready func(statedb.WriteTxn)
}

// newEnv makes the tables; they are not initialized until e.initialize.
func newEnv(t *testing.T) *env {
	t.Helper()
	e := &env{t: t, db: statedb.New()}
	var err error
	if e.cns, err = k8stables.NewCiliumNodesTable(e.db); err != nil {
		t.Fatal(err)
	}
	if e.pods, err = k8stables.NewPodsTable(e.db); err != nil {
		t.Fatal(err)
	}
	if err := e.db.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.db.Stop() })
	txn := e.db.WriteTxn(e.cns)
	e.ready = e.cns.RegisterInitializer(txn, "test")
	txn.Commit()
	return e
}

func (e *env) initialize() {
	txn := e.db.WriteTxn(e.cns)
	e.ready(txn)
	txn.Commit()
}

func (e *env) tables() Tables { return Tables{DB: e.db, CiliumNodes: e.cns, Pods: e.pods} }

func (e *env) ciliumNode(name string, present bool) {
	e.t.Helper()
	txn := e.db.WriteTxn(e.cns)
	cn := &ciliumv2.CiliumNode{ObjectMeta: metav1.ObjectMeta{Name: name}}
	var err error
	if present {
		_, _, err = e.cns.Insert(txn, cn)
	} else {
		_, _, err = e.cns.Delete(txn, cn)
	}
	if err != nil {
		e.t.Fatal(err)
	}
	txn.Commit()
}

func (e *env) pod(name, node string, lbls map[string]string, phase corev1.PodPhase) {
	e.t.Helper()
	txn := e.db.WriteTxn(e.pods)
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: name, Labels: lbls},
		Spec:       corev1.PodSpec{NodeName: node},
		Status:     corev1.PodStatus{Phase: phase},
	}
	if _, _, err := e.pods.Insert(txn, p); err != nil {
		e.t.Fatal(err)
	}
	txn.Commit()
}

var agentLabels = map[string]string{"app.kubernetes.io/name": "cellium", "app.kubernetes.io/component": "agent"}

func TestAgentRunning(t *testing.T) {
	e := newEnv(t)
	e.pod("agent-a", "a", agentLabels, corev1.PodRunning)
	e.pod("agent-b", "b", agentLabels, corev1.PodPending)
	e.pod("agent-c", "c", agentLabels, corev1.PodSucceeded)
	e.pod("agent-d", "d", agentLabels, corev1.PodFailed)
	e.pod("web-e", "e", map[string]string{"app": "web"}, corev1.PodRunning)
	gc, err := NewGC(DefaultConfig, nil, e.tables(), hivetest.Logger(t), &k8stest.HealthRecorder{})
	if err != nil {
		t.Fatal(err)
	}
	l := gc.lookups()
	for node, want := range map[string]bool{"a": true, "b": true, "c": false, "d": false, "e": false, "f": false} {
		if got := l.agentRunning(node); got != want {
			t.Errorf("agentRunning(%s) = %v, want %v", node, got, want)
		}
	}
}

func TestParse(t *testing.T) {
	gc, err := NewGC(Config{ClusterName: "c1", CiliumPodLabels: "x=y"}, nil, Tables{}, hivetest.Logger(t), &k8stest.HealthRecorder{})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		key, value string
		node       string // "" for an error
	}{
		{"cilium/state/nodes/v1/c1/n1", `{"Name":"n1","Cluster":"c1"}`, "n1"},
		{"cilium/state/nodes/v1/c1/n1", `{"Name":"n2","Cluster":"c1"}`, ""},
		{"cilium/state/nodes/v1/c1/n1", `{"Name":"n1","Cluster":"c2"}`, ""},
		{"cilium/state/nodes/v1/c1/n1", "\x00garbage", ""},
		{"cilium/state/nodes/v1/c1/n1", `{"Name":1}`, ""},
		{"cilium/state/nodes/v1/c1/a/b", `{"Name":"a/b","Cluster":"c1"}`, ""},
		{"cilium/state/nodes/v1/c1/", `{"Name":"","Cluster":"c1"}`, ""},
	} {
		node, err := gc.parse(tc.key, []byte(tc.value))
		if node != tc.node || (err == nil) != (tc.node != "") {
			t.Errorf("parse(%q, %q) = %q, %v; want %q", tc.key, tc.value, node, err, tc.node)
		}
	}
}

func nodeJSON(t *testing.T, cluster, name string) string {
	t.Helper()
	b, err := json.Marshal(kvstore.NodeJSON{Name: name, Cluster: cluster, Source: "local"})
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// waitFor polls cond until it holds, for at most 20 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestIntegrationNodesGC runs the collector against a real etcd: a node
// key without a CiliumNode is deleted one grace period after it was
// written, one with a CiliumNode stays until the CiliumNode goes, one
// whose node still runs an agent pod stays until the pod stops, and keys
// of another cluster or with garbage stay (and disturb nothing).
func TestIntegrationNodesGC(t *testing.T) {
	if testing.Short() {
		t.Skip("needs etcd")
	}
	etcd := harness.StartEtcd(t)
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{etcd.URL()}, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	put := func(k, v string) time.Time {
		t.Helper()
		if _, err := cli.Put(ctx, k, v); err != nil {
			t.Fatal(err)
		}
		return time.Now()
	}
	exists := func(k string) bool {
		t.Helper()
		resp, err := cli.Get(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		return len(resp.Kvs) == 1
	}
	const cluster = "c1"
	key := func(n string) string { return kvstore.NodeKey(cluster, n) }

	e := newEnv(t)
	e.ciliumNode("kept", true)
	e.pod("agent-busy", "busy", agentLabels, corev1.PodRunning)
	e.pod("web-gone", "gone", map[string]string{"app": "web"}, corev1.PodRunning) // not an agent

	// Written before the collector starts.
	put(key("gone"), nodeJSON(t, cluster, "gone"))
	put(key("kept"), nodeJSON(t, cluster, "kept"))
	put(key("busy"), nodeJSON(t, cluster, "busy"))
	put(kvstore.NodeKey("other", "gone"), nodeJSON(t, "other", "gone"))
	put(key("junk"), "\x00not json")
	put(key("alias"), nodeJSON(t, cluster, "someone-else"))
	put(key("gone-later"), nodeJSON(t, cluster, "gone-later"))

	health := &k8stest.HealthRecorder{}
	gc, err := NewGC(Config{ClusterName: cluster, CiliumPodLabels: DefaultConfig.CiliumPodLabels}, cli, e.tables(), hivetest.Logger(t), health)
	if err != nil {
		t.Fatal(err)
	}
	const grace = 500 * time.Millisecond
	gc.Grace = grace
	rctx, rcancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- gc.Run(rctx) }()
	defer func() {
		rcancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
		if l, msg, _ := health.Last(); l != hive.LevelStopped {
			t.Errorf("health after Run: %s %q, want Stopped", l, msg)
		}
	}()

	// Nothing before the CiliumNodes table is initialized: the collector
	// reports that it waits for it, and has not listed.
	waitFor(t, "the collector to wait for the tables", func() bool {
		_, msg, _ := health.Last()
		return msg == "waiting for the CiliumNodes and pods tables"
	})
	if !exists(key("gone")) {
		t.Fatal("node key deleted before the CiliumNodes table was initialized")
	}
	listedAt := time.Now()
	e.initialize()

	waitFor(t, "the key without a CiliumNode to be deleted", func() bool { return !exists(key("gone")) })
	if d := time.Since(listedAt); d < grace {
		t.Errorf("deleted %s after the listing, before the grace period (%s)", d, grace)
	}

	// A key written while the collector runs: deleted one grace period
	// after its write. When it is gone, every listed key has been checked.
	written := put(key("new"), nodeJSON(t, cluster, "new"))
	waitFor(t, "the new key without a CiliumNode to be deleted", func() bool { return !exists(key("new")) })
	if d := time.Since(written); d < grace {
		t.Errorf("new key deleted %s after its write, before the grace period (%s)", d, grace)
	}
	for _, k := range []string{key("kept"), key("busy"), kvstore.NodeKey("other", "gone"), key("junk"), key("alias")} {
		if !exists(k) {
			t.Errorf("%s was deleted", k)
		}
	}
	if exists(key("gone-later")) {
		t.Errorf("%s was not deleted", key("gone-later"))
	}

	// The CiliumNode goes: its key follows at once.
	e.ciliumNode("kept", false)
	waitFor(t, "the key of the deleted CiliumNode to be deleted", func() bool { return !exists(key("kept")) })

	// The agent pod stops: the key goes at the next retry.
	e.pod("agent-busy", "busy", agentLabels, corev1.PodSucceeded)
	waitFor(t, "the key of the node whose agent stopped to be deleted", func() bool { return !exists(key("busy")) })

	// Garbage over a valid key: left alone; valid again: collected.
	put(key("flip"), "{garbage")
	put(key("flip"), nodeJSON(t, cluster, "flip"))
	put(key("flip2"), nodeJSON(t, cluster, "flip2"))
	put(key("flip2"), "{garbage")
	waitFor(t, "the key made valid again to be deleted", func() bool { return !exists(key("flip")) })
	// A key written after everything else is deleted one grace period
	// later: by then flip2's garbage has long been seen.
	put(key("last"), nodeJSON(t, cluster, "last"))
	waitFor(t, "the last key to be deleted", func() bool { return !exists(key("last")) })
	for _, k := range []string{key("flip2"), key("junk"), key("alias"), kvstore.NodeKey("other", "gone")} {
		if !exists(k) {
			t.Errorf("%s was deleted", k)
		}
	}

	// etcd restarts: the collector watches (or lists) again and collects
	// a key written afterwards; the others stay.
	if err := etcd.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := etcd.Start(); err != nil {
		t.Fatal(err)
	}
	put(key("after-restart"), nodeJSON(t, cluster, "after-restart"))
	waitFor(t, "the key written after an etcd restart to be deleted", func() bool { return !exists(key("after-restart")) })
	for _, k := range []string{key("flip2"), key("junk"), key("alias"), kvstore.NodeKey("other", "gone")} {
		if !exists(k) {
			t.Errorf("after the etcd restart: %s was deleted", k)
		}
	}
	if l, msg, err := health.Last(); l != hive.LevelOK {
		t.Errorf("health: %s %q %v, want OK", l, msg, err)
	}
}
