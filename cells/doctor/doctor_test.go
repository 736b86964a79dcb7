package doctor_test

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/cilium/statedb"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	"github.com/cellium/cellium/api/v1/models"
	"github.com/cellium/cellium/cells/agentapi"
	"github.com/cellium/cellium/cells/cepsync"
	"github.com/cellium/cellium/cells/doctor"
	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/cells/hive/hivetest"
	"github.com/cellium/cellium/cells/k8s"
	"github.com/cellium/cellium/cells/statedir"
	"github.com/cellium/cellium/statedb/endpoints"
	"github.com/cellium/cellium/statedb/identity"
	ipamtables "github.com/cellium/cellium/statedb/ipam"
	k8stables "github.com/cellium/cellium/statedb/k8s"
	"github.com/cellium/cellium/statedb/nodes"
)

const (
	nodeName = "node-a"
	nodeIP   = "192.168.7.10"
)

// fakeIPAM stands in for the IPAM cell: it writes the real allocations
// table, which it initializes (the node has pod CIDRs) with the first
// address it adds.
type fakeIPAM struct {
	db       *statedb.DB
	table    statedb.RWTable[*ipamtables.Allocation]
	initDone func(statedb.WriteTxn)
}

// newFakeIPAM creates the table, not initialized.
func newFakeIPAM(db *statedb.DB) (*fakeIPAM, statedb.Table[*ipamtables.Allocation], error) {
	table, err := ipamtables.NewTable(db)
	if err != nil {
		return nil, nil, err
	}
	txn := db.WriteTxn(table)
	done := table.RegisterInitializer(txn, "test")
	txn.Commit()
	return &fakeIPAM{db: db, table: table, initDone: done}, table, nil
}

func (f *fakeIPAM) add(ip, owner string) {
	txn := f.db.WriteTxn(f.table)
	f.table.Insert(txn, &ipamtables.Allocation{IP: netip.MustParseAddr(ip), Owner: owner})
	if f.initDone != nil {
		f.initDone(txn)
		f.initDone = nil
	}
	txn.Commit()
}

// fakeLinks returns links, then after each call the next entry of later
// (if any): a fault that goes away.
type fakeLinks struct {
	mu    sync.Mutex
	links []doctor.HostLink
	later [][]doctor.HostLink
	calls int
}

func (f *fakeLinks) ListHostLinks() ([]doctor.HostLink, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	out := f.links
	if len(f.later) > 0 {
		f.links, f.later = f.later[0], f.later[1:]
	}
	return out, nil
}

type env struct {
	t        *testing.T
	db       *statedb.DB
	eps      statedb.RWTable[*endpoints.Endpoint]
	pods     statedb.RWTable[*corev1.Pod]
	ceps     statedb.RWTable[*ciliumv2.CiliumEndpoint]
	ids      statedb.RWTable[*identity.Allocation]
	ipam     *fakeIPAM
	links    *fakeLinks
	stateDir string
	api      *http.Client
}

// start runs the doctor with the agent API, fake IPAM and links, and real
// tables holding a clean node: a pod endpoint and the health endpoint.
func start(t *testing.T, settle string, extra ...hive.Cell) *env {
	t.Helper()
	e := startEmpty(t, settle, extra...)
	e.cleanNode()
	return e
}

// startEmpty runs the doctor like start, with empty tables and IPAM
// without pod CIDRs.
func startEmpty(t *testing.T, settle string, extra ...hive.Cell) *env {
	t.Helper()
	dir := t.TempDir()
	e := &env{t: t, links: &fakeLinks{}, stateDir: filepath.Join(dir, "state")}
	socket := filepath.Join(dir, "api.sock")
	hivetest.Start(t, []string{"--state-dir=" + e.stateDir, "--socket-path=" + socket, "--doctor-settle-time=" + settle},
		statedir.Cell,
		agentapi.Cell,
		hive.Provide(
			endpoints.NewTable, statedb.RWTable[*endpoints.Endpoint].ToTable,
			k8stables.NewPodsTable, statedb.RWTable[*corev1.Pod].ToTable,
			k8stables.NewNodesTable, statedb.RWTable[*corev1.Node].ToTable,
			nodes.NewLocalNodeTable, statedb.RWTable[*nodes.LocalNode].ToTable,
			k8stables.NewCiliumEndpointsTable, statedb.RWTable[*ciliumv2.CiliumEndpoint].ToTable,
			func() k8s.NodeName { return nodeName },
			func(db *statedb.DB) (statedb.Table[*ipamtables.Allocation], error) {
				f, table, err := newFakeIPAM(db)
				e.ipam = f
				return table, err
			},
			func() doctor.LinkLister { return e.links },
			identity.NewAllocationsTable, statedb.RWTable[*identity.Allocation].ToTable,
		),
		doctor.Cell,
		hive.Group(extra...),
		hive.Invoke(func(db *statedb.DB, eps statedb.RWTable[*endpoints.Endpoint], pods statedb.RWTable[*corev1.Pod],
			local statedb.RWTable[*nodes.LocalNode], ceps statedb.RWTable[*ciliumv2.CiliumEndpoint], ids statedb.RWTable[*identity.Allocation]) error {
			e.db, e.eps, e.pods, e.ceps, e.ids = db, eps, pods, ceps, ids
			txn := db.WriteTxn(local)
			if _, _, err := local.Insert(txn, &nodes.LocalNode{Name: nodeName, InternalIP: netip.MustParseAddr(nodeIP)}); err != nil {
				return err
			}
			txn.Commit()
			return nil
		}),
	)
	e.api = &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", socket)
	}}}
	t.Cleanup(e.api.CloseIdleConnections)
	return e
}

