package identitygc

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"testing"

	"github.com/cilium/statedb"
	apiextclientset "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apiextfake "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset/fake"
	k8serrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	k8sfake "k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"
	k8stesting "k8s.io/client-go/testing"

	"github.com/cellium/cellium/api/client/clientset/versioned"
	ciliumfake "github.com/cellium/cellium/api/client/clientset/versioned/fake"
	"github.com/cellium/cellium/cells/hive"
	k8stables "github.com/cellium/cellium/statedb/k8s"
)

// fakeClientset is a k8s.Clientset over client-go's fakes. The cilium.io
// fake behaves like an API server where the controllers care: it assigns
// UIDs and resourceVersions, rejects an update with a stale
// resourceVersion and a delete whose preconditions do not match.
type fakeClientset struct {
	*k8sfake.Clientset
	cilium *ciliumfake.Clientset
}

func newFakeClientset() *fakeClientset {
	cs := &fakeClientset{Clientset: k8sfake.NewClientset(), cilium: ciliumfake.NewSimpleClientset()}
	enforceVersions(cs.cilium)
	return cs
}

func (c *fakeClientset) Cilium() versioned.Interface { return c.cilium }
func (c *fakeClientset) APIExtensions() apiextclientset.Interface {
	return apiextfake.NewSimpleClientset()
}
func (c *fakeClientset) RESTConfig() *rest.Config { return &rest.Config{} }
func (c *fakeClientset) IsEnabled() bool          { return true }

// enforceVersions makes the fake's writes check and bump resourceVersions
// and honour delete preconditions.
func enforceVersions(cs *ciliumfake.Clientset) {
	var (
		mu  sync.Mutex
		rev = 100
	)
	tracker := cs.Tracker()
	next := func() string { rev++; return strconv.Itoa(rev) }
	current := func(a k8stesting.Action, name string) (metav1.Object, error) {
		obj, err := tracker.Get(a.GetResource(), a.GetNamespace(), name)
		if err != nil {
			return nil, err
		}
		return meta.Accessor(obj)
	}
	cs.PrependReactor("create", "*", func(a k8stesting.Action) (bool, runtime.Object, error) {
		mu.Lock()
		defer mu.Unlock()
		obj := a.(k8stesting.CreateAction).GetObject().DeepCopyObject()
		m, _ := meta.Accessor(obj)
		m.SetResourceVersion(next())
		if m.GetUID() == "" {
			m.SetUID(types.UID(fmt.Sprintf("uid-%s-%d", m.GetName(), rev)))
		}
		if ts := m.GetCreationTimestamp(); ts.IsZero() {
			m.SetCreationTimestamp(metav1.Now())
		}
		return true, obj, tracker.Create(a.GetResource(), obj, a.GetNamespace())
	})
	cs.PrependReactor("update", "*", func(a k8stesting.Action) (bool, runtime.Object, error) {
		mu.Lock()
		defer mu.Unlock()
		obj := a.(k8stesting.UpdateAction).GetObject().DeepCopyObject()
		m, _ := meta.Accessor(obj)
		cur, err := current(a, m.GetName())
		if err != nil {
			return true, nil, err
		}
		if rv := m.GetResourceVersion(); rv != "" && rv != cur.GetResourceVersion() {
			return true, nil, k8serrors.NewConflict(a.GetResource().GroupResource(), m.GetName(),
				fmt.Errorf("resourceVersion %s is stale, current %s", rv, cur.GetResourceVersion()))
		}
		m.SetUID(cur.GetUID())
		m.SetCreationTimestamp(cur.GetCreationTimestamp())
		m.SetResourceVersion(next())
		return true, obj, tracker.Update(a.GetResource(), obj, a.GetNamespace())
	})
	cs.PrependReactor("delete", "*", func(a k8stesting.Action) (bool, runtime.Object, error) {
		mu.Lock()
		defer mu.Unlock()
		d := a.(k8stesting.DeleteActionImpl)
		cur, err := current(a, d.Name)
		if err != nil {
			return true, nil, err
		}
		if p := d.DeleteOptions.Preconditions; p != nil {
			if p.UID != nil && *p.UID != cur.GetUID() || p.ResourceVersion != nil && *p.ResourceVersion != cur.GetResourceVersion() {
				return true, nil, k8serrors.NewConflict(a.GetResource().GroupResource(), d.Name,
					fmt.Errorf("precondition failed: UID in precondition: %v, UID in object meta: %s", *p.UID, cur.GetUID()))
			}
		}
		return true, nil, tracker.Delete(a.GetResource(), a.GetNamespace(), d.Name)
	})
}

// mirror copies a resource from the fake API into a table, as the k8s
// resource cells do from the real one: it lists, marks the table
// initialized when initialized is closed, then follows the watch.
func mirror[T k8stables.Object](t *testing.T, db *statedb.DB, table statedb.RWTable[T],
	list func(context.Context) ([]T, error), watchFn func(context.Context) (watch.Interface, error), initialized <-chan struct{},
) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	wtxn := db.WriteTxn(table)
	done := table.RegisterInitializer(wtxn, "test-mirror")
	wtxn.Commit()
	w, err := watchFn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := list(ctx)
	if err != nil {
		t.Fatal(err)
	}
	write := func(fn func(statedb.WriteTxn)) {
		wtxn := db.WriteTxn(table)
		fn(wtxn)
		wtxn.Commit()
	}
	write(func(txn statedb.WriteTxn) {
		for _, o := range objs {
			_, _, _ = table.Insert(txn, o)
		}
	})
	var wg sync.WaitGroup
	wg.Go(func() {
		select {
		case <-initialized:
			write(done)
		case <-ctx.Done():
		}
	})
	wg.Go(func() {
		for ev := range w.ResultChan() {
			o, ok := ev.Object.(T)
			if !ok {
				continue
			}
			write(func(txn statedb.WriteTxn) {
				if ev.Type == watch.Deleted {
					_, _, _ = table.Delete(txn, o)
				} else {
					_, _, _ = table.Insert(txn, o)
				}
			})
		}
	})
	t.Cleanup(func() {
		cancel()
		w.Stop()
		wg.Wait()
	})
}

// closed is an already closed channel: "initialized at once".
func closed() <-chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}

// healthRecorder is a hive.Health that keeps the last report.
type healthRecorder struct {
	mu    sync.Mutex
	level hive.Level
	msg   string
	err   error
}

func (h *healthRecorder) set(l hive.Level, msg string, err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.level, h.msg, h.err = l, msg, err
}

func (h *healthRecorder) OK(msg string)                { h.set(hive.LevelOK, msg, nil) }
func (h *healthRecorder) Degraded(msg string, e error) { h.set(hive.LevelDegraded, msg, e) }
func (h *healthRecorder) Stopped(msg string)           { h.set(hive.LevelStopped, msg, nil) }
func (h *healthRecorder) Scope(string) hive.Health     { return h }

func (h *healthRecorder) last() (hive.Level, string, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.level, h.msg, h.err
}
