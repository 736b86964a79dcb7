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
	"github.com/cellium/cellium/cells/endpointpolicy/endpointpolicytest"
	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/cells/hive/hivetest"
	identitycell "github.com/cellium/cellium/cells/identity"
	"github.com/cellium/cellium/cells/ipam"
	"github.com/cellium/cellium/cells/k8s"
	"github.com/cellium/cellium/cells/statedir"
	"github.com/cellium/cellium/statedb/endpoints"
	"github.com/cellium/cellium/statedb/health"
	"github.com/cellium/cellium/statedb/identity"
	ipamtables "github.com/cellium/cellium/statedb/ipam"
	k8stables "github.com/cellium/cellium/statedb/k8s"
	"github.com/cellium/cellium/statedb/labels"
	"github.com/cellium/cellium/statedb/nodes"
	statepolicy "github.com/cellium/cellium/statedb/policy"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeIPAM holds addresses by owner and container, as the real one, and
// records every address it frees.
type fakeIPAM struct {
	mu       sync.Mutex
	owners   map[netip.Addr]ipam.Owner
	released []netip.Addr // addresses actually freed, in order
}

func newFakeIPAM() *fakeIPAM {
	return &fakeIPAM{owners: map[netip.Addr]ipam.Owner{}}
}

// fakeIPAMFile is where a fake IPAM keeps its allocations across agent
// restarts in one state directory, as the real IPAM's state file does.
func fakeIPAMFile(dir string) string { return filepath.Join(dir, "fake-ipam.json") }

// load reads the allocations an earlier agent on dir left.
func (f *fakeIPAM) load(t *testing.T, dir string) {
	data, err := os.ReadFile(fakeIPAMFile(dir))
	if errors.Is(err, os.ErrNotExist) {
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, &f.owners); err != nil {
		t.Fatal(err)
	}
}

// save keeps the allocations for the next agent on dir.
func (f *fakeIPAM) save(t *testing.T, dir string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	data, err := json.Marshal(f.owners)
	if err != nil {
		t.Error(err)
		return
	}
	if err := os.WriteFile(fakeIPAMFile(dir), data, 0o600); err != nil {
		t.Error(err)
	}
}

// give allocates ip to a pod's container, as POST /v1/ipam does.
func (f *fakeIPAM) give(ip, pod, containerID string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.owners[netip.MustParseAddr(ip)] = ipam.Owner{Name: "default/" + pod, ContainerID: containerID}
}

func (f *fakeIPAM) owner(ip string) (ipam.Owner, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	o, ok := f.owners[netip.MustParseAddr(ip)]
	return o, ok
}

// releaseCount is how many times ip was actually freed.
func (f *fakeIPAM) releaseCount(ip string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, r := range f.released {
		if r == netip.MustParseAddr(ip) {
			n++
		}
	}
	return n
}

func (f *fakeIPAM) releasedIPs() []netip.Addr {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.released)
}

func (f *fakeIPAM) AllocateNext(context.Context, ipam.Owner) (ipam.Allocation, error) {
	return ipam.Allocation{}, errors.New("not used")
}
func (f *fakeIPAM) AllocateIP(_ context.Context, ip netip.Addr, owner ipam.Owner) (ipam.Allocation, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if cur, ok := f.owners[ip]; ok && cur.Name != owner.Name {
		return ipam.Allocation{}, fmt.Errorf("%v held by %s", ip, cur)
	}
	f.owners[ip] = owner
	return ipam.Allocation{IP: ip, Owner: owner.Name, ContainerID: owner.ContainerID}, nil
}
func (f *fakeIPAM) Claim(_ context.Context, ip netip.Addr, owner ipam.Owner) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	cur, ok := f.owners[ip]
	switch {
	case !ok:
		return fmt.Errorf("%w: %v", ipam.ErrNotAllocated, ip)
	case cur.Name != owner.Name || cur.ContainerID != "" && cur.ContainerID != owner.ContainerID:
		return fmt.Errorf("%w: %v held by %s", ipam.ErrNotOwner, ip, cur)
	}
	return nil
}
func (f *fakeIPAM) Release(ip netip.Addr) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.owners[ip]; ok {
		delete(f.owners, ip)
		f.released = append(f.released, ip)
	}
	return nil
}
func (f *fakeIPAM) ReleaseOwned(ip netip.Addr, owner ipam.Owner) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	cur, ok := f.owners[ip]
	if !ok {
		return false, nil
	}
	if owner.ContainerID != "" && cur.ContainerID != owner.ContainerID || owner.ContainerID == "" && cur.Name != owner.Name {
		return false, fmt.Errorf("%w: %v held by %s", ipam.ErrNotOwner, ip, cur)
	}
	delete(f.owners, ip)
	f.released = append(f.released, ip)
	return true, nil
}
func (f *fakeIPAM) ReleaseContainer(cid string) ([]ipam.Allocation, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []ipam.Allocation
	for ip, o := range f.owners {
		if o.ContainerID == cid {
			delete(f.owners, ip)
			f.released = append(f.released, ip)
			out = append(out, ipam.Allocation{IP: ip, Owner: o.Name, ContainerID: cid})
		}
	}
	return out, nil
}
func (f *fakeIPAM) HoldForRestore(string) func([]ipam.Claim) {
	return func(claims []ipam.Claim) {
		f.mu.Lock()
		defer f.mu.Unlock()
		for _, c := range claims {
			f.owners[c.IP] = c.Owner
		}
	}
}
func (f *fakeIPAM) RouterIP() (netip.Addr, bool) { return netip.MustParseAddr("10.0.0.1"), true }

