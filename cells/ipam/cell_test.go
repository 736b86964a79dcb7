package ipam_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cilium/statedb"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	"github.com/cellium/cellium/api/v1/models"
	"github.com/cellium/cellium/cells/agentapi"
	"github.com/cellium/cellium/cells/cniconfig"
	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/cells/hive/hivetest"
	"github.com/cellium/cellium/cells/ipam"
	"github.com/cellium/cellium/cells/ipam/pool"
	"github.com/cellium/cellium/cells/k8s"
	"github.com/cellium/cellium/cells/statedir"
	ipamtables "github.com/cellium/cellium/statedb/ipam"
	k8stables "github.com/cellium/cellium/statedb/k8s"
)

// testTables stands in for the k8s resource cells: the tables the IPAM
// cell reads, written by the test.
var testTables = hive.Module("test-tables", "Tables fed by the test",
	hive.Provide(
		k8stables.NewCiliumNodesTable, statedb.RWTable[*ciliumv2.CiliumNode].ToTable,
		k8stables.NewPodsTable, statedb.RWTable[*corev1.Pod].ToTable,
	),
)

type env struct {
	h      *hive.Hive
	db     *statedb.DB
	cns    statedb.RWTable[*ciliumv2.CiliumNode]
	alloc  ipam.Allocator
	allocs statedb.Table[*ipamtables.Allocation]
	health hive.HealthReporter
	client *http.Client
}

// startIPAM starts the IPAM cell and the agent API with the given state
// directory and extra cells; the hive stops when the test ends unless
// stopped before.
func startIPAM(t *testing.T, stateDir string, extra ...hive.Cell) *env {
	t.Helper()
	e := &env{}
	sock := filepath.Join(t.TempDir(), "cellium.sock")
	cells := append([]hive.Cell{
		hive.Provide(func() k8s.NodeName { return "node1" }),
		testTables, statedir.Cell, ipam.Cell, agentapi.Cell,
		hivetest.Capture(&e.db), hivetest.Capture(&e.cns), hivetest.Capture(&e.alloc), hivetest.Capture(&e.allocs), hivetest.Capture(&e.health),
	}, extra...)
	e.h = hivetest.New(t, []string{"--state-dir=" + stateDir, "--socket-path=" + sock}, cells...)
	if err := e.h.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.h.Stop(context.Background()) })
	e.client = &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", sock)
		},
	}}
	t.Cleanup(e.client.CloseIdleConnections)
	return e
}

func (e *env) setCiliumNode(t *testing.T, name string, cidrs ...string) {
	t.Helper()
	txn := e.db.WriteTxn(e.cns)
	e.cns.Insert(txn, &ciliumv2.CiliumNode{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: ciliumv2.NodeSpec{IPAM: ciliumv2.IPAMSpec{PodCIDRs: cidrs}}})
	txn.Commit()
}

