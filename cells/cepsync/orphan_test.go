package cepsync

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/cilium/statedb"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	k8stesting "k8s.io/client-go/testing"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	"github.com/cellium/cellium/api/client/clientset/versioned/fake"
	k8stables "github.com/cellium/cellium/statedb/k8s"
)

// orphanEnv is a target over a fake API server whose CEP mirror and pods
// table the test writes, with a clock the test moves.
type orphanEnv struct {
	t      *testing.T
	db     *statedb.DB
	ceps   statedb.RWTable[*ciliumv2.CiliumEndpoint]
	pods   statedb.RWTable[*corev1.Pod]
	client *fake.Clientset
	tg     *target
	now    time.Time
}

func newOrphanEnv(t *testing.T) *orphanEnv {
	e := &orphanEnv{t: t, db: statedb.New(), client: fake.NewSimpleClientset(), now: time.Unix(1000, 0)}
	var err error
	if e.ceps, err = k8stables.NewCiliumEndpointsTable(e.db); err != nil {
		t.Fatal(err)
	}
	if e.pods, err = k8stables.NewPodsTable(e.db); err != nil {
		t.Fatal(err)
	}
	if err := e.db.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.db.Stop() })
	// The API server gives every object a UID; the fake does not.
	uids := 0
	e.client.PrependReactor("create", "ciliumendpoints", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if o := a.(k8stesting.CreateAction).GetObject().(metav1.Object); o.GetUID() == "" {
			uids++
			o.SetUID(types.UID(fmt.Sprintf("cep-uid-%d", uids)))
		}
		return false, nil, nil
	})
	e.tg = &target{log: slog.New(slog.DiscardHandler), client: e.client, db: e.db, ceps: e.ceps, pods: e.pods,
		nodeIP: func() string { return "192.0.2.10" }, uids: map[string]types.UID{},
		gcGrace: GCGrace, now: func() time.Time { return e.now }}
	return e
}

func (e *orphanEnv) desired(name, podUID string) *DesiredCEP {
	return &DesiredCEP{Namespace: "ns", Name: name, PodName: name, PodUID: podUID, EndpointID: 1,
		Status: ciliumv2.EndpointStatus{ID: 1, State: ciliumv2.EndpointStateReady,
			Networking: &ciliumv2.EndpointNetworking{NodeIP: "192.0.2.10"}}}
}

// create writes d's CEP through the target and mirrors it, as the
// agent's watch would.
func (e *orphanEnv) create(d *DesiredCEP) *ciliumv2.CiliumEndpoint {
	if err := e.tg.Update(context.Background(), nil, d); err != nil {
		e.t.Fatal(err)
	}
	cep, err := e.client.CiliumV2().CiliumEndpoints(d.Namespace).Get(context.Background(), d.Name, metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	e.mirror(cep, false)
	return cep
}

func (e *orphanEnv) mirror(cep *ciliumv2.CiliumEndpoint, deleted bool) {
	txn := e.db.WriteTxn(e.ceps)
	if deleted {
		_, _, _ = e.ceps.Delete(txn, cep)
	} else {
		_, _, _ = e.ceps.Insert(txn, cep)
	}
	txn.Commit()
}

// pod puts the pod into the agent's table (terminating with deleting),
// or removes it (nil).
func (e *orphanEnv) pod(name, uid string, state string) {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: types.UID(uid)}}
	txn := e.db.WriteTxn(e.pods)
	switch state {
	case "gone":
		_, _, _ = e.pods.Delete(txn, p)
	case "terminating":
		p.DeletionTimestamp = &metav1.Time{Time: e.now}
		_, _, _ = e.pods.Insert(txn, p)
	default:
		_, _, _ = e.pods.Insert(txn, p)
	}
	txn.Commit()
}

func (e *orphanEnv) sweepAt(after time.Duration, start time.Time) {
	e.now = start.Add(after)
	if err := e.tg.sweepOrphans(context.Background()); err != nil {
		e.t.Fatal(err)
	}
}