func cep(ns, name string) *ciliumv2.CiliumEndpoint {
	return &ciliumv2.CiliumEndpoint{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Status: ciliumv2.EndpointStatus{Networking: &ciliumv2.EndpointNetworking{NodeIP: nodeIP}}}
}

// cleanNode fills everything for endpoint 1 (pod default/web) and the
// health endpoint 2, all in agreement.
func (e *env) cleanNode() {
	t := e.t
	txn := e.db.WriteTxn(e.eps, e.pods, e.ceps, e.ids)
	e.eps.Insert(txn, &endpoints.Endpoint{ID: 1, ContainerID: "c-web", PodNamespace: "default", PodName: "web",
		CEPNamespace: "default", CEPName: "web", HostIfName: "lxcweb", IPv4: netip.MustParseAddr("10.0.0.5"), Identity: 70000})
	e.eps.Insert(txn, &endpoints.Endpoint{ID: 2, Health: true, CEPNamespace: "kube-system", CEPName: "cilium-health-" + nodeName,
		IPv4: netip.MustParseAddr("10.0.0.2"), Identity: 4})
	e.pods.Insert(txn, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web"},
		Spec: corev1.PodSpec{NodeName: nodeName}, Status: corev1.PodStatus{PodIP: "10.0.0.5", Phase: corev1.PodRunning}})
	e.ceps.Insert(txn, cep("default", "web"))
	e.ceps.Insert(txn, cep("kube-system", "cilium-health-"+nodeName))
	other := cep("default", "elsewhere") // another node's: not ours to judge
	other.Status.Networking.NodeIP = "192.168.7.99"
	e.ceps.Insert(txn, other)
	e.ids.Insert(txn, &identity.Allocation{ID: 70000, Refs: 1})
	txn.Commit()
	e.ipam.add("10.0.0.1", "router")
	e.ipam.add("10.0.0.2", "health")
	e.ipam.add("10.0.0.5", "default/web")
	e.links.links = []doctor.HostLink{{Name: "lxcweb", ContainerID: "c-web"}}
	e.writeStateFile(1)
	e.writeStateFile(2)
	if err := os.WriteFile(filepath.Join(e.stateDir, "endpoints", ".tmp-123"), nil, 0o600); err != nil {
		t.Fatal(err) // an interrupted save: not a state file
	}
}

func (e *env) writeStateFile(id int) {
	dir := filepath.Join(e.stateDir, "endpoints")
	if err := os.MkdirAll(dir, 0o750); err != nil {
		e.t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, itoa(id)+".json"), []byte("{}"), 0o600); err != nil {
		e.t.Fatal(err)
	}
}

func itoa(n int) string { return strconv.Itoa(n) }

func (e *env) doctor() (models.DoctorReport, string) {
	e.t.Helper()
	resp, err := e.api.Get("http://agent/v1/doctor")
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		e.t.Fatalf("GET /v1/doctor = %d %s", resp.StatusCode, data)
	}
	var r models.DoctorReport
	if err := json.Unmarshal(data, &r); err != nil {
		e.t.Fatal(err)
	}
	return r, string(data)
}

func TestCleanNodeHasNoFindings(t *testing.T) {
	e := start(t, "0")
	r, raw := e.doctor()
	if len(r.Findings) != 0 || len(r.Skipped) != 0 {
		t.Fatalf("clean node: %s", raw)
	}
	if !strings.Contains(raw, `"findings": []`) {
		t.Errorf("body %s: want an empty findings list, not null", raw)
	}
}