func (e *env) do(t *testing.T, method, path string, out any) int {
	t.Helper()
	req, err := http.NewRequest(method, "http://agent"+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := e.client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if out != nil && resp.StatusCode < 300 {
		if err := json.Unmarshal(body, out); err != nil {
			t.Fatalf("%s %s: decode %q: %v", method, path, body, err)
		}
	}
	return resp.StatusCode
}

// podCIDRsHealth is the health of the job that follows the pod CIDRs.
func podCIDRsHealth(e *env) hive.HealthStatus {
	for _, s := range e.health.Statuses() {
		if s.Module == "ipam" && s.ID == "job-pod-cidrs" {
			return s
		}
	}
	return hive.HealthStatus{}
}

func TestCellWaitsForPodCIDRs(t *testing.T) {
	e := startIPAM(t, t.TempDir())
	// Another node's CIDRs are not ours.
	e.setCiliumNode(t, "node2", "10.0.9.0/24")
	e.setCiliumNode(t, "node1")
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	_, err := e.alloc.AllocateNext(ctx, ipam.Owner{Name: "ns/p"})
	if !errors.Is(err, ipam.ErrNoPodCIDR) ||
		!strings.Contains(err.Error(), "no pod CIDR for node node1 yet: is cellium-operator running with --cluster-pool-ipv4-cidr?") {
		t.Fatalf("AllocateNext = %v, want the no-pod-CIDR error", err)
	}
	if s := podCIDRsHealth(e); s.Level != hive.LevelDegraded || !strings.Contains(s.Error, "cluster-pool-ipv4-cidr") {
		t.Errorf("ipam health = %+v, want degraded with the reason", s)
	}
}

func TestCellAllocatesOverTheAPI(t *testing.T) {
	stateDir := t.TempDir()
	e := startIPAM(t, stateDir)
	e.setCiliumNode(t, "node1", "10.0.5.0/24", "fd00::/120")
	// The cell allocates the health endpoint's address first: 10.0.5.2.
	waitHealthIP(t, e, "10.0.5.2")

	var resp models.IPAMResponse
	if code := e.do(t, "POST", "/v1/ipam?owner=ns/first", &resp); code != http.StatusCreated {
		t.Fatalf("POST /v1/ipam = %d", code)
	}
	want := models.IPAMAddress{IP: "10.0.5.3", Gateway: "10.0.5.1", CIDRs: []string{"10.0.5.0/24"}, Owner: "ns/first"}
	if resp.IPv4 != nil {
		want.Since = resp.IPv4.Since // when it was allocated
	}
	if resp.IPv4 == nil || fmt.Sprint(*resp.IPv4) != fmt.Sprint(want) || want.Since == "" {
		t.Fatalf("POST /v1/ipam = %+v, want %+v", resp.IPv4, want)
	}
	if resp.MTU != 0 {
		t.Errorf("POST /v1/ipam without a PodMTU provider: mtu %d, want none", resp.MTU)
	}
	first := resp.IPv4.IP

	// 50 concurrent requests get 50 distinct addresses of the CIDR.
	var (
		wg  sync.WaitGroup
		mu  sync.Mutex
		ips = map[string]bool{first: true}
	)
	for i := range 50 {
		wg.Go(func() {
			var r models.IPAMResponse
			if code := e.do(t, "POST", fmt.Sprintf("/v1/ipam?owner=ns/p%d", i), &r); code != http.StatusCreated {
				t.Errorf("POST #%d = %d", i, code)
				return
			}
			ip := netip.MustParseAddr(r.IPv4.IP)
			if !netip.MustParsePrefix("10.0.5.0/24").Contains(ip) || r.IPv4.Gateway != "10.0.5.1" {
				t.Errorf("POST #%d = %+v", i, r.IPv4)
			}
			mu.Lock()
			defer mu.Unlock()
			if ips[r.IPv4.IP] {
				t.Errorf("%s handed out twice", r.IPv4.IP)
			}
			ips[r.IPv4.IP] = true
		})
	}
	wg.Wait()
	if len(ips) != 51 {
		t.Fatalf("%d distinct addresses, want 51", len(ips))
	}

	// Release is idempotent.
	released := "10.0.5.4"
	for i := range 2 {
		if code := e.do(t, "DELETE", "/v1/ipam/"+released, nil); code != http.StatusOK {
			t.Errorf("DELETE #%d = %d", i+1, code)
		}
	}
	var list []models.IPAMAddress
	if code := e.do(t, "GET", "/v1/ipam", &list); code != http.StatusOK || len(list) != 52 {
		t.Fatalf("GET /v1/ipam = %d, %d allocations, want 52 (50 pods, the router and the health endpoint)", code, len(list))
	}
	if s := podCIDRsHealth(e); s.Level != hive.LevelOK {
		t.Errorf("ipam health = %+v", s)
	}

	// A restarted agent keeps the allocations.
	if err := e.h.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	e2 := startIPAM(t, stateDir)
	e2.setCiliumNode(t, "node1", "10.0.5.0/24")
	waitHealthIP(t, e2, "10.0.5.2") // kept across the restart
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := e2.alloc.AllocateIP(ctx, netip.MustParseAddr(first), ipam.Owner{Name: "ns/first"}); err != nil {
		t.Errorf("re-claim %s after restart: %v", first, err)
	}
	if _, err := e2.alloc.AllocateIP(ctx, netip.MustParseAddr(first), ipam.Owner{Name: "ns/thief"}); !errors.Is(err, pool.ErrInUse) {
		t.Errorf("claim of a restored address by another owner = %v, want ErrInUse", err)
	}
	var list2 []models.IPAMAddress
	e2.do(t, "GET", "/v1/ipam", &list2)
	for i := range list { // restored addresses count their age from the restart
		list[i].Since = ""
	}
	for i := range list2 {
		list2[i].Since = ""
	}
	if fmt.Sprint(list2) != fmt.Sprint(list) {
		t.Errorf("allocations after restart differ:\n got %v\nwant %v", list2, list)
	}
	var r models.IPAMResponse
	if code := e2.do(t, "POST", "/v1/ipam?owner=ns/after", &r); code != http.StatusCreated || ips[r.IPv4.IP] && r.IPv4.IP != released {
		t.Errorf("POST after restart = %d %+v: a held address", code, r.IPv4)
	}
}

// Without the CiliumNode (the API server is down after a reboot), a
// restarted agent allocates from the pod CIDRs of its state file, never
// handing out a restored address; the CiliumNode's CIDRs take over later.
func TestCellServesFromSavedCIDRsWithoutCiliumNode(t *testing.T) {
	stateDir := t.TempDir()
	e := startIPAM(t, stateDir)
	e.setCiliumNode(t, "node1", "10.0.7.0/24")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	held := map[netip.Addr]bool{}
	for i := range 3 {
		al, err := e.alloc.AllocateNext(ctx, ipam.Owner{Name: fmt.Sprintf("ns/p%d", i), ContainerID: fmt.Sprintf("c%d", i)})
		if err != nil {
			t.Fatal(err)
		}
		held[al.IP] = true
	}
	if err := e.h.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}

	e2 := startIPAM(t, stateDir) // no CiliumNode in its table
	short, cancel2 := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel2()
	al, err := e2.alloc.AllocateNext(short, ipam.Owner{Name: "ns/new", ContainerID: "c-new"})
	if err != nil {
		t.Fatalf("allocate without the CiliumNode: %v", err)
	}
	if held[al.IP] || !netip.MustParsePrefix("10.0.7.0/24").Contains(al.IP) {
		t.Fatalf("allocated %v: a restored address or outside the saved CIDR", al.IP)
	}
	if s := podCIDRsHealth(e2); s.Level != hive.LevelOK || !strings.Contains(s.Message, "state file") {
		t.Errorf("ipam health = %+v", s)
	}
	e2.setCiliumNode(t, "node1", "10.0.7.0/24")
	waitHealthMessage(t, e2, "allocating from [10.0.7.0/24]")
}

