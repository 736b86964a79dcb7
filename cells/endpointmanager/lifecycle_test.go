package endpointmanager_test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cilium/statedb"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	"github.com/cellium/cellium/api/v1/models"
	"github.com/cellium/cellium/statedb/endpoints"
	"github.com/cellium/cellium/statedb/identity"
	"github.com/cellium/cellium/statedb/labels"
)

func (e *env) get(id int64) (*endpoints.Endpoint, bool) {
	ep, _, ok := e.eps.Get(e.db.ReadTxn(), endpoints.IDIndex.Query(uint16(id)))
	return ep, ok
}

// health is GET /v1/healthz: its state and the endpoint manager's
// messages.
func (e *env) health(t *testing.T) (string, string) {
	t.Helper()
	var h models.Health
	e.do(t, "GET", "/healthz?verbose=true", nil, &h)
	var msgs []string
	for _, m := range h.Modules {
		if m.Module == "endpoint-manager" && m.Level != "ok" {
			msgs = append(msgs, m.Message+": "+m.Error)
		}
	}
	return h.State, strings.Join(msgs, "\n")
}

func liveSeed(txn statedb.WriteTxn, pods statedb.RWTable[*corev1.Pod]) {
	pods.Insert(txn, pod("live", "uid-live", map[string]string{"app": "web"}))
}

// firstAgent runs an agent that creates the endpoint of pod "live" (its
// host side is "lo", which exists) and stops.
func firstAgent(t *testing.T, dir string) models.Endpoint {
	var live models.Endpoint
	t.Run("first agent", func(t *testing.T) {
		e := start(t, dir, nil, liveSeed)
		req := addReq("c-live", "live", "10.0.0.30")
		req.InterfaceName = "lo"
		if code := e.add(t, req, &live); code != 201 {
			t.Fatalf("create: %d", code)
		}
	})
	return live
}

func newIDs(failN int) *fakeIdentities {
	return &fakeIdentities{ids: map[string]identity.NumericIdentity{}, refs: map[identity.NumericIdentity]int{}, failN: failN}
}

// A restored endpoint whose identity cannot be allocated is stuck: its log
// says why, health is degraded; it is retried with backoff until the
// allocation works, and health is ok again.
func TestRestoredEndpointRetriedUntilIdentity(t *testing.T) {
	dir := t.TempDir()
	live := firstAgent(t, dir)
	ids := newIDs(2)
	e := start(t, dir, ids, liveSeed)

	waitFor(t, "the restored endpoint to be stuck", func() bool {
		ep, ok := e.get(live.ID)
		return ok && ep.Failure() != ""
	})
	// The retrier reports health when it sees the failed row.
	waitFor(t, "healthz to say Degraded while stuck", func() bool {
		state, _ := e.health(t)
		return state == "Degraded"
	})
	state, msg := e.health(t)
	if state != "Degraded" || !strings.Contains(msg, fmt.Sprintf("endpoint %d (default/live)", live.ID)) || !strings.Contains(msg, "denied by admission policy") {
		t.Errorf("healthz while stuck: %s %q", state, msg)
	}
	var got models.Endpoint
	e.do(t, "GET", fmt.Sprintf("/endpoint/%d", live.ID), nil, &got)
	if n := len(got.Status.Log); n == 0 || got.Status.Log[n-1].Code != "failed" || !strings.Contains(got.Status.Log[n-1].Message, "denied") ||
		got.Status.Health.OverallHealth != models.EndpointHealthFailure {
		t.Errorf("status of a stuck endpoint (what its CEP carries): log %+v health %+v", got.Status.Log, got.Status.Health)
	}

	waitFor(t, "the endpoint to become ready after retries", func() bool {
		ep, ok := e.get(live.ID)
		return ok && ep.State == ciliumv2.EndpointStateReady && ep.Identity != identity.InvalidIdentity
	})
	waitFor(t, "healthz to say Ok", func() bool {
		state, _ := e.health(t)
		return state == "Ok"
	})
	ids.mu.Lock()
	defer ids.mu.Unlock()
	if ids.failures != 2 {
		t.Errorf("%d failed allocations, want 2", ids.failures)
	}
}

// A label change whose identity cannot be allocated leaves the endpoint
// waiting-to-regenerate; it is retried until it has the new identity.
func TestRelabelFailureRetried(t *testing.T) {
	e := start(t, t.TempDir(), nil, liveSeed)
	var ep models.Endpoint
	e.add(t, addReq("c1", "live", "10.0.0.10"), &ep)
	e.ids.mu.Lock()
	e.ids.failN = 2
	e.ids.mu.Unlock()
	txn := e.db.WriteTxn(e.pods)
	e.pods.Insert(txn, pod("live", "uid-live", map[string]string{"app": "web", "tier": "front"}))
	txn.Commit()
	waitFor(t, "the relabelled endpoint to be stuck", func() bool {
		cur, ok := e.get(ep.ID)
		return ok && cur.State == ciliumv2.EndpointStateWaitingToRegenerate && cur.Failure() != ""
	})
	// The retrier reports health when it sees the failed row.
	waitFor(t, "healthz to say Degraded while stuck", func() bool {
		state, _ := e.health(t)
		return state == "Degraded"
	})
	waitFor(t, "the new identity", func() bool {
		cur, ok := e.get(ep.ID)
		return ok && cur.State == ciliumv2.EndpointStateReady && int64(cur.Identity) != ep.Status.Identity.ID &&
			cur.Labels.Has(labels.Make(labels.SourceK8s, "tier", "front"))
	})
}

