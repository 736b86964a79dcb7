package identity

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cilium/statedb"
	apiextclientset "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	k8sfake "k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	"github.com/cellium/cellium/api/client/clientset/versioned"
	ciliumfake "github.com/cellium/cellium/api/client/clientset/versioned/fake"
	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/cells/hive/hivetest"
	"github.com/cellium/cellium/cells/k8s"
	"github.com/cellium/cellium/statedb/identity"
	k8stables "github.com/cellium/cellium/statedb/k8s"
	"github.com/cellium/cellium/statedb/labels"
)

// fakeClientset is a k8s.Clientset over the generated fakes.
type fakeClientset struct {
	kubernetes.Interface
	cilium *ciliumfake.Clientset
	// watches counts the CiliumIdentity watches the test mirrors made.
	watches atomic.Int32
}

// waitWatching waits until a mirror of this fake watches its
// CiliumIdentities: the fake's tracker delivers a change only to watches
// made before it, so a change between the mirror's list and its watch
// would never reach the table (a real API server replays it from the
// list's resourceVersion).
func (f *fakeClientset) waitWatching(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for f.watches.Load() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the CiliumIdentity mirror never started its watch")
		}
		time.Sleep(time.Millisecond)
	}
}

func newFakeClientset(objs ...runtime.Object) *fakeClientset {
	return &fakeClientset{Interface: k8sfake.NewClientset(), cilium: ciliumfake.NewSimpleClientset(objs...)}
}

func (f *fakeClientset) Cilium() versioned.Interface              { return f.cilium }
func (f *fakeClientset) APIExtensions() apiextclientset.Interface { return nil }
func (f *fakeClientset) RESTConfig() *rest.Config                 { return &rest.Config{} }
func (f *fakeClientset) IsEnabled() bool                          { return true }

// cids returns the fake's CiliumIdentities by name.
func (f *fakeClientset) cids(t *testing.T) map[string]*ciliumv2.CiliumIdentity {
	t.Helper()
	list, err := f.cilium.CiliumV2().CiliumIdentities().List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*ciliumv2.CiliumIdentity{}
	for i := range list.Items {
		out[list.Items[i].Name] = &list.Items[i]
	}
	return out
}

// fakeIdentitiesCell fills the CiliumIdentity table from the clientset, as
// the k8s cells do against a real API server (their ListerWatcher needs a
// REST client, which the fake has not).
var fakeIdentitiesCell = hive.Module("fake-identities", "CiliumIdentities of the fake clientset",
	hive.ProvidePrivate(k8stables.NewCiliumIdentitiesTable),
	hive.Provide(statedb.RWTable[*ciliumv2.CiliumIdentity].ToTable),
	hive.Invoke(mirrorIdentities),
)

func mirrorIdentities(db *statedb.DB, table statedb.RWTable[*ciliumv2.CiliumIdentity], cs k8s.Clientset, jobs hive.Jobs) {
	txn := db.WriteTxn(table)
	done := table.RegisterInitializer(txn, "fake-reflector")
	txn.Commit()
	client := cs.Cilium().CiliumV2().CiliumIdentities()
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			return client.List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			w, err := client.Watch(ctx, o)
			if f, ok := cs.(*fakeClientset); ok && err == nil {
				f.watches.Add(1)
			}
			return w, err
		},
	}
	store := &tableStore{db: db, table: table, initDone: done}
	lwSemantics := cache.ToListWatcherWithWatchListSemantics(lw, cs.Cilium())
	jobs.Add(hive.Service("mirror", nil, func(ctx context.Context, _ hive.Health) {
		r := cache.NewReflectorWithOptions(lwSemantics, &ciliumv2.CiliumIdentity{}, store, cache.ReflectorOptions{Name: "fake-identities"})
		r.RunWithContext(ctx)
	}))
}

type tableStore struct {
	db       *statedb.DB
	table    statedb.RWTable[*ciliumv2.CiliumIdentity]
	initDone func(statedb.WriteTxn)
}

