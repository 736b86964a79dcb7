package endpointmanager_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
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
	"github.com/cellium/cellium/api/v1/models"
	"github.com/cellium/cellium/cells/agentapi"
	"github.com/cellium/cellium/cells/endpointmanager"
	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/cells/hive/hivetest"
	identitycell "github.com/cellium/cellium/cells/identity"
	"github.com/cellium/cellium/cells/ipam"
	"github.com/cellium/cellium/cells/k8s"
	"github.com/cellium/cellium/cells/statedir"
	"github.com/cellium/cellium/statedb/endpoints"
	"github.com/cellium/cellium/statedb/identity"
	k8stables "github.com/cellium/cellium/statedb/k8s"
	"github.com/cellium/cellium/statedb/labels"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeIPAM records claims and releases.
type fakeIPAM struct {
	mu       sync.Mutex
	owners   map[netip.Addr]string
	released []netip.Addr
}

func (f *fakeIPAM) AllocateNext(context.Context, string) (ipam.Allocation, error) {
	return ipam.Allocation{}, errors.New("not used")
}
func (f *fakeIPAM) AllocateIP(_ context.Context, ip netip.Addr, owner string) (ipam.Allocation, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.owners[ip] = owner
	return ipam.Allocation{IP: ip, Owner: owner}, nil
}
func (f *fakeIPAM) Release(ip netip.Addr) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.owners, ip)
	f.released = append(f.released, ip)
	return nil
}
func (f *fakeIPAM) RouterIP() (netip.Addr, bool) { return netip.MustParseAddr("10.0.0.1"), true }
func (f *fakeIPAM) OwnedBy(ctx context.Context, owner string) ([]netip.Addr, error) {
	if owner == endpointmanager.HealthIPOwner {
		return []netip.Addr{netip.MustParseAddr("10.0.0.2")}, nil
	}
	return nil, nil
}

// fakeIdentities gives each distinct label set a number from 1000 and
// counts references.
type fakeIdentities struct {
	mu   sync.Mutex
	ids  map[string]identity.NumericIdentity
	refs map[identity.NumericIdentity]int
	fail error
	// failN fails the next failN allocations of non-reserved labels.
	failN int
	// failures counts the failed allocations.
	failures int
}

func (f *fakeIdentities) Allocate(_ context.Context, l labels.Labels) (identitycell.Identity, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fail != nil {
		return identitycell.Identity{}, f.fail
	}
	if id, ok := identity.LookupReservedByLabels(l); ok {
		return identitycell.Identity{ID: id, Labels: l}, nil
	}
	if f.failN > 0 {
		f.failN--
		f.failures++
		return identitycell.Identity{}, errors.New("ciliumidentities.cilium.io is forbidden: denied by admission policy")
	}
	id, ok := f.ids[l.String()]
	if !ok {
		id = identity.NumericIdentity(1000 + len(f.ids))
		f.ids[l.String()] = id
	}
	f.refs[id]++
	return identitycell.Identity{ID: id, Labels: l}, nil
}
func (f *fakeIdentities) Release(_ context.Context, id identity.NumericIdentity) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.refs[id]--
	return nil
}
func (f *fakeIdentities) Lookup(identity.NumericIdentity) (identitycell.Identity, bool) {
	return identitycell.Identity{}, false
}

type filter struct{}

func (filter) Split(l labels.Labels) (labels.Labels, labels.Labels) {
	return labels.DefaultFilter().Split(l)
}

type env struct {
	db   *statedb.DB
	pods statedb.RWTable[*corev1.Pod]
	ceps statedb.RWTable[*ciliumv2.CiliumEndpoint]
	eps  statedb.Table[*endpoints.Endpoint]
	ipam *fakeIPAM
	ids  *fakeIdentities
	api  *http.Client
}

// start composes the endpoint manager and the API server with fake
// tables and allocators; seed runs before start, in a write transaction.
func start(t *testing.T, dir string, ids *fakeIdentities, seed func(txn statedb.WriteTxn, pods statedb.RWTable[*corev1.Pod])) *env {
	t.Helper()
	return startWith(t, dir, ids, seed, nil)
}