// writes are the write requests the fake API server got, as "verb name".
func (e *orphanEnv) writes() []string {
	var out []string
	for _, a := range e.client.Actions() {
		switch a.GetVerb() {
		case "create", "update", "patch", "delete":
			name := ""
			switch a := a.(type) {
			case k8stesting.CreateAction:
				name = a.GetObject().(metav1.Object).GetName()
			case k8stesting.DeleteAction:
				name = a.GetName()
			case k8stesting.PatchAction:
				name = a.GetName()
			}
			out = append(out, a.GetVerb()+" "+name)
		}
	}
	return out
}

func (e *orphanEnv) exists(name string) bool {
	_, err := e.client.CiliumV2().CiliumEndpoints("ns").Get(context.Background(), name, metav1.GetOptions{})
	return err == nil
}

func equalWrites(t *testing.T, got []string, want ...string) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("writes %q, want %q", got, want)
	}
	for i := range got {
		if got[i] != want[i] {
			t.Fatalf("writes %q, want %q", got, want)
		}
	}
}

// The CEP of a deleted endpoint whose pod is going: created once (no read
// first), then left to the garbage collector, which deletes it once the
// pod is gone; the agent writes nothing more.
func TestOrphanLeftToGarbageCollector(t *testing.T) {
	e := newOrphanEnv(t)
	e.pod("web", "pod-1", "")
	cep := e.create(e.desired("web", "pod-1"))
	e.pod("web", "pod-1", "terminating")
	start := e.now
	if err := e.tg.Delete(context.Background(), nil, e.desired("web", "pod-1")); err != nil {
		t.Fatal(err)
	}
	e.sweepAt(2*time.Second, start)
	e.pod("web", "pod-1", "gone")
	e.sweepAt(4*time.Second, start)
	if !e.exists("web") {
		t.Fatal("the agent deleted the CEP within the garbage collector's grace")
	}
	// The garbage collector deletes it.
	if err := e.client.CiliumV2().CiliumEndpoints("ns").Delete(context.Background(), "web", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.mirror(cep, true)
	e.sweepAt(GCGrace+time.Second, start)
	equalWrites(t, e.writes(), "create web", "delete web") // the agent's create, the collector's delete
	if _, ok := e.tg.orphan("ns/web"); ok {
		t.Error("the collected CEP is still an orphan")
	}
	// Prune, meanwhile, had left it alone too.
}

// Without a garbage collector (a bare API server) the agent deletes the
// CEP itself GCGrace after its endpoint went, by UID; a CEP of the same
// name created since by someone else is never deleted.
func TestOrphanWithoutGarbageCollector(t *testing.T) {
	e := newOrphanEnv(t)
	e.pod("web", "pod-1", "")
	cep := e.create(e.desired("web", "pod-1"))
	e.pod("web", "pod-1", "gone")
	start := e.now
	if err := e.tg.Delete(context.Background(), nil, e.desired("web", "pod-1")); err != nil {
		t.Fatal(err)
	}
	// Prune within the grace leaves it (the collector's), and deletes it
	// after.
	e.now = start.Add(GCGrace / 2)
	if !e.tg.leftToGC(cep) {
		t.Error("Prune would delete the CEP within the garbage collector's grace")
	}
	e.sweepAt(GCGrace-time.Second, start)
	equalWrites(t, e.writes(), "create web")
	e.sweepAt(GCGrace, start)
	equalWrites(t, e.writes(), "create web", "delete web")
	if e.exists("web") {
		t.Fatal("CEP still there after the grace")
	}
	if e.tg.leftToGC(cep) {
		t.Error("still left to the garbage collector after the sweep")
	}

	// Another: its CEP is replaced (another UID) before the grace ends.
	e.pod("db", "pod-2", "")
	old := e.create(e.desired("db", "pod-2"))
	e.pod("db", "pod-2", "gone")
	start = e.now
	if err := e.tg.Delete(context.Background(), nil, e.desired("db", "pod-2")); err != nil {
		t.Fatal(err)
	}
	_ = e.client.CiliumV2().CiliumEndpoints("ns").Delete(context.Background(), "db", metav1.DeleteOptions{})
	other := old.DeepCopy()
	other.UID = "someone-else"
	if _, err := e.client.CiliumV2().CiliumEndpoints("ns").Create(context.Background(), other, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.mirror(other, false)
	e.client.ClearActions()
	e.sweepAt(2*GCGrace, start)
	equalWrites(t, e.writes())
	if !e.exists("db") {
		t.Fatal("someone else's CEP was deleted")
	}
}

// A pod that lives on without its endpoint (finished, or its sandbox
// went): the agent deletes the CEP a moment after the endpoint, as soon
// as its pods table could have shown a deletion; a new endpoint of the
// same pod in the meantime adopts the CEP instead (a patch, not a delete
// and a create).
func TestOrphanOfLivingPod(t *testing.T) {
	e := newOrphanEnv(t)
	e.pod("web", "pod-1", "")
	e.create(e.desired("web", "pod-1"))
	start := e.now
	if err := e.tg.Delete(context.Background(), nil, e.desired("web", "pod-1")); err != nil {
		t.Fatal(err)
	}
	e.sweepAt(aliveGrace/2, start)
	equalWrites(t, e.writes(), "create web")
	e.sweepAt(aliveGrace, start)
	equalWrites(t, e.writes(), "create web", "delete web")

	// The same pod's new sandbox before the sweep: adopted.
	e.pod("db", "pod-2", "")
	e.create(e.desired("db", "pod-2"))
	if err := e.tg.Delete(context.Background(), nil, e.desired("db", "pod-2")); err != nil {
		t.Fatal(err)
	}
	e.client.ClearActions()
	again := e.desired("db", "pod-2")
	again.EndpointID, again.Status.ID = 2, 2
	if err := e.tg.Update(context.Background(), nil, again); err != nil {
		t.Fatal(err)
	}
	equalWrites(t, e.writes(), "patch db")
	e.sweepAt(10*GCGrace, e.now)
	equalWrites(t, e.writes(), "patch db")
	if !e.exists("db") {
		t.Fatal("the adopted CEP was deleted")
	}
}

// In slice mode the agent's CEP table comes from the slices, which the
// operator writes up to a few seconds after a CEP: a pod deleted before
// that leaves an orphan the table never showed. Its absence is no proof
// of deletion: without a garbage collector the agent still deletes it
// GCGrace after its endpoint went (read first, by UID), and one the
// collector deleted meanwhile is only read.
func TestOrphanNeverInTable(t *testing.T) {
	e := newOrphanEnv(t)
	e.pod("web", "pod-1", "")
	d := e.desired("web", "pod-1")
	if err := e.tg.Update(context.Background(), nil, d); err != nil { // no mirror: no slice yet
		t.Fatal(err)
	}
	e.pod("web", "pod-1", "gone")
	start := e.now
	if err := e.tg.Delete(context.Background(), nil, d); err != nil {
		t.Fatal(err)
	}
	e.sweepAt(GCGrace-time.Second, start)
	equalWrites(t, e.writes(), "create web")
	e.sweepAt(GCGrace, start)
	equalWrites(t, e.writes(), "create web", "delete web")
	if e.exists("web") {
		t.Fatal("the CEP the table never showed is still there after the grace")
	}
	if _, ok := e.tg.orphan("ns/web"); ok {
		t.Error("still an orphan after its delete")
	}

	// Deleted by the collector meanwhile: one read, no write.
	e.pod("db", "pod-2", "")
	d = e.desired("db", "pod-2")
	if err := e.tg.Update(context.Background(), nil, d); err != nil {
		t.Fatal(err)
	}
	e.pod("db", "pod-2", "gone")
	start = e.now
	if err := e.tg.Delete(context.Background(), nil, d); err != nil {
		t.Fatal(err)
	}
	if err := e.client.CiliumV2().CiliumEndpoints("ns").Delete(context.Background(), "db", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.client.ClearActions()
	e.sweepAt(GCGrace, start)
	equalWrites(t, e.writes())
	if _, ok := e.tg.orphan("ns/db"); ok {
		t.Error("the collected CEP is still an orphan")
	}
}
