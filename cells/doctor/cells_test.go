package doctor_test

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/cilium/statedb"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	"github.com/cellium/cellium/api/v1/models"
	"github.com/cellium/cellium/cells/agentapi"
	"github.com/cellium/cellium/cells/doctor"
	"github.com/cellium/cellium/cells/endpointmanager"
	"github.com/cellium/cellium/cells/endpointpolicy/endpointpolicytest"
	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/cells/hive/hivetest"
	identitycell "github.com/cellium/cellium/cells/identity"
	"github.com/cellium/cellium/cells/ipam"
	"github.com/cellium/cellium/cells/k8s"
	"github.com/cellium/cellium/cells/statedir"
	"github.com/cellium/cellium/statedb/identity"
	k8stables "github.com/cellium/cellium/statedb/k8s"
	"github.com/cellium/cellium/statedb/labels"
	"github.com/cellium/cellium/statedb/nodes"
)

// countingIdentities gives every label set identity 70000.
type countingIdentities struct {
	mu   sync.Mutex
	refs int
}

func (c *countingIdentities) Allocate(_ context.Context, l labels.Labels) (identitycell.Identity, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.refs++
	return identitycell.Identity{ID: 70000, Labels: l}, nil
}

// Restore ignores restored identities: the fake allocates without an API.
func (c *countingIdentities) Restore(labels.Labels, identity.NumericIdentity) {}

func (c *countingIdentities) Release(context.Context, identity.NumericIdentity) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.refs--
	return nil
}

func (c *countingIdentities) Lookup(identity.NumericIdentity) (identitycell.Identity, bool) {
	return identitycell.Identity{}, false
}

type allLabels struct{}

func (allLabels) Split(l labels.Labels) (labels.Labels, labels.Labels) { return l, labels.Labels{} }

// TestDoctorOverRealCells runs the doctor beside the real IPAM and
// endpoint manager: an endpoint made the way the CNI plugin makes it
// (POST /v1/ipam, then PUT /v1/endpoint) is clean, and a leaked IP and a
// stale state file are named. This pins the conventions the doctor reads
// from those cells: the IPAM owner of a pod's address, the state files'
// directory and names.
func TestDoctorOverRealCells(t *testing.T) {
	dir := t.TempDir()
	stateDir := filepath.Join(dir, "state")
	socket := filepath.Join(dir, "api.sock")
	var (
		db   *statedb.DB
		cns  statedb.RWTable[*ciliumv2.CiliumNode]
		pods statedb.RWTable[*corev1.Pod]
	)
	hivetest.Start(t, []string{"--state-dir=" + stateDir, "--socket-path=" + socket, "--doctor-settle-time=0"},
		statedir.Cell,
		agentapi.Cell,
		hive.Provide(
			k8stables.NewPodsTable, statedb.RWTable[*corev1.Pod].ToTable,
			k8stables.NewNamespacesTable, statedb.RWTable[*corev1.Namespace].ToTable,
			k8stables.NewNodesTable, statedb.RWTable[*corev1.Node].ToTable,
			nodes.NewLocalNodeTable, statedb.RWTable[*nodes.LocalNode].ToTable,
			k8stables.NewCiliumNodesTable, statedb.RWTable[*ciliumv2.CiliumNode].ToTable,
			k8s.DisabledClientset,
			func() k8s.NodeName { return nodeName },
			func() identitycell.Allocator { return &countingIdentities{} },
			func() identitycell.LabelFilter { return allLabels{} },
			func() identitycell.ClusterName { return "default" },
		),
		ipam.Cell,
		endpointpolicytest.New().Cell(),
		endpointmanager.Cell, identitycell.Responder, ipam.Responder,
		doctor.Cell,
		hivetest.Capture(&db), hivetest.Capture(&cns), hivetest.Capture(&pods),
	)
	txn := db.WriteTxn(cns, pods)
	cns.Insert(txn, &ciliumv2.CiliumNode{ObjectMeta: metav1.ObjectMeta{Name: nodeName},
		Spec: ciliumv2.NodeSpec{IPAM: ciliumv2.IPAMSpec{PodCIDRs: []string{"10.0.9.0/24"}}}})
	pods.Insert(txn, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web", UID: "uid-web"},
		Spec: corev1.PodSpec{NodeName: nodeName}})
	txn.Commit()

	c := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", socket)
	}}}
	t.Cleanup(c.CloseIdleConnections)
	call := func(method, path, body string, out any) {
		t.Helper()
		req, _ := http.NewRequest(method, "http://agent"+path, strings.NewReader(body))
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		data, _ := io.ReadAll(resp.Body)
		if resp.StatusCode >= 300 {
			t.Fatalf("%s %s = %d %s", method, path, resp.StatusCode, data)
		}
		if out != nil {
			if err := json.Unmarshal(data, out); err != nil {
				t.Fatal(err)
			}
		}
	}
	// What the CNI plugin does for default/web.
	var alloc models.IPAMResponse
	call("POST", "/v1/ipam?owner=default/web", "", &alloc)
	req, _ := json.Marshal(models.EndpointChangeRequest{ContainerID: "c-web", ContainerInterfaceName: "eth0",
		K8sNamespace: "default", K8sPodName: "web", K8sUID: "uid-web", InterfaceName: "lxcweb",
		Addressing: models.AddressPair{IPV4: alloc.IPv4.IP}, SyncBuildEndpoint: true})
	call("PUT", "/v1/endpoint", string(req), nil)

	var report models.DoctorReport
	call("GET", "/v1/doctor", "", &report)
	if len(report.Findings) != 0 {
		t.Fatalf("a node with one endpoint made as the CNI plugin makes it: %+v", report)
	}
	if len(report.Skipped) == 0 {
		t.Errorf("no CEPs, veths or identity table here, but nothing was skipped: %+v", report)
	}

	// Plant: an address allocated to a pod that does not exist, and a
	// state file of an endpoint that does not.
	var leaked models.IPAMResponse
	call("POST", "/v1/ipam?owner=default/gone", "", &leaked)
	stale := filepath.Join(stateDir, "endpoints", "4000.json")
	if err := os.WriteFile(stale, []byte("{}"), 0o600); err != nil {
		t.Fatal(err)
	}
	call("GET", "/v1/doctor", "", &report)
	var got []string
	for _, f := range report.Findings {
		got = append(got, f.Kind+" "+f.Object)
	}
	want := []string{"leaked-ip " + leaked.IPv4.IP, "stale-state-file " + stale}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("findings %q, want %q", got, want)
	}
}
