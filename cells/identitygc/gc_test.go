package identitygc

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
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/cells/hive/hivetest"
	"github.com/cellium/cellium/cells/k8s/k8stest"
	k8stables "github.com/cellium/cellium/statedb/k8s"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("k8s.io/klog/v2.(*loggingT).flushDaemon"))
}

// env is a fake API server and the two tables. The identities table is
// copied from the fake API by sync (or by a mirror); the CiliumEndpoints
// table is fed by the test.
type env struct {
	t      *testing.T
	cs     *k8stest.Clientset
	db     *statedb.DB
	cids   statedb.RWTable[*ciliumv2.CiliumIdentity]
	ceps   statedb.RWTable[*ciliumv2.CiliumEndpoint]
	health *k8stest.HealthRecorder
	clock  time.Time
}

func newEnv(t *testing.T) *env {
	t.Helper()
	e := &env{t: t, cs: k8stest.NewClientset(), db: statedb.New(), health: &k8stest.HealthRecorder{},
		clock: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	var err error
	if e.cids, err = k8stables.NewCiliumIdentitiesTable(e.db); err != nil {
		t.Fatal(err)
	}
	if e.ceps, err = k8stables.NewCiliumEndpointsTable(e.db); err != nil {
		t.Fatal(err)
	}
	if err := e.db.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.db.Stop() })
	return e
}

var testConfig = Config{
	IdentityGCInterval:       time.Minute,
	IdentityHeartbeatTimeout: 30 * time.Minute,
	IdentityGCRateInterval:   time.Minute,
	IdentityGCRateLimit:      2500,
}

// gc returns a collector whose clock is e.clock.
func (e *env) gc(cfg Config) *GC {
	g := NewGC(cfg, e.cs.Cilium().CiliumV2().CiliumIdentities(),
		Tables{DB: e.db, Identities: e.cids, Endpoints: e.ceps}, hivetest.Logger(e.t), e.health)
	g.now = func() time.Time { return e.clock }
	return g
}