// allocationsTable is IPAM's table as the fake IPAM would write it: the
// router's address and the health endpoint's, initialized.
func allocationsTable(db *statedb.DB) (statedb.Table[*ipamtables.Allocation], error) {
	table, err := ipamtables.NewTable(db)
	if err != nil {
		return nil, err
	}
	txn := db.WriteTxn(table)
	table.Insert(txn, &ipamtables.Allocation{IP: netip.MustParseAddr("10.0.0.1"), Owner: ipamtables.RouterOwner})
	table.Insert(txn, &ipamtables.Allocation{IP: netip.MustParseAddr("10.0.0.2"), Owner: endpointmanager.HealthIPOwner})
	table.RegisterInitializer(txn, "test")(txn)
	txn.Commit()
	return table, nil
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
	// entered, when set, receives a value as an allocation of
	// non-reserved labels begins, which then waits for gate to close.
	entered chan struct{}
	gate    chan struct{}
}

func (f *fakeIdentities) Allocate(_ context.Context, l labels.Labels) (identitycell.Identity, error) {
	if _, reserved := identity.LookupReservedByLabels(l); !reserved && f.gate != nil {
		select {
		case f.entered <- struct{}{}:
		default:
		}
		<-f.gate
	}
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

// Restore ignores restored identities: the fake allocates without an API.
func (f *fakeIdentities) Restore(labels.Labels, identity.NumericIdentity) {}

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
	nss  statedb.RWTable[*corev1.Namespace]
	ceps statedb.RWTable[*ciliumv2.CiliumEndpoint]
	eps  statedb.Table[*endpoints.Endpoint]
	pols statedb.RWTable[*statepolicy.EndpointPolicyRow]
	// reqs and ipamReqs are the identity and IPAM requests tables the
	// manager writes.
	reqs     statedb.Table[*identity.Request]
	ipamReqs statedb.Table[*ipamtables.Request]
	// policy writes each endpoint's policy row, as the policy cell does.
	policy *endpointpolicytest.StandIn
	ipam   *fakeIPAM
	ids    *fakeIdentities
	api    *http.Client
}

// start composes the endpoint manager and the API server with fake
// tables and allocators; seed runs before start, in a write transaction.
func start(t *testing.T, dir string, ids *fakeIdentities, seed func(txn statedb.WriteTxn, pods statedb.RWTable[*corev1.Pod])) *env {
	t.Helper()
	return startWith(t, dir, ids, seed, nil)
}

