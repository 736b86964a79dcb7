package endpointmanager_test

import (
	"testing"
	"time"

	"github.com/cilium/statedb"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cellium/cellium/api/v1/models"
	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/statedb/endpoints"
	"github.com/cellium/cellium/statedb/identity"
	"github.com/cellium/cellium/statedb/labels"
)

// namespacesUnlisted is a cell that keeps the namespaces table
// uninitialized, as it is before the agent's first list of namespaces,
// until the returned function lists ns (inserts it and marks the table
// initialized).
func namespacesUnlisted(ns *corev1.Namespace) (hive.Cell, func()) {
	var list func()
	cell := hive.Invoke(func(db *statedb.DB, nss statedb.RWTable[*corev1.Namespace]) {
		txn := db.WriteTxn(nss)
		done := nss.RegisterInitializer(txn, "namespaces-list")
		txn.Commit()
		list = func() {
			txn := db.WriteTxn(nss)
			nss.Insert(txn, ns)
			done(txn)
			txn.Commit()
		}
	})
	return cell, func() { list() }
}

var blueNamespace = &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "default", Labels: map[string]string{"team": "blue"}}}

var blueLabel = labels.Make(labels.SourceK8s, labels.PodNamespaceMetaLabels+".team", "blue")

// TestRestoreWaitsForNamespaces: after a restart with the API server
// back, the pods of the node can be listed before the namespaces (the
// soak saw the lists come seconds apart after an API server restart).
// A restored endpoint keeps its saved labels and identity until the
// namespaces are listed too. Before, restore relabelled it at once with
// its pod's labels but none of its namespace's: it left its identity
// for one without the namespace labels (or, asking for its restored
// number with other labels, got stuck), and moved back a moment later.
func TestRestoreWaitsForNamespaces(t *testing.T) {
	dir := t.TempDir()
	seed := func(txn statedb.WriteTxn, pods statedb.RWTable[*corev1.Pod]) {
		pods.Insert(txn, pod("live", "uid-live", map[string]string{"app": "web"}))
	}
	var live models.Endpoint
	t.Run("first agent", func(t *testing.T) {
		e := start(t, dir, nil, seed)
		txn := e.db.WriteTxn(e.nss)
		e.nss.Insert(txn, blueNamespace)
		txn.Commit()
		req := addReq("c-live", "live", "10.0.0.50")
		req.InterfaceName = "lo"
		e.add(t, req, &live)
		cur, _, _ := e.eps.Get(e.db.ReadTxn(), endpoints.IDIndex.Query(uint16(live.ID)))
		if !cur.Labels.Has(blueLabel) {
			t.Fatalf("the endpoint's labels have no namespace label: %v", cur.Labels)
		}
	})

	unlisted, list := namespacesUnlisted(blueNamespace)
	e := startWith(t, dir, nil, seed, nil, unlisted)
	waitFor(t, "the restored endpoint in service", func() bool {
		cur, _, ok := e.eps.Get(e.db.ReadTxn(), endpoints.IDIndex.Query(uint16(live.ID)))
		return ok && cur.InService() && !cur.IdentityPending
	})
	restored, _, _ := e.eps.Get(e.db.ReadTxn(), endpoints.IDIndex.Query(uint16(live.ID)))
	// The pods are listed, the namespaces are not: restore's second step
	// and the pod-labels observer must leave the endpoint alone.
	deadline := time.Now().Add(500 * time.Millisecond)
	for time.Now().Before(deadline) {
		cur, _, ok := e.eps.Get(e.db.ReadTxn(), endpoints.IDIndex.Query(uint16(live.ID)))
		if !ok {
			t.Fatal("the restored endpoint is gone")
		}
		if !cur.Labels.Has(blueLabel) || cur.Identity != restored.Identity || cur.IdentityPending || cur.Failure() != "" {
			t.Fatalf("with the namespaces not listed yet the restored endpoint was relabelled: labels %v identity %d (was %d) pending %v failure %q",
				cur.Labels, cur.Identity, restored.Identity, cur.IdentityPending, cur.Failure())
		}
		time.Sleep(10 * time.Millisecond)
	}
	list()
	waitFor(t, "the endpoint with its namespace's labels and the same identity", func() bool {
		cur, _, ok := e.eps.Get(e.db.ReadTxn(), endpoints.IDIndex.Query(uint16(live.ID)))
		return ok && cur.Labels.Has(blueLabel) && cur.Identity == restored.Identity && !cur.IdentityPending && cur.Failure() == ""
	})
	if n := e.ids.labelSets(); n != 1 {
		t.Errorf("%d label sets were allocated an identity, want 1 (the endpoint's, with its namespace labels)", n)
	}
}