// startWith is start with CiliumEndpoints in the CEPs table.
func startWith(t *testing.T, dir string, ids *fakeIdentities, seed func(txn statedb.WriteTxn, pods statedb.RWTable[*corev1.Pod]), ceps []*ciliumv2.CiliumEndpoint) *env {
	t.Helper()
	if ids == nil {
		ids = &fakeIdentities{ids: map[string]identity.NumericIdentity{}, refs: map[identity.NumericIdentity]int{}}
	}
	e := &env{ipam: &fakeIPAM{owners: map[netip.Addr]string{}}, ids: ids}
	socket := filepath.Join(t.TempDir(), "api.sock")
	hivetest.Start(t, []string{"--state-dir=" + dir, "--socket-path=" + socket},
		statedir.Cell,
		agentapi.Cell,
		hive.Provide(
			k8stables.NewPodsTable, statedb.RWTable[*corev1.Pod].ToTable,
			k8stables.NewNamespacesTable, statedb.RWTable[*corev1.Namespace].ToTable,
			k8stables.NewNodesTable, statedb.RWTable[*corev1.Node].ToTable,
			k8stables.NewCiliumEndpointsTable, statedb.RWTable[*ciliumv2.CiliumEndpoint].ToTable,
			k8s.DisabledClientset,
			func() ipam.Allocator { return e.ipam },
			func() ipam.Lookup { return e.ipam },
			func() identitycell.Allocator { return e.ids },
			func() identitycell.LabelFilter { return filter{} },
			func() identitycell.ClusterName { return "default" },
			func() k8s.NodeName { return "node-a" },
		),
		endpointmanager.Cell,
		hive.Invoke(func(db *statedb.DB, pods statedb.RWTable[*corev1.Pod], nss statedb.RWTable[*corev1.Namespace], eps statedb.Table[*endpoints.Endpoint], cepTable statedb.RWTable[*ciliumv2.CiliumEndpoint]) {
			e.db, e.pods, e.eps, e.ceps = db, pods, eps, cepTable
			txn := db.WriteTxn(pods, nss, cepTable)
			for _, c := range ceps {
				cepTable.Insert(txn, c)
			}
			// The tables count as synced from the start.
			if seed != nil {
				seed(txn, pods)
			}
			txn.Commit()
		}),
	)
	e.api = &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", socket)
	}}}
	return e
}

func pod(name, uid string, lbls map[string]string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, UID: types.UID(uid), Labels: lbls},
		Spec: corev1.PodSpec{NodeName: "node-a", ServiceAccountName: "default",
			Containers: []corev1.Container{{Name: "c", Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 80}}}}},
	}
}

func (e *env) do(t *testing.T, method, path string, body any, out any) int {
	t.Helper()
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, _ := http.NewRequest(method, "http://agent/v1"+path, rd)
	resp, err := e.api.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	if out != nil && resp.StatusCode < 300 {
		if err := json.Unmarshal(data, out); err != nil {
			t.Fatalf("%s %s: %v: %s", method, path, err, data)
		}
	}
	if resp.StatusCode >= 300 && out != nil {
		if me, ok := out.(*models.Error); ok {
			_ = json.Unmarshal(data, me)
		}
	}
	return resp.StatusCode
}

func addReq(cid, podName, ip string) models.EndpointChangeRequest {
	return models.EndpointChangeRequest{
		ContainerID: cid, ContainerInterfaceName: "eth0", K8sNamespace: "default", K8sPodName: podName,
		InterfaceName: "lxc" + cid, Addressing: ciliumv2.AddressPair{IPV4: ip}, SyncBuildEndpoint: true,
	}
}