// startWith is start with CiliumEndpoints in the CEPs table.
func startWith(t *testing.T, dir string, ids *fakeIdentities, seed func(txn statedb.WriteTxn, pods statedb.RWTable[*corev1.Pod]), ceps []*ciliumv2.CiliumEndpoint, extra ...hive.Cell) *env {
	t.Helper()
	if ids == nil {
		ids = &fakeIdentities{ids: map[string]identity.NumericIdentity{}, refs: map[identity.NumericIdentity]int{}}
	}
	e := &env{ipam: newFakeIPAM(), ids: ids, policy: endpointpolicytest.New()}
	e.ipam.load(t, dir)
	// Runs after the hive has stopped (cleanups run last-in first-out).
	t.Cleanup(func() { e.ipam.save(t, dir) })
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
		),
		// The policy engine's table and a stand-in writing it.
		e.policy.Cell(),
		endpointmanager.Cell, identitycell.Responder, ipam.Responder,
		hive.Group(extra...),
		hive.Invoke(func(db *statedb.DB, pods statedb.RWTable[*corev1.Pod], nss statedb.RWTable[*corev1.Namespace], eps statedb.Table[*endpoints.Endpoint], cepTable statedb.RWTable[*ciliumv2.CiliumEndpoint], pols statedb.RWTable[*statepolicy.EndpointPolicyRow], reqs identity.RequestAnswers, ipamReqs ipamtables.RequestAnswers) {
			e.db, e.pods, e.nss, e.eps, e.ceps, e.pols, e.reqs, e.ipamReqs = db, pods, nss, eps, cepTable, pols, reqs, ipamReqs
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

// add allocates the request's address to its container, as the CNI
// plugin's POST /v1/ipam does, then PUTs the endpoint.
func (e *env) add(t *testing.T, req models.EndpointChangeRequest, out any) int {
	t.Helper()
	e.ipam.give(req.Addressing.IPV4, req.K8sPodName, req.ContainerID)
	return e.do(t, "PUT", "/endpoint", req, out)
}

func addReq(cid, podName, ip string) models.EndpointChangeRequest {
	return models.EndpointChangeRequest{
		ContainerID: cid, ContainerInterfaceName: "eth0", K8sNamespace: "default", K8sPodName: podName,
		InterfaceName: "lxc" + cid, Addressing: models.AddressPair{IPV4: ip}, SyncBuildEndpoint: true,
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
	if code := e.add(t, addReq("c1", "web-1", "10.0.0.10"), &a); code != 201 {
		t.Fatalf("create web-1: %d", code)
	}
	e.add(t, addReq("c2", "web-2", "10.0.0.11"), &b)
	e.add(t, addReq("c3", "db", "10.0.0.12"), &c)
	if a.Status.State != models.EndpointStateReady || a.Status.Identity == nil {
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
	if !slices.Contains(e.ipam.releasedIPs(), netip.MustParseAddr("10.0.0.10")) {
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
	e.add(t, addReq("c9", "ghost", "10.0.0.20"), &ep)
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
	if code := e.add(t, addReq("c1", "web-1", "10.0.0.10"), &apiErr); code != 503 {
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
	e.add(t, addReq("old", "web-1", "10.0.0.10"), &first)
	e.add(t, addReq("new", "web-1", "10.0.0.11"), &second)
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
	if !slices.Contains(e.ipam.releasedIPs(), netip.MustParseAddr("10.0.0.10")) {
		t.Errorf("replaced sandbox's IP not released: %v", e.ipam.released)
	}
}

func TestLabelChangeMovesIdentity(t *testing.T) {
	e := start(t, t.TempDir(), nil, func(txn statedb.WriteTxn, pods statedb.RWTable[*corev1.Pod]) {
		pods.Insert(txn, pod("web-1", "uid-1", map[string]string{"app": "web"}))
	})
	var ep models.Endpoint
	e.add(t, addReq("c1", "web-1", "10.0.0.10"), &ep)
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

// Namespace labels are part of a pod's identity: relabelling the
// namespace moves its endpoints to new identities.
func TestNamespaceLabelChangeMovesIdentity(t *testing.T) {
	e := start(t, t.TempDir(), nil, func(txn statedb.WriteTxn, pods statedb.RWTable[*corev1.Pod]) {
		pods.Insert(txn, pod("web-1", "uid-1", map[string]string{"app": "web"}))
	})
	var ep models.Endpoint
	e.add(t, addReq("c1", "web-1", "10.0.0.10"), &ep)
	before := ep.Status.Identity.ID
	txn := e.db.WriteTxn(e.nss)
	e.nss.Insert(txn, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "default", Labels: map[string]string{"team": "blue"}}})
	txn.Commit()
	waitFor(t, "identity to change with the namespace's labels", func() bool {
		cur, _, ok := e.eps.Get(e.db.ReadTxn(), endpoints.IDIndex.Query(uint16(ep.ID)))
		return ok && int64(cur.Identity) != before && cur.State == ciliumv2.EndpointStateReady &&
			cur.Labels.Has(labels.Make(labels.SourceK8s, labels.PodNamespaceMetaLabels+".team", "blue"))
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
		e.add(t, reqLive, &live)
		reqGone := addReq("c-gone", "gone", "10.0.0.31")
		reqGone.InterfaceName = "lo"
		e.add(t, reqGone, &gone)
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
	if e.ipam.owners[netip.MustParseAddr("10.0.0.30")].Name != "default/live" {
		t.Errorf("restored IP not claimed again: %v", e.ipam.owners)
	}
	if _, _, ok := e.eps.Get(e.db.ReadTxn(), endpoints.IDIndex.Query(uint16(gone.ID))); ok {
		t.Errorf("endpoint of a deleted pod was restored")
	}
	if !slices.Contains(e.ipam.releasedIPs(), netip.MustParseAddr("10.0.0.31")) {
		t.Errorf("IP of the discarded endpoint not released: %v", e.ipam.released)
	}
	// A new endpoint does not reuse a restored ID.
	var next models.Endpoint
	e.add(t, addReq("c-new", "live2", "10.0.0.32"), &next)
	if next.ID == live.ID {
		t.Errorf("new endpoint reused restored ID %d", live.ID)
	}
	// The discarded endpoint's identity request went with it; the
	// restored addresses' hold rows go once IPAM has taken them.
	if _, _, ok := e.reqs.Get(e.db.ReadTxn(), identity.RequestEndpointIndex.Query(uint16(gone.ID))); ok {
		t.Errorf("the discarded endpoint's identity request is still there")
	}
	waitFor(t, "the IPAM hold rows deleted", func() bool { return e.ipamReqs.NumObjects(e.db.ReadTxn()) == 0 })
}

// TestRestoredEndpointsHaveIdentityWhenInitialized: the endpoints table
// is initialized only once the restored endpoints have resolved their
// identities again. Before, it was initialized with the restored rows
// still without identity, and the ipcache and the BPF loader, which prune
// what an initialized table does not want, removed the endpoints'
// ipcache entries and programs for a moment after every agent restart:
// packets between pods were dropped as from world or went unenforced.
func TestRestoredEndpointsHaveIdentityWhenInitialized(t *testing.T) {
	dir := t.TempDir()
	seed := func(txn statedb.WriteTxn, pods statedb.RWTable[*corev1.Pod]) {
		pods.Insert(txn, pod("live", "uid-live", map[string]string{"app": "web"}))
	}
	var live models.Endpoint
	t.Run("first agent", func(t *testing.T) {
		e := start(t, dir, nil, seed)
		req := addReq("c-live", "live", "10.0.0.40")
		req.InterfaceName = "lo"
		e.add(t, req, &live)
	})
	ids := &fakeIdentities{ids: map[string]identity.NumericIdentity{}, refs: map[identity.NumericIdentity]int{},
		entered: make(chan struct{}, 1), gate: make(chan struct{})}
	e := start(t, dir, ids, seed)
	// Restore is resolving the endpoint's identity, held by the gate.
	select {
	case <-ids.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("restore never allocated the endpoint's identity")
	}
	txn := e.db.ReadTxn()
	if ok, _ := e.eps.Initialized(txn); ok {
		cur, _, _ := e.eps.Get(txn, endpoints.IDIndex.Query(uint16(live.ID)))
		t.Errorf("endpoints table initialized while restored endpoint %d has no identity yet (%+v)", live.ID, cur)
	}
	close(ids.gate)
	waitFor(t, "the table initialized, with the endpoint's identity", func() bool {
		txn := e.db.ReadTxn()
		ok, _ := e.eps.Initialized(txn)
		cur, _, found := e.eps.Get(txn, endpoints.IDIndex.Query(uint16(live.ID)))
		return ok && found && cur.Identity != identity.InvalidIdentity
	})
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

// TestHealthEndpointInterface: the health endpoint row follows the
// health-interface row the datapath writes (so that routes and programs
// treat it like a pod's), only for its own address, and loses the
// interface when the row goes.
func TestHealthEndpointInterface(t *testing.T) {
	var ifaces statedb.RWTable[*health.Interface]
	e := startWith(t, t.TempDir(), nil, nil, nil,
		hive.Provide(health.NewInterfaceTable, statedb.RWTable[*health.Interface].ToTable),
		hivetest.Capture(&ifaces))
	healthEP := func() *endpoints.Endpoint {
		for ep := range e.eps.List(e.db.ReadTxn(), endpoints.CEPIndex.Query("kube-system/cilium-health-node-a")) {
			return ep
		}
		return nil
	}
	waitFor(t, "health endpoint", func() bool { return healthEP() != nil })
	set := func(rows ...*health.Interface) {
		wtxn := e.db.WriteTxn(ifaces)
		_ = ifaces.DeleteAll(wtxn)
		for _, r := range rows {
			_, _, _ = ifaces.Insert(wtxn, r)
		}
		wtxn.Commit()
	}
	row := &health.Interface{HostIfName: "lxc_health", HostIfIndex: 42, HostMAC: "02:00:00:00:00:01", MAC: "02:00:00:00:00:02",
		NetnsPath: "/var/run/netns/cilium-health", NetnsInode: 9, ContainerID: "cilium-health", IfName: "cilium", IPv4: netip.MustParseAddr("10.0.0.2")}
	set(row)
	waitFor(t, "the interface in the health endpoint row", func() bool {
		ep := healthEP()
		return ep.HostIfName == "lxc_health" && ep.HostIfIndex == 42 && ep.MAC == row.MAC && ep.HostMAC == row.HostMAC &&
			ep.NetnsPath == row.NetnsPath && ep.ContainerID == "cilium-health" && ep.ContainerIfName == "cilium"
	})
	other := *row
	other.IPv4, other.HostIfIndex = netip.MustParseAddr("10.0.0.99"), 43
	set(&other)
	waitFor(t, "an interface for another address to be ignored", func() bool {
		ep := healthEP()
		return ep.HostIfName == "" && ep.HostIfIndex == 0 && ep.ContainerID == ""
	})
	set(row)
	waitFor(t, "the interface again", func() bool { return healthEP().HostIfIndex == 42 })
	set()
	waitFor(t, "the interface to go with its row", func() bool { return healthEP().HostIfName == "" })
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

// TestConcurrentDeletesReleaseOnce: parallel DELETEs of one endpoint (a
// retried DEL, CNI GC beside DEL) release its address and its identity
// reference exactly once. On the old main every caller released both
// (identity references went negative).
func TestConcurrentDeletesReleaseOnce(t *testing.T) {
	e := start(t, t.TempDir(), nil, func(txn statedb.WriteTxn, pods statedb.RWTable[*corev1.Pod]) {
		pods.Insert(txn, pod("web-1", "uid-1", map[string]string{"app": "web"}))
		pods.Insert(txn, pod("web-2", "uid-2", map[string]string{"app": "web"}))
	})
	// web-2 keeps the shared identity alive: a double release would take
	// it to zero while web-2 uses it.
	var other models.Endpoint
	if code := e.add(t, addReq("keep", "web-2", "10.0.0.9"), &other); code != 201 {
		t.Fatalf("create web-2: %d", code)
	}
	const rounds, deleters = 20, 8
	for round := range rounds {
		cid := fmt.Sprintf("c%d", round)
		ip := fmt.Sprintf("10.0.0.%d", 10+round)
		var ep models.Endpoint
		if code := e.add(t, addReq(cid, "web-1", ip), &ep); code != 201 {
			t.Fatalf("round %d: create: %d", round, code)
		}
		codes := make(chan int, deleters)
		var wg sync.WaitGroup
		for i := range deleters {
			wg.Go(func() {
				path := "/endpoint?container-id=" + cid
				if i%2 == 1 {
					path = fmt.Sprintf("/endpoint/%d", ep.ID) // the CLI's delete by ID
				}
				codes <- e.do(t, "DELETE", path, nil, nil)
			})
		}
		wg.Wait()
		close(codes)
		ok := 0
		for c := range codes {
			switch c {
			case 200:
				ok++
			case 404:
			default:
				t.Errorf("round %d: DELETE answered %d", round, c)
			}
		}
		if ok == 0 {
			t.Errorf("round %d: no DELETE reported the deletion", round)
		}
		if n := e.ipam.releaseCount(ip); n != 1 {
			t.Errorf("round %d: address %s released %d times, want 1", round, ip, n)
		}
	}
	e.ids.mu.Lock()
	defer e.ids.mu.Unlock()
	if refs := e.ids.refs[identity.NumericIdentity(other.Status.Identity.ID)]; refs != 1 {
		t.Errorf("shared identity %d has %d references, want 1 (web-2's)", other.Status.Identity.ID, refs)
	}
}

// TestDeleteRacingReplaceReleasesOnce: a new sandbox's ADD replaces the
// pod's endpoint while the old sandbox's DEL runs: the old endpoint's
// address and identity reference are released once.
func TestDeleteRacingReplaceReleasesOnce(t *testing.T) {
	e := start(t, t.TempDir(), nil, func(txn statedb.WriteTxn, pods statedb.RWTable[*corev1.Pod]) {
		pods.Insert(txn, pod("web-1", "uid-1", map[string]string{"app": "web"}))
	})
	const rounds = 20
	var last models.Endpoint
	if code := e.add(t, addReq("s0", "web-1", "10.0.0.100"), &last); code != 201 {
		t.Fatalf("create: %d", code)
	}
	for round := 1; round <= rounds; round++ {
		oldCID, oldIP := fmt.Sprintf("s%d", round-1), fmt.Sprintf("10.0.0.%d", 99+round)
		req := addReq(fmt.Sprintf("s%d", round), "web-1", fmt.Sprintf("10.0.0.%d", 100+round))
		e.ipam.give(req.Addressing.IPV4, req.K8sPodName, req.ContainerID)
		var wg sync.WaitGroup
		wg.Go(func() {
			if code := e.do(t, "PUT", "/endpoint", req, &last); code != 201 {
				t.Errorf("round %d: replace: %d", round, code)
			}
		})
		wg.Go(func() { e.do(t, "DELETE", "/endpoint?container-id="+oldCID, nil, nil) })
		wg.Wait()
		calls := e.ipam.releaseCount(oldIP)
		_, held := e.ipam.owner(oldIP)
		if calls != 1 || held {
			t.Errorf("round %d: old address %s released %d times (still held: %v), want once", round, oldIP, calls, held)
		}
	}
	e.ids.mu.Lock()
	defer e.ids.mu.Unlock()
	if refs := e.ids.refs[identity.NumericIdentity(last.Status.Identity.ID)]; refs != 1 {
		t.Errorf("identity %d has %d references, want 1 (the last sandbox's)", last.Status.Identity.ID, refs)
	}
}

// TestCreateClaimsItsAllocation: an endpoint takes only an address IPAM
// allocated to its own container; on the old main any address was taken,
// and deleting the endpoint freed an address another pod held.
func TestCreateClaimsItsAllocation(t *testing.T) {
	e := start(t, t.TempDir(), nil, func(txn statedb.WriteTxn, pods statedb.RWTable[*corev1.Pod]) {
		pods.Insert(txn, pod("web-1", "uid-1", map[string]string{"app": "web"}))
		pods.Insert(txn, pod("db", "uid-2", map[string]string{"app": "db"}))
	})
	var apiErr models.Error
	if code := e.do(t, "PUT", "/endpoint", addReq("c1", "web-1", "10.0.0.50"), &apiErr); code != 400 ||
		!strings.Contains(apiErr.Message, "not allocated") {
		t.Errorf("endpoint with an address nobody allocated: %d %q, want 400", code, apiErr.Message)
	}
	e.ipam.give("10.0.0.51", "db", "c-db")
	if code := e.do(t, "PUT", "/endpoint", addReq("c1", "web-1", "10.0.0.51"), &apiErr); code != 409 ||
		!strings.Contains(apiErr.Message, "c-db") {
		t.Errorf("endpoint with another container's address: %d %q, want 409 naming the holder", code, apiErr.Message)
	}
	e.ipam.give("10.0.0.52", "web-1", "c-other")
	if code := e.do(t, "PUT", "/endpoint", addReq("c1", "web-1", "10.0.0.52"), &apiErr); code != 409 {
		t.Errorf("endpoint with the same pod's other container's address: %d %q, want 409", code, apiErr.Message)
	}
	for ep := range e.eps.All(e.db.ReadTxn()) {
		if !ep.Health {
			t.Errorf("endpoint created: %+v", ep)
		}
	}
	if o, ok := e.ipam.owner("10.0.0.51"); !ok || o.ContainerID != "c-db" {
		t.Errorf("db's address changed hands: %+v %v", o, ok)
	}
}

// TestAddForContainerWithEndpoint: a second ADD for a container that has
// an endpoint (another netns or interface) is refused and leaves the
// endpoint alone; its rollback (DELETE with ip=) frees only its own
// address. The same request again returns the existing endpoint. On the
// old main the rollback's delete by container ID removed the existing
// endpoint and its address.
func TestAddForContainerWithEndpoint(t *testing.T) {
	e := start(t, t.TempDir(), nil, func(txn statedb.WriteTxn, pods statedb.RWTable[*corev1.Pod]) {
		pods.Insert(txn, pod("web-1", "uid-1", map[string]string{"app": "web"}))
	})
	reqA := addReq("c1", "web-1", "10.0.0.60")
	reqA.NetnsPath = "/var/run/netns/a"
	var a models.Endpoint
	if code := e.add(t, reqA, &a); code != 201 {
		t.Fatalf("create A: %d", code)
	}
	var again models.Endpoint
	if code := e.do(t, "PUT", "/endpoint", reqA, &again); code != 201 || again.ID != a.ID {
		t.Errorf("same request again: %d, endpoint %d, want the existing %d", code, again.ID, a.ID)
	}
	reqB := addReq("c1", "web-1", "10.0.0.61")
	reqB.NetnsPath = "/var/run/netns/b"
	var apiErr models.Error
	if code := e.add(t, reqB, &apiErr); code != 409 || !strings.Contains(apiErr.Message, "already has endpoint") {
		t.Errorf("ADD into another netns: %d %q, want 409", code, apiErr.Message)
	}
	// The plugin's rollback of B.
	if code := e.do(t, "DELETE", "/endpoint?container-id=c1&ip=10.0.0.61", nil, nil); code != 200 {
		t.Errorf("rollback of B: %d, want 200 (B's address freed)", code)
	}
	cur, _, ok := e.eps.Get(e.db.ReadTxn(), endpoints.ContainerIndex.Query("c1"))
	if !ok || cur.ID != uint16(a.ID) || cur.NetnsPath != "/var/run/netns/a" || cur.State != ciliumv2.EndpointStateReady {
		t.Fatalf("A's endpoint after B's rollback: %+v, %v", cur, ok)
	}
	if _, held := e.ipam.owner("10.0.0.60"); !held {
		t.Errorf("A's address was freed")
	}
	if _, held := e.ipam.owner("10.0.0.61"); held {
		t.Errorf("B's address is still allocated")
	}
}

// TestDeleteWithoutEndpointFreesAddresses: an ADD that died after its
// allocation and before its endpoint leaves an address only its DEL
// knows; DEL frees it by container ID (200), then finds nothing (404).
// On the old main DEL answered 404 and the address leaked.
func TestDeleteWithoutEndpointFreesAddresses(t *testing.T) {
	e := start(t, t.TempDir(), nil, nil)
	e.ipam.give("10.0.0.70", "p", "dead")
	e.ipam.give("10.0.0.71", "p", "alive")
	if code := e.do(t, "DELETE", "/endpoint?container-id=dead", nil, nil); code != 200 {
		t.Errorf("DEL of a container with an address and no endpoint: %d, want 200", code)
	}
	if _, held := e.ipam.owner("10.0.0.70"); held {
		t.Errorf("the dead ADD's address is still allocated")
	}
	if _, held := e.ipam.owner("10.0.0.71"); !held {
		t.Errorf("another container's address was freed")
	}
	if code := e.do(t, "DELETE", "/endpoint?container-id=dead", nil, nil); code != 404 {
		t.Errorf("second DEL: %d, want 404", code)
	}
}

// TestRestoredAddressesHeldBeforeIPAMServes: after a restart, the
// addresses of the saved endpoints are held by the real IPAM before it
// hands out its first address, even while restore itself still waits (for
// the pods table here). On the old main restore re-claimed them one by one
// after the pool served, so a new pod got a running pod's address.
func TestRestoredAddressesHeldBeforeIPAMServes(t *testing.T) {
	dir := t.TempDir()
	t.Run("first agent", func(t *testing.T) {
		e := start(t, dir, nil, func(txn statedb.WriteTxn, pods statedb.RWTable[*corev1.Pod]) {
			pods.Insert(txn, pod("live", "uid-live", map[string]string{"app": "web"}))
		})
		req := addReq("c-live", "live", "10.0.5.2") // the first address the new pool hands out
		req.InterfaceName = "lo"
		if code := e.add(t, req, nil); code != 201 {
			t.Fatalf("create: %d", code)
		}
	})

	var (
		db      *statedb.DB
		cns     statedb.RWTable[*ciliumv2.CiliumNode]
		alloc   ipam.Allocator
		podsRW  statedb.RWTable[*corev1.Pod]
		podSync func(statedb.WriteTxn)
	)
	hivetest.Start(t, []string{"--state-dir=" + dir, "--socket-path=" + filepath.Join(t.TempDir(), "api.sock")},
		statedir.Cell, agentapi.Cell, ipam.Cell,
		hive.Provide(
			k8stables.NewPodsTable, statedb.RWTable[*corev1.Pod].ToTable,
			k8stables.NewNamespacesTable, statedb.RWTable[*corev1.Namespace].ToTable,
			k8stables.NewNodesTable, statedb.RWTable[*corev1.Node].ToTable,
			nodes.NewLocalNodeTable, statedb.RWTable[*nodes.LocalNode].ToTable,
			k8stables.NewCiliumNodesTable, statedb.RWTable[*ciliumv2.CiliumNode].ToTable,
			k8s.DisabledClientset,
			func() identitycell.Allocator {
				return &fakeIdentities{ids: map[string]identity.NumericIdentity{}, refs: map[identity.NumericIdentity]int{}}
			},
			func() identitycell.LabelFilter { return filter{} },
			func() identitycell.ClusterName { return "default" },
			func() k8s.NodeName { return "node-a" },
		),
		endpointpolicytest.New().Cell(),
		endpointmanager.Cell, identitycell.Responder, ipam.Responder,
		hive.Invoke(func(d *statedb.DB, c statedb.RWTable[*ciliumv2.CiliumNode], a ipam.Allocator, pods statedb.RWTable[*corev1.Pod]) {
			db, cns, alloc, podsRW = d, c, a, pods
			// The pods table is not synced yet: restore waits for it.
			txn := db.WriteTxn(pods)
			podSync = pods.RegisterInitializer(txn, "test")
			txn.Commit()
		}),
	)
	txn := db.WriteTxn(cns)
	cns.Insert(txn, &ciliumv2.CiliumNode{ObjectMeta: metav1.ObjectMeta{Name: "node-a"},
		Spec: ciliumv2.NodeSpec{IPAM: ciliumv2.IPAMSpec{PodCIDRs: []string{"10.0.5.0/24"}}}})
	txn.Commit()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	al, err := alloc.AllocateNext(ctx, ipam.Owner{Name: "default/new", ContainerID: "c-new"})
	if err != nil {
		t.Fatal(err)
	}
	if al.IP == netip.MustParseAddr("10.0.5.2") {
		t.Errorf("a new pod got %s, the address of the restored endpoint", al.IP)
	}
	// Restore finishes; the endpoint keeps its address.
	wtxn := db.WriteTxn(podsRW)
	podsRW.Insert(wtxn, pod("live", "uid-live", map[string]string{"app": "web"}))
	podSync(wtxn)
	wtxn.Commit()
	if err := alloc.Claim(ctx, netip.MustParseAddr("10.0.5.2"), ipam.Owner{Name: "default/live", ContainerID: "c-live"}); err != nil {
		t.Errorf("restored endpoint's address is not its container's: %v", err)
	}
}

// TestDeleteRacingRestoreReleasesOnce: a CNI DEL of a restored endpoint
// while restore still waits (for the pods table) deletes it; restore then
// neither re-claims its address nor releases anything again. On the old
// main restore claimed the freed address again for the deleted endpoint.
func TestDeleteRacingRestoreReleasesOnce(t *testing.T) {
	dir := t.TempDir()
	t.Run("first agent", func(t *testing.T) {
		e := start(t, dir, nil, func(txn statedb.WriteTxn, pods statedb.RWTable[*corev1.Pod]) {
			pods.Insert(txn, pod("live", "uid-live", map[string]string{"app": "web"}))
		})
		req := addReq("c-live", "live", "10.0.0.80")
		req.InterfaceName = "lo"
		if code := e.add(t, req, nil); code != 201 {
			t.Fatalf("create: %d", code)
		}
	})
	var podSync func(statedb.WriteTxn)
	e := start(t, dir, nil, func(txn statedb.WriteTxn, pods statedb.RWTable[*corev1.Pod]) {
		pods.Insert(txn, pod("live", "uid-live", map[string]string{"app": "web"}))
		podSync = pods.RegisterInitializer(txn, "test") // restore waits
	})
	if code := e.do(t, "DELETE", "/endpoint?container-id=c-live", nil, nil); code != 200 {
		t.Fatalf("DEL of the restored endpoint: %d", code)
	}
	txn := e.db.WriteTxn(e.pods)
	podSync(txn)
	txn.Commit()
	waitFor(t, "restore to finish", func() bool {
		ok, _ := e.eps.Initialized(e.db.ReadTxn())
		return ok
	})
	if _, held := e.ipam.owner("10.0.0.80"); held {
		t.Errorf("restore claimed the deleted endpoint's address again")
	}
	if n := e.ipam.releaseCount("10.0.0.80"); n != 1 {
		t.Errorf("address released %d times, want 1", n)
	}
	if _, _, ok := e.eps.Get(e.db.ReadTxn(), endpoints.ContainerIndex.Query("c-live")); ok {
		t.Errorf("deleted endpoint is back")
	}
	// The table is initialized after restore's first step; the identity
	// that step may have been resolving for the endpoint when the DEL came
	// is released when it finds the endpoint gone.
	waitFor(t, "every identity reference released", func() bool {
		e.ids.mu.Lock()
		defer e.ids.mu.Unlock()
		for _, refs := range e.ids.refs {
			if refs != 0 {
				return false
			}
		}
		return true
	})
}

// Each endpoint has exactly one identity request, answered with the
// identity the endpoint shows; deleting the endpoint deletes its request
// (and so drops the reference), and so does a failed ADD.
func TestIdentityRequestsFollowEndpoints(t *testing.T) {
	ids := newIDs(0)
	e := start(t, t.TempDir(), ids, func(txn statedb.WriteTxn, pods statedb.RWTable[*corev1.Pod]) {
		pods.Insert(txn, pod("web-1", "uid-1", map[string]string{"app": "web"}))
		pods.Insert(txn, pod("web-2", "uid-2", map[string]string{"app": "other"}))
	})
	var ep models.Endpoint
	if code := e.add(t, addReq("c1", "web-1", "10.0.0.10"), &ep); code != 201 {
		t.Fatalf("create: %d", code)
	}
	req, _, ok := e.reqs.Get(e.db.ReadTxn(), identity.RequestEndpointIndex.Query(uint16(ep.ID)))
	if !ok || !req.Answered() || int64(req.Result.ID) != ep.Status.Identity.ID {
		t.Fatalf("request of endpoint %d: %+v (found %v), want answered with identity %d", ep.ID, req, ok, ep.Status.Identity.ID)
	}
	if code := e.do(t, "DELETE", "/endpoint?container-id=c1", nil, nil); code != 200 {
		t.Fatalf("delete: %d", code)
	}
	if _, _, ok := e.reqs.Get(e.db.ReadTxn(), identity.RequestEndpointIndex.Query(uint16(ep.ID))); ok {
		t.Error("the deleted endpoint's identity request is still there")
	}
	waitFor(t, "the deleted endpoint's reference dropped", func() bool {
		ids.mu.Lock()
		defer ids.mu.Unlock()
		return ids.refs[identity.NumericIdentity(ep.Status.Identity.ID)] == 0
	})

	// A failed ADD leaves no request behind.
	ids.mu.Lock()
	ids.failN = 1
	ids.mu.Unlock()
	if code := e.add(t, addReq("c2", "web-2", "10.0.0.11"), nil); code < 500 {
		t.Fatalf("ADD with a failing identity allocation: %d, want a 5xx", code)
	}
	// (The health endpoint's request stays.)
	txn := e.db.ReadTxn()
	for r := range e.reqs.All(txn) {
		if _, _, ok := e.eps.Get(txn, endpoints.IDIndex.Query(r.Endpoint)); !ok {
			t.Errorf("identity request of endpoint %d, which does not exist: %+v", r.Endpoint, r)
		}
	}
	if n := e.reqs.NumObjects(txn); n != e.eps.NumObjects(txn) {
		t.Errorf("%d identity requests for %d endpoints", n, e.eps.NumObjects(txn))
	}
	// Every IPAM request was answered and deleted by its asker.
	if n := e.ipamReqs.NumObjects(txn); n != 0 {
		t.Errorf("%d IPAM requests left: %v", n, statedb.Collect(e.ipamReqs.All(txn)))
	}
}

// Concurrent ADDs of pods with the same labels share one identity with
// one reference each; concurrent DELs drop every reference and leave no
// request behind.
func TestConcurrentAddsShareIdentityReferences(t *testing.T) {
	const n = 12
	ids := newIDs(0)
	e := start(t, t.TempDir(), ids, func(txn statedb.WriteTxn, pods statedb.RWTable[*corev1.Pod]) {
		for i := range n {
			pods.Insert(txn, pod(fmt.Sprintf("web-%d", i), fmt.Sprintf("uid-%d", i), map[string]string{"app": "web"}))
		}
	})
	eps := make([]models.Endpoint, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			if code := e.add(t, addReq(fmt.Sprintf("c%d", i), fmt.Sprintf("web-%d", i), fmt.Sprintf("10.0.0.%d", 10+i)), &eps[i]); code != 201 {
				t.Errorf("create web-%d: %d", i, code)
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	id := identity.NumericIdentity(eps[0].Status.Identity.ID)
	for i, ep := range eps {
		if identity.NumericIdentity(ep.Status.Identity.ID) != id {
			t.Errorf("web-%d has identity %d, web-0 %d", i, ep.Status.Identity.ID, id)
		}
	}
	ids.mu.Lock()
	refs := ids.refs[id]
	ids.mu.Unlock()
	if refs != n {
		t.Errorf("%d references to identity %d, want %d", refs, id, n)
	}
	for i := range n {
		wg.Go(func() {
			if code := e.do(t, "DELETE", fmt.Sprintf("/endpoint?container-id=c%d", i), nil, nil); code != 200 {
				t.Errorf("delete c%d: %d", i, code)
			}
		})
	}
	wg.Wait()
	waitFor(t, "every reference dropped", func() bool {
		ids.mu.Lock()
		defer ids.mu.Unlock()
		return ids.refs[id] == 0
	})
	txn := e.db.ReadTxn()
	if got, want := e.reqs.NumObjects(txn), e.eps.NumObjects(txn); got != want {
		t.Errorf("%d identity requests for %d endpoints", got, want)
	}
	if got := e.ipamReqs.NumObjects(txn); got != 0 {
		t.Errorf("%d IPAM requests left", got)
	}
}
