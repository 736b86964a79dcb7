package endpointmanager_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cilium/statedb"
	corev1 "k8s.io/api/core/v1"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	"github.com/cellium/cellium/api/v1/models"
	"github.com/cellium/cellium/cells/agentapi"
	"github.com/cellium/cellium/cells/endpointmanager"
	"github.com/cellium/cellium/cells/endpointpolicy/endpointpolicytest"
	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/cells/hive/hivetest"
	identitycell "github.com/cellium/cellium/cells/identity"
	"github.com/cellium/cellium/cells/ipam"
	"github.com/cellium/cellium/cells/k8s"
	"github.com/cellium/cellium/cells/statedir"
	"github.com/cellium/cellium/statedb/bpfprog"
	"github.com/cellium/cellium/statedb/endpoints"
	"github.com/cellium/cellium/statedb/identity"
	k8stables "github.com/cellium/cellium/statedb/k8s"
	"github.com/cellium/cellium/statedb/nodes"
	"github.com/cellium/cellium/statedb/reconciler"
)

// fakeLoader plays the eBPF loader: it keeps a bpf-programs row for each
// endpoint that wants programs, and reconciles it (Done) unless held, or
// fails it with a verifier log for the identities in fail.
type fakeLoader struct {
	db   *statedb.DB
	eps  statedb.Table[*endpoints.Endpoint]
	rows statedb.RWTable[*bpfprog.Program]

	mu   sync.Mutex
	hold bool
	fail map[identity.NumericIdentity]bool
	kick chan struct{}
}

const verifierLog = "the kernel's BPF verifier rejected the program: load program: permission denied:\n\t0: (bf) r0 = r5\n\tR5 !read_ok"

func (f *fakeLoader) set(fn func()) {
	f.mu.Lock()
	fn()
	f.mu.Unlock()
	f.kick <- struct{}{}
}

func (f *fakeLoader) run(ctx context.Context) {
	for {
		txn := f.db.WriteTxn(f.rows)
		eps, watch := f.eps.AllWatch(txn)
		f.mu.Lock()
		for ep := range eps {
			want := bpfprog.Derive(ep, false)
			if want == nil {
				continue
			}
			st := reconciler.Pending()
			if f.fail[ep.Identity] {
				st = reconciler.Failed(fmt.Errorf("%s", verifierLog))
			} else if !f.hold {
				st = reconciler.Done()
			}
			cur, _, ok := f.rows.Get(txn, bpfprog.EndpointIDIndex.Query(ep.ID))
			if !ok || !cur.SameAs(want) || cur.Status.Kind != st.Kind {
				_, _, _ = f.rows.Insert(txn, want.WithStatus(st))
			}
		}
		f.mu.Unlock()
		txn.Commit()
		select {
		case <-ctx.Done():
			return
		case <-watch:
		case <-f.kick:
		}
	}
}

// startWithPrograms is start with the bpf-programs table and the fake
// loader: endpoints are ready only when their programs are.
func startWithPrograms(t *testing.T, seed func(txn statedb.WriteTxn, pods statedb.RWTable[*corev1.Pod])) (*env, *fakeLoader) {
	t.Helper()
	dir := t.TempDir()
	e := &env{ipam: newFakeIPAM(), ids: &fakeIdentities{ids: map[string]identity.NumericIdentity{}, refs: map[identity.NumericIdentity]int{}}}
	fl := &fakeLoader{fail: map[identity.NumericIdentity]bool{}, kick: make(chan struct{}, 1)}
	socket := filepath.Join(t.TempDir(), "api.sock")
	hivetest.Start(t, []string{"--state-dir=" + dir, "--socket-path=" + socket},
		statedir.Cell,
		agentapi.Cell,
		hive.Provide(
			k8stables.NewPodsTable, statedb.RWTable[*corev1.Pod].ToTable,
			k8stables.NewNamespacesTable, statedb.RWTable[*corev1.Namespace].ToTable,
			k8stables.NewNodesTable, statedb.RWTable[*corev1.Node].ToTable,
			nodes.NewLocalNodeTable, statedb.RWTable[*nodes.LocalNode].ToTable,
			k8stables.NewCiliumEndpointsTable, statedb.RWTable[*ciliumv2.CiliumEndpoint].ToTable,
			k8s.DisabledClientset,
			func() ipam.Allocator { return e.ipam },
			allocationsTable,
			func() identitycell.Allocator { return e.ids },
			func() identitycell.LabelFilter { return filter{} },
			func() identitycell.ClusterName { return "default" },
			func() k8s.NodeName { return "node-a" },
			// The loader's table.
			bpfprog.NewTable, statedb.RWTable[*bpfprog.Program].ToTable,
		),
		// The policy engine's table and a stand-in writing it.
		endpointpolicytest.New().Cell(),
		endpointmanager.Cell, identitycell.Responder, ipam.Responder,
		hive.Invoke(func(db *statedb.DB, pods statedb.RWTable[*corev1.Pod], eps statedb.Table[*endpoints.Endpoint], rows statedb.RWTable[*bpfprog.Program]) {
			e.db, e.pods, e.eps = db, pods, eps
			fl.db, fl.eps, fl.rows = db, eps, rows
			txn := db.WriteTxn(pods)
			if seed != nil {
				seed(txn, pods)
			}
			txn.Commit()
		}),
	)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { fl.run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	e.api = &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", socket)
	}}}
	return e, fl
}