func TestCreateSharesIdentityAndDeleteReleases(t *testing.T) {
	dir := t.TempDir()
	e := start(t, dir, nil, func(txn statedb.WriteTxn, pods statedb.RWTable[*corev1.Pod]) {
		pods.Insert(txn, pod("web-1", "uid-1", map[string]string{"app": "web", "pod-template-hash": "abc"}))
		pods.Insert(txn, pod("web-2", "uid-2", map[string]string{"app": "web", "pod-template-hash": "def"}))
		pods.Insert(txn, pod("db", "uid-3", map[string]string{"app": "db"}))
	})
	var a, b, c models.Endpoint
	if code := e.do(t, "PUT", "/endpoint", addReq("c1", "web-1", "10.0.0.10"), &a); code != 201 {
		t.Fatalf("create web-1: %d", code)
	}
	e.do(t, "PUT", "/endpoint", addReq("c2", "web-2", "10.0.0.11"), &b)
	e.do(t, "PUT", "/endpoint", addReq("c3", "db", "10.0.0.12"), &c)
	if a.Status.State != ciliumv2.EndpointStateReady || a.Status.Identity == nil {
		t.Fatalf("endpoint not ready with identity: %+v", a.Status)
	}
	if a.Status.Identity.ID != b.Status.Identity.ID {
		t.Errorf("same security labels, different identities: %d vs %d", a.Status.Identity.ID, b.Status.Identity.ID)
	}
	if a.Status.Identity.ID == c.Status.Identity.ID {
		t.Errorf("different labels share identity %d", a.Status.Identity.ID)
	}
	if a.ID == b.ID || a.ID < 1 || a.ID > endpointmanager.MaxEndpointID {
		t.Errorf("endpoint IDs %d, %d", a.ID, b.ID)
	}
	if got := a.Status.ExternalIdentifiers; got == nil || got.PodName != "default/web-1" || got.ContainerID != "c1" || got.CNIAttachmentID != "c1:eth0" {
		t.Errorf("external identifiers %+v", got)
	}
	if len(a.Status.NamedPorts) != 1 || a.Status.NamedPorts[0].Name != "http" || a.Status.ServiceAccount != "default" {
		t.Errorf("named ports / service account: %+v %q", a.Status.NamedPorts, a.Status.ServiceAccount)
	}
	var got models.Endpoint
	e.do(t, "GET", fmt.Sprintf("/endpoint/%d", a.ID), nil, &got)
	if got.Status.Networking == nil || got.Status.Networking.Addressing[0].IPV4 != "10.0.0.10" {
		t.Errorf("GET endpoint: %+v", got.Status)
	}
	// Same container again: conflict, nothing changes.
	var apiErr models.Error
	if code := e.do(t, "PUT", "/endpoint", addReq("c1", "web-1", "10.0.0.99"), &apiErr); code != 409 {
		t.Errorf("duplicate container: %d %s", code, apiErr.Message)
	}
	if code := e.do(t, "DELETE", "/endpoint?container-id=c1", nil, nil); code != 200 {
		t.Fatalf("delete: %d", code)
	}
	if code := e.do(t, "DELETE", "/endpoint?container-id=c1", nil, nil); code != 404 {
		t.Errorf("second delete: %d, want 404", code)
	}
	if !slices.Contains(e.ipam.released, netip.MustParseAddr("10.0.0.10")) {
		t.Errorf("IP not released: %v", e.ipam.released)
	}
	if _, err := os.Stat(filepath.Join(dir, "endpoints", fmt.Sprint(a.ID)+".json")); !os.IsNotExist(err) {
		t.Errorf("state file left behind: %v", err)
	}
}

func TestBadRequests(t *testing.T) {
	e := start(t, t.TempDir(), nil, nil)
	var apiErr models.Error
	if code := e.do(t, "PUT", "/endpoint", models.EndpointChangeRequest{ContainerID: "x"}, &apiErr); code != 400 ||
		!strings.Contains(apiErr.Message, "k8s-pod-name") || !strings.Contains(apiErr.Message, "addressing.ipv4") {
		t.Errorf("missing fields: %d %q", code, apiErr.Message)
	}
	if code := e.do(t, "PUT", "/endpoint", addReq("x", "p", "not-an-ip"), &apiErr); code != 400 {
		t.Errorf("bad ip: %d", code)
	}
	if code := e.do(t, "GET", "/endpoint/abc", nil, &apiErr); code != 400 {
		t.Errorf("bad id: %d", code)
	}
}