// waitHealthIP waits until the health endpoint's address is ip in the
// allocations table.
func waitHealthIP(t *testing.T, e *env, ip string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for {
		iter, watch := e.allocs.ListWatch(e.db.ReadTxn(), ipamtables.OwnerIndex.Query(ipam.HealthOwner))
		var got []string
		for a := range iter {
			got = append(got, a.IP.String())
		}
		if len(got) == 1 && got[0] == ip {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("health endpoint holds %v, want %s", got, ip)
		case <-watch:
		}
	}
}

func waitHealthMessage(t *testing.T, e *env, want string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		s := podCIDRsHealth(e)
		if s.Message == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("ipam health %+v, want message %q", s, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestCellAPIReturnsPodMTU: POST /v1/ipam answers with the pod MTU of
// cni-config's --mtu, so the CNI plugin needs no GET /v1/config.
func TestCellAPIReturnsPodMTU(t *testing.T) {
	e := startIPAM(t, t.TempDir(),
		hive.Provide(func() ipam.PodMTU { return cniconfig.Config{MTU: 1387} }))
	e.setCiliumNode(t, "node1", "10.0.5.0/24")
	for _, path := range []string{"/v1/ipam?owner=ns/a&container-id=c1", "/v1/ipam/10.0.5.9?owner=ns/b"} {
		var resp models.IPAMResponse
		if code := e.do(t, "POST", path, &resp); code != http.StatusCreated {
			t.Fatalf("POST %s = %d", path, code)
		}
		if resp.MTU != 1387 || resp.IPv4 == nil {
			t.Errorf("POST %s = %+v, want mtu 1387 with the address", path, resp)
		}
	}
}