// TestPlantedFaultsAreNamed plants each fault of the issue (and a few
// more) into a clean node and expects exactly those findings.
func TestPlantedFaultsAreNamed(t *testing.T) {
	e := start(t, "0")
	// Leaked IP: allocated to a pod that is gone, used by no endpoint.
	e.ipam.add("10.0.0.9", "default/gone")
	// Stale state file: endpoint 7 does not exist.
	e.writeStateFile(7)
	// CEP without endpoint on this node.
	txn := e.db.WriteTxn(e.ceps, e.eps, e.ids)
	e.ceps.Insert(txn, cep("default", "ghost"))
	// Endpoint 3 whose IP nobody allocated, with no veth, no CEP, no pod,
	// no state file, and an identity this agent holds no reference to.
	e.eps.Insert(txn, &endpoints.Endpoint{ID: 3, ContainerID: "c-x", PodNamespace: "default", PodName: "x",
		CEPNamespace: "default", CEPName: "x", HostIfName: "lxcx", IPv4: netip.MustParseAddr("10.0.0.33"), Identity: 70001})
	// An identity with one reference more than endpoints using it.
	e.ids.Insert(txn, &identity.Allocation{ID: 70002, Refs: 1})
	txn.Commit()
	// Orphan veth.
	e.links.links = append(e.links.links, doctor.HostLink{Name: "lxcorphan", ContainerID: "c-old"})

	r, raw := e.doctor()
	got := map[string]bool{}
	for _, f := range r.Findings {
		got[f.Kind+" "+f.Object] = true
		if f.Message == "" || f.Hint == "" {
			t.Errorf("finding %+v lacks a message or a hint", f)
		}
	}
	want := []string{
		"leaked-ip 10.0.0.9",
		"stale-state-file " + filepath.Join(e.stateDir, "endpoints", "7.json"),
		"cep-without-endpoint cep default/ghost",
		"orphan-veth lxcorphan",
		"ip-not-allocated endpoint 3 (default/x)",
		"endpoint-without-veth endpoint 3 (default/x)",
		"endpoint-without-cep endpoint 3 (default/x)",
		"endpoint-without-pod endpoint 3 (default/x)",
		"endpoint-without-state-file endpoint 3 (default/x)",
		"identity-unreferenced endpoint 3 (default/x)",
		"identity-refcount identity 70002",
	}
	for _, w := range want {
		if !got[w] {
			t.Errorf("missing finding %q", w)
		}
		delete(got, w)
	}
	for g := range got {
		t.Errorf("unexpected finding %q", g)
	}
	if t.Failed() {
		t.Logf("report: %s", raw)
	}
	for _, f := range r.Findings {
		if f.Kind == "leaked-ip" && !strings.Contains(f.Message, "owner pod no longer exists") {
			t.Errorf("leaked-ip message %q does not say why", f.Message)
		}
	}
}

// TestSettleDropsTransientFindings: a veth that exists at the first look
// and is gone at the second (an ADD finishing, a DEL in progress) is not
// reported.
func TestSettleDropsTransientFindings(t *testing.T) {
	e := start(t, "1ms")
	clean := e.links.links
	e.links.links = append(append([]doctor.HostLink(nil), clean...), doctor.HostLink{Name: "lxcbusy"})
	e.links.later = [][]doctor.HostLink{clean}
	r, raw := e.doctor()
	if len(r.Findings) != 0 {
		t.Errorf("a transient veth was reported: %s", raw)
	}
	if e.links.calls != 2 {
		t.Errorf("links listed %d times, want 2 (a second look)", e.links.calls)
	}
	// A lasting one is reported.
	e.links.links = append(append([]doctor.HostLink(nil), clean...), doctor.HostLink{Name: "lxcstuck"})
	if r, raw = e.doctor(); len(r.Findings) != 1 || r.Findings[0].Object != "lxcstuck" {
		t.Errorf("a lasting orphan veth: %s", raw)
	}
}

// TestCEPChecksOffWithoutCEPs: with --disable-endpoint-crd no endpoint
// lacks a CEP.
func TestCEPChecksOffWithoutCEPs(t *testing.T) {
	e := start(t, "0", hive.Provide(func() cepsync.Config { return cepsync.Config{DisableEndpointCRD: true} }))
	txn := e.db.WriteTxn(e.ceps)
	e.ceps.DeleteAll(txn)
	txn.Commit()
	r, raw := e.doctor()
	if len(r.Findings) != 0 || len(r.Skipped) != 1 || !strings.Contains(r.Skipped[0], "--disable-endpoint-crd") {
		t.Errorf("report %s: want no findings and the CEP checks skipped", raw)
	}
}

// TestUnsyncedSourcesAreSkipped: checks whose source is not ready are
// listed as skipped, not reported as faults.
func TestUnsyncedSourcesAreSkipped(t *testing.T) {
	e := startEmpty(t, "0") // no pod CIDRs yet
	r, raw := e.doctor()
	if len(r.Findings) != 0 || len(r.Skipped) != 1 || !strings.Contains(r.Skipped[0], "no pod CIDRs") {
		t.Errorf("report %s: want no findings and the IP checks skipped", raw)
	}
}