func TestUnknownPodGetsInitIdentity(t *testing.T) {
	e := start(t, t.TempDir(), nil, nil)
	var ep models.Endpoint
	e.do(t, "PUT", "/endpoint", addReq("c9", "ghost", "10.0.0.20"), &ep)
	if ep.Status.Identity == nil || ep.Status.Identity.ID != int64(identity.NumericIdentity(5)) {
		t.Fatalf("want reserved init identity 5, got %+v", ep.Status.Identity)
	}
}

func TestIdentityFailureLeavesNothing(t *testing.T) {
	ids := &fakeIdentities{ids: map[string]identity.NumericIdentity{}, refs: map[identity.NumericIdentity]int{}, fail: errors.New("apiserver down")}
	e := start(t, t.TempDir(), ids, func(txn statedb.WriteTxn, pods statedb.RWTable[*corev1.Pod]) {
		pods.Insert(txn, pod("web-1", "uid-1", map[string]string{"app": "web"}))
	})
	var apiErr models.Error
	if code := e.do(t, "PUT", "/endpoint", addReq("c1", "web-1", "10.0.0.10"), &apiErr); code != 503 {
		t.Fatalf("want 503, got %d %q", code, apiErr.Message)
	}
	for ep := range e.eps.All(e.db.ReadTxn()) {
		if !ep.Health {
			t.Fatalf("endpoint left behind: %+v", ep)
		}
	}
}

func TestNewSandboxReplacesEndpoint(t *testing.T) {
	e := start(t, t.TempDir(), nil, func(txn statedb.WriteTxn, pods statedb.RWTable[*corev1.Pod]) {
		pods.Insert(txn, pod("web-1", "uid-1", map[string]string{"app": "web"}))
	})
	var first, second models.Endpoint
	e.do(t, "PUT", "/endpoint", addReq("old", "web-1", "10.0.0.10"), &first)
	e.do(t, "PUT", "/endpoint", addReq("new", "web-1", "10.0.0.11"), &second)
	n := 0
	for ep := range e.eps.List(e.db.ReadTxn(), endpoints.PodIndex.Query("default/web-1")) {
		n++
		if ep.ContainerID != "new" {
			t.Errorf("old sandbox's endpoint still there: %+v", ep)
		}
	}
	if n != 1 {
		t.Fatalf("want exactly one endpoint for the pod, got %d", n)
	}
	if !slices.Contains(e.ipam.released, netip.MustParseAddr("10.0.0.10")) {
		t.Errorf("replaced sandbox's IP not released: %v", e.ipam.released)
	}
}

func TestLabelChangeMovesIdentity(t *testing.T) {
	e := start(t, t.TempDir(), nil, func(txn statedb.WriteTxn, pods statedb.RWTable[*corev1.Pod]) {
		pods.Insert(txn, pod("web-1", "uid-1", map[string]string{"app": "web"}))
	})
	var ep models.Endpoint
	e.do(t, "PUT", "/endpoint", addReq("c1", "web-1", "10.0.0.10"), &ep)
	before := ep.Status.Identity.ID
	txn := e.db.WriteTxn(e.pods)
	e.pods.Insert(txn, pod("web-1", "uid-1", map[string]string{"app": "web", "tier": "front"}))
	txn.Commit()
	waitFor(t, "identity to change", func() bool {
		cur, _, ok := e.eps.Get(e.db.ReadTxn(), endpoints.IDIndex.Query(uint16(ep.ID)))
		return ok && int64(cur.Identity) != before && cur.State == ciliumv2.EndpointStateReady &&
			cur.Labels.Has(labels.Make(labels.SourceK8s, "tier", "front"))
	})
	// The old identity is released right after the row changes.
	waitFor(t, "the old identity released", func() bool {
		e.ids.mu.Lock()
		defer e.ids.mu.Unlock()
		return e.ids.refs[identity.NumericIdentity(before)] == 0
	})
}

