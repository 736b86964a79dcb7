package endpointgc_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cilium/statedb"
	"go.uber.org/goleak"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	"github.com/cellium/cellium/cells/endpointgc"
	"github.com/cellium/cellium/cells/hive/hivetest"
	"github.com/cellium/cellium/cells/k8s/k8stest"
	k8stables "github.com/cellium/cellium/statedb/k8s"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("k8s.io/klog/v2.(*loggingT).flushDaemon"))
}

// env is a fake API server and the three tables, fed by the test.
type env struct {
	t      *testing.T
	cs     *k8stest.Clientset
	db     *statedb.DB
	pods   statedb.RWTable[*corev1.Pod]
	ceps   statedb.RWTable[*ciliumv2.CiliumEndpoint]
	nodes  statedb.RWTable[*ciliumv2.CiliumNode]
	health *k8stest.HealthRecorder
}

func newEnv(t *testing.T) *env {
	t.Helper()
	e := &env{t: t, cs: k8stest.NewClientset(), db: statedb.New(), health: &k8stest.HealthRecorder{}}
	var err error
	if e.pods, err = k8stables.NewPodsTable(e.db); err != nil {
		t.Fatal(err)
	}
	if e.ceps, err = k8stables.NewCiliumEndpointsTable(e.db); err != nil {
		t.Fatal(err)
	}
	if e.nodes, err = k8stables.NewCiliumNodesTable(e.db); err != nil {
		t.Fatal(err)
	}
	if err := e.db.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.db.Stop() })
	return e
}

func (e *env) tables() endpointgc.Tables {
	return endpointgc.Tables{DB: e.db, Pods: e.pods, Endpoints: e.ceps, Nodes: e.nodes}
}

func (e *env) gc(interval time.Duration) *endpointgc.GC {
	return endpointgc.NewGC(interval, e.cs.Cilium().CiliumV2(), e.tables(), hivetest.Logger(e.t), e.health)
}

func insert[T any](e *env, table statedb.RWTable[T], obj T) {
	txn := e.db.WriteTxn(table)
	if _, _, err := table.Insert(txn, obj); err != nil {
		e.t.Fatal(err)
	}
	txn.Commit()
}

func remove[T any](e *env, table statedb.RWTable[T], obj T) {
	txn := e.db.WriteTxn(table)
	if _, _, err := table.Delete(txn, obj); err != nil {
		e.t.Fatal(err)
	}
	txn.Commit()
}

// pod puts a pod into the pods table.
func (e *env) pod(name, uid string, phase corev1.PodPhase) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, UID: types.UID(uid)},
		Status:     corev1.PodStatus{Phase: phase},
	}
	insert(e, e.pods, p)
	return p
}

// cep creates a CiliumEndpoint of age in the API and puts it in the table.
// ownerUID "" means no owner reference.
func (e *env) cep(ns, name, ownerUID string, age time.Duration) *ciliumv2.CiliumEndpoint {
	e.t.Helper()
	c := &ciliumv2.CiliumEndpoint{ObjectMeta: metav1.ObjectMeta{
		Namespace: ns, Name: name, CreationTimestamp: metav1.NewTime(time.Now().Add(-age)),
	}}
	if ownerUID != "" {
		c.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: name, UID: types.UID(ownerUID)}}
	}
	created, err := e.cs.Cilium().CiliumV2().CiliumEndpoints(ns).Create(context.Background(), c, metav1.CreateOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	insert(e, e.ceps, created)
	return created
}