// TestCreateWaitsForNamespaces: an endpoint created before the namespaces
// are listed gets its namespace's labels from the start, not an identity
// without them that it leaves a moment later.
func TestCreateWaitsForNamespaces(t *testing.T) {
	unlisted, list := namespacesUnlisted(blueNamespace)
	e := startWith(t, t.TempDir(), nil, func(txn statedb.WriteTxn, pods statedb.RWTable[*corev1.Pod]) {
		pods.Insert(txn, pod("web-1", "uid-1", map[string]string{"app": "web"}))
	}, nil, unlisted)
	time.AfterFunc(300*time.Millisecond, list)
	var ep models.Endpoint
	if code := e.add(t, addReq("c1", "web-1", "10.0.0.51"), &ep); code >= 300 {
		t.Fatalf("PUT /endpoint: status %d", code)
	}
	cur, _, ok := e.eps.Get(e.db.ReadTxn(), endpoints.IDIndex.Query(uint16(ep.ID)))
	if !ok || !cur.Labels.Has(blueLabel) {
		t.Fatalf("endpoint created without its namespace's labels: %+v", cur)
	}
	if n := e.ids.labelSets(); n != 1 {
		t.Errorf("%d label sets were allocated an identity, want 1", n)
	}
}

// labelSets is how many distinct label sets were allocated an identity.
func (f *fakeIdentities) labelSets() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.ids)
}

// TestRelabelDropsRestoredNumber: the identity number an endpoint had
// before the restart is offered to the allocator for its saved labels
// only. A pod relabelled while the agent was down asks for its new
// labels without it; before, the request kept the number, the allocator
// tried to grant it to the new labels, refused that as a conflict with
// the number's own labels, and the endpoint stayed stuck until the
// cluster's identities were listed.
func TestRelabelDropsRestoredNumber(t *testing.T) {
	dir := t.TempDir()
	var live models.Endpoint
	t.Run("first agent", func(t *testing.T) {
		e := start(t, dir, nil, func(txn statedb.WriteTxn, pods statedb.RWTable[*corev1.Pod]) {
			pods.Insert(txn, pod("live", "uid-live", map[string]string{"app": "web"}))
		})
		req := addReq("c-live", "live", "10.0.0.52")
		req.InterfaceName = "lo"
		e.add(t, req, &live)
	})
	e := start(t, dir, nil, func(txn statedb.WriteTxn, pods statedb.RWTable[*corev1.Pod]) {
		pods.Insert(txn, pod("live", "uid-live", map[string]string{"app": "db"}))
	})
	dbLabel := labels.Make(labels.SourceK8s, "app", "db")
	waitFor(t, "the restored endpoint relabelled app=db", func() bool {
		cur, _, ok := e.eps.Get(e.db.ReadTxn(), endpoints.IDIndex.Query(uint16(live.ID)))
		return ok && cur.Labels.Has(dbLabel) && !cur.IdentityPending
	})
	req, _, ok := e.reqs.Get(e.db.ReadTxn(), identity.RequestEndpointIndex.Query(uint16(live.ID)))
	if !ok {
		t.Fatal("the endpoint has no identity request")
	}
	if !req.Labels.Has(dbLabel) || req.Restored != identity.InvalidIdentity {
		t.Errorf("the request for the new labels %v still offers the restored number %d", req.Labels, req.Restored)
	}
}