func TestRestoreKeepsLiveEndpointsAndDropsGone(t *testing.T) {
	dir := t.TempDir()
	// The host side of a live endpoint must exist: use loopback's name.
	seed := func(txn statedb.WriteTxn, pods statedb.RWTable[*corev1.Pod]) {
		pods.Insert(txn, pod("live", "uid-live", map[string]string{"app": "web"}))
		pods.Insert(txn, pod("gone", "uid-gone", map[string]string{"app": "web"}))
	}
	var live, gone models.Endpoint
	t.Run("first agent", func(t *testing.T) {
		e := start(t, dir, nil, seed)
		reqLive := addReq("c-live", "live", "10.0.0.30")
		reqLive.InterfaceName = "lo"
		e.do(t, "PUT", "/endpoint", reqLive, &live)
		reqGone := addReq("c-gone", "gone", "10.0.0.31")
		reqGone.InterfaceName = "lo"
		e.do(t, "PUT", "/endpoint", reqGone, &gone)
	})
	// Restart: "gone" was deleted while the agent was down.
	e := start(t, dir, nil, func(txn statedb.WriteTxn, pods statedb.RWTable[*corev1.Pod]) {
		pods.Insert(txn, pod("live", "uid-live", map[string]string{"app": "web"}))
	})
	// The table is initialized once restore is done with what the node
	// knows; the pod checks follow.
	waitFor(t, "restore to finish", func() bool {
		txn := e.db.ReadTxn()
		ok, _ := e.eps.Initialized(txn)
		cur, _, live := e.eps.Get(txn, endpoints.IDIndex.Query(uint16(live.ID)))
		_, _, gone := e.eps.Get(txn, endpoints.IDIndex.Query(uint16(gone.ID)))
		e.ipam.mu.Lock()
		released := slices.Contains(e.ipam.released, netip.MustParseAddr("10.0.0.31"))
		e.ipam.mu.Unlock()
		return ok && live && cur.State == ciliumv2.EndpointStateReady && !gone && released
	})
	cur, _, ok := e.eps.Get(e.db.ReadTxn(), endpoints.IDIndex.Query(uint16(live.ID)))
	if !ok || cur.ContainerID != "c-live" || cur.IPv4.String() != "10.0.0.30" || cur.State != ciliumv2.EndpointStateReady {
		t.Fatalf("live endpoint not restored with its ID and IP: %+v", cur)
	}
	e.ids.mu.Lock()
	refs := e.ids.refs[cur.Identity]
	e.ids.mu.Unlock()
	if refs != 1 {
		t.Errorf("restored endpoint holds %d references to identity %d, want 1", refs, cur.Identity)
	}
	if e.ipam.owners[netip.MustParseAddr("10.0.0.30")] != "default/live" {
		t.Errorf("restored IP not claimed again: %v", e.ipam.owners)
	}
	if _, _, ok := e.eps.Get(e.db.ReadTxn(), endpoints.IDIndex.Query(uint16(gone.ID))); ok {
		t.Errorf("endpoint of a deleted pod was restored")
	}
	if !slices.Contains(e.ipam.released, netip.MustParseAddr("10.0.0.31")) {
		t.Errorf("IP of the discarded endpoint not released: %v", e.ipam.released)
	}
	// A new endpoint does not reuse a restored ID.
	var next models.Endpoint
	e.do(t, "PUT", "/endpoint", addReq("c-new", "live2", "10.0.0.32"), &next)
	if next.ID == live.ID {
		t.Errorf("new endpoint reused restored ID %d", live.ID)
	}
}

func TestHealthEndpoint(t *testing.T) {
	e := start(t, t.TempDir(), nil, nil)
	waitFor(t, "health endpoint", func() bool {
		for ep := range e.eps.List(e.db.ReadTxn(), endpoints.CEPIndex.Query("kube-system/cilium-health-node-a")) {
			return ep.Health && ep.Identity == 4 && ep.IPv4.String() == "10.0.0.2" && ep.State == ciliumv2.EndpointStateReady
		}
		return false
	})
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