func truncate(t *testing.T, dir string, id int64) string {
	t.Helper()
	path := filepath.Join(dir, "endpoints", fmt.Sprintf("%d.json", id))
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, data[:len(data)/2], 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func quarantinedFiles(t *testing.T, path string) []string {
	t.Helper()
	m, err := filepath.Glob(path + ".corrupt-*")
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// A truncated state file is moved aside, not deleted; its ID stays
// reserved (also across another restart); health is degraded naming the
// file; DELETE of the placeholder clears it.
func TestCorruptStateFileQuarantined(t *testing.T) {
	dir := t.TempDir()
	live := firstAgent(t, dir)
	path := truncate(t, dir, live.ID)

	t.Run("second agent", func(t *testing.T) {
		e := start(t, dir, nil, liveSeed)
		waitFor(t, "restore", func() bool { ok, _ := e.eps.Initialized(e.db.ReadTxn()); return ok })
		ph, ok := e.get(live.ID)
		if !ok || ph.State != ciliumv2.EndpointStateInvalid || !strings.Contains(ph.Failure(), path) {
			t.Fatalf("ID %d not held by a placeholder naming the file: %+v", live.ID, ph)
		}
		if q := quarantinedFiles(t, path); len(q) != 1 {
			t.Fatalf("quarantined files %v", q)
		}
		if _, err := os.Stat(path); !os.IsNotExist(err) {
			t.Errorf("the corrupt file is still in place: %v", err)
		}
		waitFor(t, "healthz to name the file", func() bool {
			state, msg := e.health(t)
			return state == "Degraded" && strings.Contains(msg, path) && strings.Contains(msg, "not rebuilt")
		})
		// New endpoints never get the reserved ID.
		for i := range 3 {
			var ep models.Endpoint
			e.add(t, addReq(fmt.Sprintf("n%d", i), fmt.Sprintf("new-%d", i), fmt.Sprintf("10.0.0.%d", 50+i)), &ep)
			if ep.ID == live.ID || ep.ID == 0 {
				t.Fatalf("new endpoint got ID %d", ep.ID)
			}
		}
	})
	t.Run("third agent", func(t *testing.T) {
		e := start(t, dir, nil, liveSeed)
		waitFor(t, "restore", func() bool { ok, _ := e.eps.Initialized(e.db.ReadTxn()); return ok })
		if ph, ok := e.get(live.ID); !ok || ph.State != ciliumv2.EndpointStateInvalid {
			t.Fatalf("ID %d not reserved after another restart: %+v", live.ID, ph)
		}
		// The operator has checked: the placeholder is deleted.
		if code := e.do(t, "DELETE", fmt.Sprintf("/endpoint/%d", live.ID), nil, nil); code != 200 {
			t.Fatalf("delete placeholder: %d", code)
		}
		waitFor(t, "healthz to say Ok", func() bool {
			state, _ := e.health(t)
			return state == "Ok"
		})
		if q := quarantinedFiles(t, path); len(q) != 1 {
			t.Errorf("the quarantined file must be kept for inspection: %v", q)
		}
	})
}

// A truncated state file whose endpoint still has its CiliumEndpoint (this
// agent wrote it: same ID, a pod of this node as owner) is rebuilt from it:
// same ID, container ID and IP; ready; CNI DEL finds it.
func TestCorruptStateFileRebuiltFromCEP(t *testing.T) {
	dir := t.TempDir()
	live := firstAgent(t, dir)
	path := truncate(t, dir, live.ID)
	cep := &ciliumv2.CiliumEndpoint{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "live",
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: "live", UID: "uid-live"}}},
	}
	// The API's status has the CEP's JSON.
	raw, err := json.Marshal(live.Status)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(raw, &cep.Status); err != nil {
		t.Fatal(err)
	}
	e := startWith(t, dir, nil, liveSeed, []*ciliumv2.CiliumEndpoint{cep})
	waitFor(t, "the rebuilt endpoint to be ready", func() bool {
		ep, ok := e.get(live.ID)
		return ok && ep.State == ciliumv2.EndpointStateReady
	})
	ep, _ := e.get(live.ID)
	if ep.ContainerID != "c-live" || ep.IPv4.String() != "10.0.0.30" || ep.PodUID != "uid-live" || ep.ContainerIfName != "eth0" {
		t.Fatalf("rebuilt endpoint %+v", ep)
	}
	if e.ipam.owners[ep.IPv4].Name != "default/live" {
		t.Errorf("rebuilt endpoint's IP not claimed: %v", e.ipam.owners)
	}
	if q := quarantinedFiles(t, path); len(q) != 1 {
		t.Errorf("quarantined files %v", q)
	}
	if _, err := os.Stat(path); err != nil {
		t.Errorf("the rebuilt endpoint is not saved again: %v", err)
	}
	if code := e.do(t, "DELETE", "/endpoint?container-id=c-live", nil, nil); code != 200 {
		t.Fatalf("CNI DEL of the rebuilt endpoint: %d", code)
	}
}