// waitEndpoint waits, watching the table, until endpoint id satisfies ok.
func waitEndpoint(t *testing.T, e *env, id uint16, what string, ok func(*endpoints.Endpoint) bool) *endpoints.Endpoint {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		ep, _, watch, found := e.eps.GetWatch(e.db.ReadTxn(), endpoints.IDIndex.Query(id))
		if found && ok(ep) {
			return ep
		}
		select {
		case <-watch:
		case <-deadline:
			t.Fatalf("endpoint %d never %s: %+v", id, what, ep)
		}
	}
}

// With the loader, an endpoint whose identity is resolved stays
// regenerating, and its CNI ADD waits, until its programs are attached;
// then it is ready.
func TestReadyOnlyWhenProgramsAttached(t *testing.T) {
	e, fl := startWithPrograms(t, func(txn statedb.WriteTxn, pods statedb.RWTable[*corev1.Pod]) {
		pods.Insert(txn, pod("web-1", "uid-1", map[string]string{"app": "web"}))
	})
	fl.set(func() { fl.hold = true })
	type result struct {
		code int
		ep   models.Endpoint
	}
	res := make(chan result, 1)
	go func() {
		var r result
		r.code = e.add(t, addReq("c1", "web-1", "10.0.0.10"), &r.ep)
		res <- r
	}()
	// The endpoint row shows up: identity resolved, programs pending.
	var ep *endpoints.Endpoint
	deadline := time.After(10 * time.Second)
	for ep == nil {
		it, watch := e.eps.AllWatch(e.db.ReadTxn())
		for cur := range it {
			if cur.ContainerID == "c1" && cur.Identity != 0 && cur.State == ciliumv2.EndpointStateRegenerating {
				ep = cur
			}
		}
		if ep == nil {
			select {
			case <-watch:
			case <-deadline:
				t.Fatal("the endpoint never reached regenerating with an identity")
			}
		}
	}
	// Its programs row is there, pending: it must not be ready.
	pendingBy := time.After(10 * time.Second)
	for {
		txn := e.db.ReadTxn()
		st, _ := bpfprog.EndpointState(txn, fl.rows, ep)
		if st == bpfprog.StatePending {
			break
		}
		row, _, _ := fl.rows.Get(txn, bpfprog.EndpointIDIndex.Query(ep.ID))
		_, w := fl.rows.AllWatch(txn)
		select {
		case <-w:
		case <-pendingBy:
			t.Fatalf("the programs of endpoint %+v never pending: state %v, row %+v", ep, st, row)
		}
	}
	if cur, _ := waitEndpointNow(e, ep.ID); cur.State != ciliumv2.EndpointStateRegenerating {
		t.Fatalf("endpoint %s with its programs pending, want regenerating", cur.State)
	}
	select {
	case r := <-res:
		t.Fatalf("CNI ADD returned (%d, %s) before the programs were attached", r.code, r.ep.Status.State)
	default:
	}
	fl.set(func() { fl.hold = false })
	r := <-res
	if r.code != 201 || r.ep.Status.State != models.EndpointStateReady {
		txn := e.db.ReadTxn()
		cur, _, _ := e.eps.Get(txn, endpoints.IDIndex.Query(ep.ID))
		row, _, _ := fl.rows.Get(txn, bpfprog.EndpointIDIndex.Query(ep.ID))
		t.Fatalf("ADD: %d, state %s; want 201 ready (endpoint %+v, programs %+v)", r.code, r.ep.Status.State, cur, row)
	}
	if h := r.ep.Status.Health; h == nil || h.Bpf != models.EndpointHealthOK {
		t.Errorf("health %+v, want bpf OK", h)
	}
	last := r.ep.Status.Log[len(r.ep.Status.Log)-1]
	if !strings.Contains(last.Message, "Successfully regenerated endpoint") {
		t.Errorf("last log entry %q", last.Message)
	}
}