func (s *tableStore) Add(obj any) error    { return s.write(obj.(*ciliumv2.CiliumIdentity), false) }
func (s *tableStore) Update(obj any) error { return s.write(obj.(*ciliumv2.CiliumIdentity), false) }
func (s *tableStore) Resync() error        { return nil }

func (s *tableStore) Delete(obj any) error {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	return s.write(obj.(*ciliumv2.CiliumIdentity), true)
}

func (s *tableStore) write(o *ciliumv2.CiliumIdentity, del bool) error {
	txn := s.db.WriteTxn(s.table)
	defer txn.Abort()
	var err error
	if del {
		_, _, err = s.table.Delete(txn, o)
	} else {
		_, _, err = s.table.Insert(txn, o)
	}
	if err != nil {
		return err
	}
	txn.Commit()
	return nil
}

func (s *tableStore) Replace(list []any, _ string) error {
	txn := s.db.WriteTxn(s.table)
	defer txn.Abort()
	if err := s.table.DeleteAll(txn); err != nil {
		return err
	}
	for _, item := range list {
		if _, _, err := s.table.Insert(txn, item.(*ciliumv2.CiliumIdentity)); err != nil {
			return err
		}
	}
	if s.initDone != nil {
		s.initDone(txn)
		s.initDone = nil
	}
	txn.Commit()
	return nil
}

// testAgent is one agent's allocator in a partial hive.
type testAgent struct {
	alloc *allocator
	db    *statedb.DB
	h     *hive.Hive
}

// startAgent starts the allocator cell against cs. With opts the range and
// timeout are those instead of the flags'.
func startAgent(t testing.TB, cs k8s.Clientset, opts *allocatorOptions, extra ...hive.Cell) *testAgent {
	t.Helper()
	return startAgentArgs(t, cs, opts, nil, extra...)
}

// startAgentArgs is startAgent with command-line flags.
func startAgentArgs(t testing.TB, cs k8s.Clientset, opts *allocatorOptions, args []string, extra ...hive.Cell) *testAgent {
	t.Helper()
	cell := Cell
	if opts != nil {
		cell = hive.Module("identity-allocator", "Allocator with a test range",
			hive.Config(DefaultConfig),
			hive.ProvidePrivate(identity.NewAllocationsTable),
			hive.Provide(func(p allocatorParams) (Allocator, error) { return startAllocator(p, *opts) }),
		)
	}
	var (
		a  Allocator
		db *statedb.DB
	)
	cells := append([]hive.Cell{
		hive.Provide(func() k8s.Clientset { return cs }),
		fakeIdentitiesCell,
		cell,
		hivetest.Capture(&a),
		hivetest.Capture(&db),
	}, extra...)
	h := hivetest.Start(t, args, cells...)
	return &testAgent{alloc: a.(*allocator), db: db, h: h}
}

// refs returns this agent's reference count of id (0: not held).
func (ta *testAgent) refs(id identity.NumericIdentity) int {
	row, _, ok := ta.alloc.allocs.Get(ta.db.ReadTxn(), identity.AllocationIDIndex.Query(id))
	if !ok {
		return 0
	}
	return row.Refs
}

func podLabels(app, ns string) labels.Labels {
	return labels.ParseLabels("k8s:app="+app, "k8s:io.kubernetes.pod.namespace="+ns,
		"k8s:io.cilium.k8s.policy.cluster=default", "k8s:io.cilium.k8s.policy.serviceaccount=default")
}

func ctxTimeout(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), d)
	t.Cleanup(cancel)
	return ctx
}

func eventually(t *testing.T, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s: %v", what, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func cidObject(name string, created time.Time, lbls ...string) *ciliumv2.CiliumIdentity {
	return &ciliumv2.CiliumIdentity{
		ObjectMeta:     metav1.ObjectMeta{Name: name, CreationTimestamp: metav1.NewTime(created)},
		SecurityLabels: labels.ParseLabels(lbls...).Map(),
	}
}