// remaining lists the CiliumEndpoints left in the API, as ns/name.
func (e *env) remaining() []string {
	e.t.Helper()
	l, err := e.cs.Cilium().CiliumV2().CiliumEndpoints("").List(context.Background(), metav1.ListOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	var out []string
	for _, c := range l.Items {
		out = append(out, c.Namespace+"/"+c.Name)
	}
	slices.Sort(out)
	return out
}

func (e *env) deletes() int {
	n := 0
	for _, a := range e.cs.CiliumFake.Actions() {
		if a.GetVerb() == "delete" {
			n++
		}
	}
	return n
}

func TestPassDeletesOnlyStale(t *testing.T) {
	e := newEnv(t)
	hour := time.Hour
	e.pod("live", "uid-live", corev1.PodRunning)
	e.pod("done", "uid-done", corev1.PodSucceeded)
	e.pod("crashed", "uid-crashed", corev1.PodFailed)
	e.pod("recreated", "uid-new", corev1.PodPending)
	e.pod("unowned", "uid-unowned", corev1.PodRunning)
	insert(e, e.nodes, &ciliumv2.CiliumNode{ObjectMeta: metav1.ObjectMeta{Name: "node-a"}})

	e.cep("default", "live", "uid-live", hour)
	e.cep("default", "done", "uid-done", hour)
	e.cep("default", "crashed", "uid-crashed", hour)
	e.cep("default", "recreated", "uid-old", hour)
	e.cep("default", "gone", "uid-gone", hour)
	e.cep("default", "unowned", "", hour)
	e.cep("default", "young", "uid-young", time.Second) // pod not in the table yet
	e.cep("kube-system", "cilium-health-node-a", "", hour)
	e.cep("kube-system", "cilium-health-node-b", "", hour)

	res := e.gc(time.Minute).Pass(context.Background())
	if res.Err != nil || res.Checked != 9 || res.Deleted != 5 || res.Failed != 0 {
		t.Errorf("Pass = %+v, want 9 checked, 5 deleted, no error", res)
	}
	want := []string{"default/live", "default/unowned", "default/young", "kube-system/cilium-health-node-a"}
	if got := e.remaining(); !slices.Equal(got, want) {
		t.Errorf("remaining CiliumEndpoints %q, want %q", got, want)
	}
	// Every delete carried the UID precondition.
	for _, a := range e.cs.CiliumFake.Actions() {
		if d, ok := a.(interface{ GetDeleteOptions() metav1.DeleteOptions }); ok {
			if p := d.GetDeleteOptions().Preconditions; p == nil || p.UID == nil {
				t.Errorf("delete without UID precondition: %+v", a)
			}
		}
	}
}

func TestPassNeverDeletesRecreatedCEP(t *testing.T) {
	e := newEnv(t)
	// The table still has the CiliumEndpoint of the old pod; in the API it
	// has been deleted and re-created (new UID) for the new pod, which the
	// pods table has not seen yet.
	stale := e.cep("default", "web", "uid-old-pod", time.Hour)
	if err := e.cs.Cilium().CiliumV2().CiliumEndpoints("default").Delete(context.Background(), "web", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	fresh := &ciliumv2.CiliumEndpoint{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web",
		OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: "web", UID: "uid-new-pod"}}}}
	fresh, err := e.cs.Cilium().CiliumV2().CiliumEndpoints("default").Create(context.Background(), fresh, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if fresh.UID == stale.UID {
		t.Fatal("fake gave the re-created CiliumEndpoint the same UID")
	}

	res := e.gc(time.Minute).Pass(context.Background())
	if res.Deleted != 0 || res.Failed != 0 || res.Err != nil {
		t.Errorf("Pass = %+v, want nothing deleted and no failure", res)
	}
	if e.deletes() != 2 { // the test's own and the refused one
		t.Errorf("%d deletes, want the GC to have tried once", e.deletes()-1)
	}
	if got := e.remaining(); !slices.Equal(got, []string{"default/web"}) {
		t.Fatalf("remaining %q: the re-created CiliumEndpoint was deleted", got)
	}
	// A CiliumEndpoint already gone is not a failure either.
	remove(e, e.ceps, stale)
	e.cep("default", "gone", "uid-gone", time.Hour)
	if err := e.cs.Cilium().CiliumV2().CiliumEndpoints("default").Delete(context.Background(), "gone", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if res := e.gc(time.Minute).Pass(context.Background()); res.Failed != 0 || res.Err != nil {
		t.Errorf("Pass = %+v, want no failure for a CiliumEndpoint already deleted", res)
	}
}

// markable registers an initializer on a table and returns its completion.
func markable[T any](e *env, table statedb.RWTable[T]) func() {
	txn := e.db.WriteTxn(table)
	done := table.RegisterInitializer(txn, "test")
	txn.Commit()
	return func() {
		txn := e.db.WriteTxn(table)
		done(txn)
		txn.Commit()
	}
}

func TestRunWaitsForEveryTable(t *testing.T) {
	e := newEnv(t)
	initPods, initCEPs, initNodes := markable(e, e.pods), markable(e, e.ceps), markable(e, e.nodes)
	e.cep("default", "gone", "uid-gone", time.Hour)

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { _ = e.gc(20 * time.Millisecond).Run(ctx) })
	defer func() { cancel(); wg.Wait() }()

	// An empty pods table that is not yet listed says nothing about pods.
	initCEPs()
	initNodes()
	// The GC says it waits for the tables; only the pods table can let it
	// pass, so nothing was deleted.
	k8stest.Eventually(t, "the GC waiting for the tables", func() error {
		if _, msg, _ := e.health.Last(); !strings.HasPrefix(msg, "waiting for the pods") {
			return fmt.Errorf("health %q", msg)
		}
		return nil
	})
	if n := e.deletes(); n != 0 {
		t.Fatalf("%d deletes before the pods table was initialized", n)
	}
	initPods()
	k8stest.Eventually(t, "the stale CiliumEndpoint deleted", func() error {
		if got := e.remaining(); len(got) != 0 {
			return fmt.Errorf("remaining %q", got)
		}
		return nil
	})
}

func TestRunPeriodically(t *testing.T) {
	e := newEnv(t)
	p := e.pod("web", "uid-web", corev1.PodRunning)
	e.cep("default", "web", "uid-web", time.Hour)

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { _ = e.gc(20 * time.Millisecond).Run(ctx) })
	defer func() { cancel(); wg.Wait() }()

	// Three passes (each reports its outcome) leave the live pod's CEP.
	k8stest.Eventually(t, "three GC passes", func() error {
		if n := e.health.Reports(); n < 4 { // "waiting", then one per pass
			return fmt.Errorf("%d reports", n)
		}
		return nil
	})
	if got := e.remaining(); len(got) != 1 {
		t.Fatalf("remaining %q: the live pod's CiliumEndpoint was deleted", got)
	}
	// The pod goes while the agent of its node is down.
	remove(e, e.pods, p)
	k8stest.Eventually(t, "the CiliumEndpoint deleted", func() error {
		if got := e.remaining(); len(got) != 0 {
			return fmt.Errorf("remaining %q", got)
		}
		return nil
	})
	k8stest.Eventually(t, "healthy", func() error {
		if l, msg, err := e.health.Last(); l != "ok" || err != nil {
			return fmt.Errorf("health %s %q %v", l, msg, err)
		}
		return nil
	})
}