func waitEndpointNow(e *env, id uint16) (*endpoints.Endpoint, bool) {
	ep, _, ok := e.eps.Get(e.db.ReadTxn(), endpoints.IDIndex.Query(id))
	return ep, ok
}

// A verifier error for the endpoint's new identity (labels changed) keeps
// it regenerating with the verifier's log as its last (failed) log entry,
// which its CEP status shows as a failure; once a load succeeds it is
// ready again. A CNI ADD whose programs fail gets the log in its error and
// leaves no endpoint.
func TestProgramFailureInEndpointLog(t *testing.T) {
	e, fl := startWithPrograms(t, func(txn statedb.WriteTxn, pods statedb.RWTable[*corev1.Pod]) {
		pods.Insert(txn, pod("web-1", "uid-1", map[string]string{"app": "web"}))
		pods.Insert(txn, pod("bad", "uid-2", map[string]string{"app": "bad"}))
	})
	var ok models.Endpoint
	if code := e.add(t, addReq("c1", "web-1", "10.0.0.10"), &ok); code != 201 || ok.Status.State != models.EndpointStateReady {
		t.Fatalf("ADD web-1: %d %s", code, ok.Status.State)
	}
	// The next identity the fake allocator hands out fails to load.
	next := nextIdentity(e)
	fl.set(func() { fl.fail[next] = true })

	var apiErr models.Error
	if code := e.add(t, addReq("c2", "bad", "10.0.0.11"), &apiErr); code != 503 || !strings.Contains(apiErr.Message, "R5 !read_ok") {
		t.Fatalf("ADD with failing programs: %d %q, want 503 with the verifier log", code, apiErr.Message)
	}
	if _, _, found := e.eps.Get(e.db.ReadTxn(), endpoints.ContainerIndex.Query("c2")); found {
		t.Error("a failed ADD left its endpoint")
	}

	// web-1 moves to a new identity whose programs fail.
	next = nextIdentity(e)
	fl.set(func() { fl.fail[next] = true })
	txn := e.db.WriteTxn(e.pods)
	e.pods.Insert(txn, pod("web-1", "uid-1", map[string]string{"app": "web", "tier": "front"}))
	txn.Commit()
	ep := waitEndpoint(t, e, uint16(ok.ID), "logged the failed load", func(ep *endpoints.Endpoint) bool {
		return ep.Identity == next && strings.Contains(ep.Failure(), "R5 !read_ok")
	})
	if ep.State != ciliumv2.EndpointStateRegenerating {
		t.Errorf("state %s with failed programs, want regenerating", ep.State)
	}
	st := ep.Status("")
	if st.Health.OverallHealth != ciliumv2.EndpointHealthFailure || !strings.Contains(st.Log[len(st.Log)-1].Message, "Failed to load the endpoint's BPF programs") {
		t.Errorf("CEP status: health %s, log %+v", st.Health.OverallHealth, st.Log[len(st.Log)-1])
	}
	var got models.Endpoint
	e.do(t, "GET", fmt.Sprintf("/endpoint/%d", ok.ID), nil, &got)
	if h := got.Status.Health; h == nil || h.Bpf != models.EndpointHealthFailure || h.OverallHealth != models.EndpointHealthFailure {
		t.Errorf("API health %+v, want bpf and overall Failure", h)
	}
	// The loader succeeds (a fixed program): ready.
	fl.set(func() { delete(fl.fail, next) })
	waitEndpoint(t, e, uint16(ok.ID), "ready again", func(ep *endpoints.Endpoint) bool {
		return ep.State == ciliumv2.EndpointStateReady && ep.Identity == next
	})
}

// nextIdentity is the identity the fake allocator hands out next.
func nextIdentity(e *env) identity.NumericIdentity {
	e.ids.mu.Lock()
	defer e.ids.mu.Unlock()
	return identity.NumericIdentity(1000 + len(e.ids.ids))
}