func (e *env) identity(name string) {
	e.t.Helper()
	cid := &ciliumv2.CiliumIdentity{ObjectMeta: metav1.ObjectMeta{Name: name}, SecurityLabels: map[string]string{"k8s:app": name}}
	if _, err := e.cs.Cilium().CiliumV2().CiliumIdentities().Create(context.Background(), cid, metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
}

// sync makes the identities table equal to the fake API, as the reflector
// would.
func (e *env) sync() {
	e.t.Helper()
	l, err := e.cs.Cilium().CiliumV2().CiliumIdentities().List(context.Background(), metav1.ListOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	txn := e.db.WriteTxn(e.cids)
	defer txn.Commit()
	have := map[string]bool{}
	for i := range l.Items {
		cid := &l.Items[i]
		have[cid.Name] = true
		if old, _, ok := e.cids.Get(txn, k8stables.NameIndex[*ciliumv2.CiliumIdentity]().Query(cid.Name)); ok && old.ResourceVersion == cid.ResourceVersion {
			continue
		}
		if _, _, err := e.cids.Insert(txn, cid); err != nil {
			e.t.Fatal(err)
		}
	}
	for cid := range e.cids.All(txn) {
		if !have[cid.Name] {
			_, _, _ = e.cids.Delete(txn, cid)
		}
	}
}

// use puts a CiliumEndpoint with identity id into the table (id 0: none).
func (e *env) use(cep string, id int64) {
	c := &ciliumv2.CiliumEndpoint{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: cep}}
	if id != 0 {
		c.Status.Identity = &ciliumv2.EndpointIdentity{ID: id}
	}
	txn := e.db.WriteTxn(e.ceps)
	if _, _, err := e.ceps.Insert(txn, c); err != nil {
		e.t.Fatal(err)
	}
	txn.Commit()
}

// api returns the identities in the fake API: name -> marked.
func (e *env) api() map[string]bool {
	e.t.Helper()
	l, err := e.cs.Cilium().CiliumV2().CiliumIdentities().List(context.Background(), metav1.ListOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	out := map[string]bool{}
	for _, c := range l.Items {
		_, out[c.Name] = c.Annotations[ciliumv2.HeartbeatAnnotation]
	}
	return out
}

func (e *env) wantAPI(want map[string]bool) {
	e.t.Helper()
	got := e.api()
	if fmt.Sprint(got) != fmt.Sprint(want) {
		e.t.Fatalf("identities (name:marked) %v, want %v", got, want)
	}
}

// stepper drives a term by hand: sync the table, observe its changes,
// run a pass.
type stepper struct {
	e       *env
	term    *term
	changes statedb.ChangeIterator[*ciliumv2.CiliumIdentity]
}

func (e *env) newStepper(cfg Config) *stepper {
	e.sync()
	wtxn := e.db.WriteTxn(e.cids)
	changes, err := e.cids.Changes(wtxn)
	wtxn.Commit()
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(changes.Close)
	s := &stepper{e: e, term: e.gc(cfg).newTerm(), changes: changes}
	s.observe()
	return s
}

func (s *stepper) observe() {
	s.e.sync()
	seq, _ := s.changes.Next(s.e.db.ReadTxn())
	s.term.observe(seq)
}

// pass advances the clock to at, observes and runs a pass.
func (s *stepper) pass(at time.Duration) passResult {
	s.e.t.Helper()
	s.e.clock = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).Add(at)
	s.observe()
	res := s.term.pass(context.Background())
	if res.err != nil {
		s.e.t.Fatalf("pass at +%s: %v", at, res.err)
	}
	s.observe()
	return res
}

func TestMarkThenDelete(t *testing.T) {
	e := newEnv(t)
	for _, name := range []string{"1000", "1001", "1002", "5", "200", "abc", "01003", "16777217"} {
		e.identity(name)
	}
	e.use("web", 1000)
	e.use("no-identity-yet", 0)
	s := e.newStepper(testConfig)

	// At the start of the term every identity counts as just used.
	res := s.pass(0)
	if res.checked != 3 || res.used != 1 || res.marked != 0 || res.deleted != 0 {
		t.Errorf("first pass %+v, want 3 checked (reserved, user-reserved, local and odd names skipped), 1 used", res)
	}
	if res := s.pass(30*time.Minute - time.Second); res.marked != 0 {
		t.Errorf("marked %d before the heartbeat timeout", res.marked)
	}
	// One timeout unused: marked, not deleted.
	if res := s.pass(30 * time.Minute); res.marked != 2 || res.deleted != 0 {
		t.Errorf("pass at the timeout %+v, want 2 marked", res)
	}
	e.wantAPI(map[string]bool{"1000": false, "1001": true, "1002": true, "5": false, "200": false, "abc": false, "01003": false, "16777217": false})

	// 1002 is used again before the next pass: unmarked, kept. 1001 is
	// still unused: deleted.
	e.use("api", 1002)
	res = s.pass(31 * time.Minute)
	if res.deleted != 1 || res.unmarked != 1 {
		t.Errorf("pass after the mark %+v, want 1 deleted, 1 unmarked", res)
	}
	e.wantAPI(map[string]bool{"1000": false, "1002": false, "5": false, "200": false, "abc": false, "01003": false, "16777217": false})

	// 1000 has been used all along: never marked, however long it lives.
	e.use("api", 0)
	for at := 32 * time.Minute; at < 3*time.Hour; at += 10 * time.Minute {
		s.pass(at)
	}
	e.wantAPI(map[string]bool{"1000": false, "5": false, "200": false, "abc": false, "01003": false, "16777217": false})
}

func TestForeignChangeCountsAsUse(t *testing.T) {
	e := newEnv(t)
	e.identity("1000")
	s := e.newStepper(testConfig)
	s.pass(0)
	s.pass(30 * time.Minute)
	e.wantAPI(map[string]bool{"1000": true})

	// An agent takes the identity again and removes the mark (before its
	// CiliumEndpoint shows the identity).
	cid, err := e.cs.Cilium().CiliumV2().CiliumIdentities().Get(context.Background(), "1000", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	delete(cid.Annotations, ciliumv2.HeartbeatAnnotation)
	if _, err := e.cs.Cilium().CiliumV2().CiliumIdentities().Update(context.Background(), cid, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.clock = e.clock.Add(time.Minute)
	s.observe()
	// Neither deleted nor marked again until a whole timeout has passed.
	s.pass(32 * time.Minute)
	s.pass(60 * time.Minute)
	e.wantAPI(map[string]bool{"1000": false})
	s.pass(61 * time.Minute)
	e.wantAPI(map[string]bool{"1000": true})
}

func TestStaleTableNeverDeletesUnmarked(t *testing.T) {
	e := newEnv(t)
	e.identity("1000")
	s := e.newStepper(testConfig)
	s.pass(0)
	s.pass(30 * time.Minute)

	// The agent unmarks it, but the table has not seen that yet: the
	// delete carries the old resourceVersion and is refused.
	cid, _ := e.cs.Cilium().CiliumV2().CiliumIdentities().Get(context.Background(), "1000", metav1.GetOptions{})
	delete(cid.Annotations, ciliumv2.HeartbeatAnnotation)
	if _, err := e.cs.Cilium().CiliumV2().CiliumIdentities().Update(context.Background(), cid, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.clock = time.Date(2026, 1, 1, 0, 31, 0, 0, time.UTC)
	res := s.term.pass(context.Background())
	if res.deleted != 0 || res.err != nil {
		t.Errorf("pass %+v, want nothing deleted and no error", res)
	}
	e.wantAPI(map[string]bool{"1000": false})
}

func TestUsedWhileDeleting(t *testing.T) {
	e := newEnv(t)
	e.identity("1000")
	s := e.newStepper(testConfig)
	s.pass(0)
	s.pass(30 * time.Minute)
	// A CiliumEndpoint with the identity appears; the identity object
	// itself is untouched. The pass sees the use and unmarks.
	e.use("late", 1000)
	if res := s.pass(31 * time.Minute); res.deleted != 0 || res.unmarked != 1 {
		t.Errorf("pass %+v, want the identity unmarked, not deleted", res)
	}
	e.wantAPI(map[string]bool{"1000": false})
}

func TestNewTermWaitsForTimeout(t *testing.T) {
	e := newEnv(t)
	e.identity("1000")
	// Marked by the previous leader, who then went away.
	cid, _ := e.cs.Cilium().CiliumV2().CiliumIdentities().Get(context.Background(), "1000", metav1.GetOptions{})
	cid.Annotations = map[string]string{ciliumv2.HeartbeatAnnotation: "2025-12-31T23:00:00Z"}
	if _, err := e.cs.Cilium().CiliumV2().CiliumIdentities().Update(context.Background(), cid, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	s := e.newStepper(testConfig)
	s.pass(0)
	s.pass(29 * time.Minute)
	e.wantAPI(map[string]bool{"1000": true})
	s.pass(30 * time.Minute)
	e.wantAPI(map[string]bool{})
}

func TestDeletionsRateLimited(t *testing.T) {
	e := newEnv(t)
	for i := range 5 {
		e.identity(fmt.Sprint(1000 + i))
	}
	cfg := testConfig
	cfg.IdentityGCRateLimit, cfg.IdentityGCRateInterval = 2, time.Hour
	s := e.newStepper(cfg)
	s.pass(0)
	s.pass(30 * time.Minute)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	e.clock = e.clock.Add(time.Minute)
	res := s.term.pass(ctx)
	if res.deleted != 2 {
		t.Errorf("deleted %d in one pass, want the limit of 2", res.deleted)
	}
	if n := len(e.api()); n != 3 {
		t.Errorf("%d identities left, want 3", n)
	}
}

func TestCollectable(t *testing.T) {
	for name, want := range map[string]bool{
		"256": true, "65535": true, "65536": true, "16777215": true,
		"0": false, "1": false, "8": false, "104": false, "128": false, "255": false,
		"16777217": false, "33554432": false, "0256": false, "+256": false, "": false, "abc": false, "-1": false,
	} {
		if _, got := collectable(name); got != want {
			t.Errorf("collectable(%q) = %v, want %v", name, got, want)
		}
	}
}

// runEnv starts Run on e with real time and a mirror of the identities.
func (e *env) run(cfg Config, initialized <-chan struct{}) {
	api := e.cs.Cilium().CiliumV2().CiliumIdentities()
	k8stest.Mirror(e.t, e.db, e.cids, api, initialized)
	g := e.gc(cfg)
	g.now = time.Now
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := g.Run(ctx); err != nil {
			e.t.Errorf("Run: %v", err)
		}
	})
	e.t.Cleanup(func() { cancel(); wg.Wait() })
}

var fastConfig = Config{
	IdentityGCInterval:       20 * time.Millisecond,
	IdentityHeartbeatTimeout: 100 * time.Millisecond,
	IdentityGCRateInterval:   time.Second,
	IdentityGCRateLimit:      100,
}

func TestRunWaitsForTables(t *testing.T) {
	e := newEnv(t)
	e.identity("1000")
	txn := e.db.WriteTxn(e.ceps)
	cepsDone := e.ceps.RegisterInitializer(txn, "test")
	txn.Commit()
	e.run(fastConfig, k8stest.Closed())

	// The GC says it waits for the tables; the CiliumEndpoints table holds
	// it there, so it wrote nothing.
	k8stest.Eventually(t, "the GC waiting for the tables", func() error {
		if _, msg, _ := e.health.Last(); !strings.HasPrefix(msg, "waiting for the CiliumIdentities") {
			return fmt.Errorf("health %q", msg)
		}
		return nil
	})
	for _, a := range e.cs.CiliumFake.Actions() {
		if v := a.GetVerb(); v != "list" && v != "watch" && v != "get" && v != "create" {
			t.Fatalf("%s before the CiliumEndpoints table was initialized", v)
		}
	}
	txn = e.db.WriteTxn(e.ceps)
	cepsDone(txn)
	txn.Commit()
	k8stest.Eventually(t, "the unused identity deleted", func() error {
		if got := e.api(); len(got) != 0 {
			return fmt.Errorf("identities %v", got)
		}
		return nil
	})
}

func TestRunKeepsUsed(t *testing.T) {
	e := newEnv(t)
	e.identity("1000")
	e.identity("1001")
	e.use("web", 1000)
	e.run(fastConfig, k8stest.Closed())
	k8stest.Eventually(t, "the unused identity deleted", func() error {
		if got := e.api(); !slices.Equal(keys(got), []string{"1000"}) {
			return fmt.Errorf("identities %v", got)
		}
		return nil
	})
	// Several more passes (each reports) keep the used identity.
	n := e.health.Reports()
	k8stest.Eventually(t, "three more GC passes", func() error {
		if got := e.health.Reports(); got < n+3 {
			return fmt.Errorf("%d reports, want %d", got, n+3)
		}
		return nil
	})
	e.wantAPI(map[string]bool{"1000": false})
	k8stest.Eventually(t, "healthy", func() error {
		if l, msg, err := e.health.Last(); l != hive.LevelOK || err != nil {
			return fmt.Errorf("health %s %q %v", l, msg, err)
		}
		return nil
	})
}

func keys(m map[string]bool) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
