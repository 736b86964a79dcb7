package lbsync

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/cilium/statedb"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	k8stables "github.com/cellium/cellium/statedb/k8s"
	"github.com/cellium/cellium/statedb/lb"
	"github.com/cellium/cellium/statedb/nodes"
)

type testTables struct {
	Tables
	svcs   statedb.RWTable[*corev1.Service]
	slices statedb.RWTable[*discoveryv1.EndpointSlice]
}

func newTables(t *testing.T) testTables {
	t.Helper()
	db := statedb.New()
	svcs, err := k8stables.NewServicesTable(db)
	if err != nil {
		t.Fatal(err)
	}
	sls, err := k8stables.NewEndpointSlicesTable(db)
	if err != nil {
		t.Fatal(err)
	}
	fe, err := lb.NewFrontendsTable(db)
	if err != nil {
		t.Fatal(err)
	}
	be, err := lb.NewBackendsTable(db)
	if err != nil {
		t.Fatal(err)
	}
	return testTables{Tables: Tables{DB: db, Services: svcs, Slices: sls, Frontends: fe, Backends: be}, svcs: svcs, slices: sls}
}

// service i has ClusterIP 10.96.0.i and the given ports ("name/proto/port").
func service(i int, ports ...string) *corev1.Service {
	s := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: fmt.Sprintf("svc%d", i)},
		Spec: corev1.ServiceSpec{ClusterIP: fmt.Sprintf("10.96.0.%d", i), ClusterIPs: []string{fmt.Sprintf("10.96.0.%d", i)}}}
	for _, p := range ports {
		var name, proto string
		var port int32
		if _, err := fmt.Sscanf(p, "%s %s %d", &name, &proto, &port); err != nil {
			panic(err)
		}
		if name == "-" {
			name = ""
		}
		s.Spec.Ports = append(s.Spec.Ports, corev1.ServicePort{Name: name, Protocol: corev1.Protocol(proto), Port: port})
	}
	return s
}

func ptr[T any](v T) *T { return &v }

// slice of service svc (-1: no label) with endpoints at 10.0.0.<e> and
// ports ("name proto port").
func slice(name string, svc int, ready map[int]bool, ports ...string) *discoveryv1.EndpointSlice {
	s := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, Labels: map[string]string{}},
		AddressType: discoveryv1.AddressTypeIPv4}
	if svc >= 0 {
		s.Labels[discoveryv1.LabelServiceName] = fmt.Sprintf("svc%d", svc)
	}
	for _, e := range slices.Sorted(maps.Keys(ready)) {
		s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{Addresses: []string{fmt.Sprintf("10.0.0.%d", e)},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr(ready[e])}})
	}
	for _, p := range ports {
		var n, proto string
		var port int32
		if _, err := fmt.Sscanf(p, "%s %s %d", &n, &proto, &port); err != nil {
			panic(err)
		}
		if n == "-" {
			n = ""
		}
		s.Ports = append(s.Ports, discoveryv1.EndpointPort{Name: ptr(n), Protocol: ptr(corev1.Protocol(proto)), Port: ptr(port)})
	}
	return s
}

func TestServiceFrontends(t *testing.T) {
	svc := service(7, "http TCP 80", "dns UDP 53", "sctp SCTP 9")
	sls := []*discoveryv1.EndpointSlice{
		slice("a", 7, map[int]bool{1: true, 2: false}, "http TCP 8080", "dns UDP 5353"),
		slice("b", 7, map[int]bool{3: true, 1: true}, "http TCP 8080"),
	}
	got := lb.ServiceFrontends(svc, sls)
	var lines []string
	for _, f := range got {
		lines = append(lines, fmt.Sprint(f.Address, " ", f.Service, ":", f.PortName, " ", f.Backends))
	}
	want := []string{
		"10.96.0.7:53/UDP ns/svc7:dns [10.0.0.1:5353/UDP]",
		"10.96.0.7:80/TCP ns/svc7:http [10.0.0.1:8080/TCP 10.0.0.3:8080/TCP]",
	}
	if !slices.Equal(lines, want) {
		t.Errorf("frontends:\n%v\nwant:\n%v", lines, want)
	}
	// Headless, ExternalName: none.
	h := service(8, "- TCP 80")
	h.Spec.ClusterIP, h.Spec.ClusterIPs = corev1.ClusterIPNone, []string{corev1.ClusterIPNone}
	if f := lb.ServiceFrontends(h, nil); len(f) != 0 {
		t.Errorf("headless: %v", f)
	}
	e := service(9, "- TCP 80")
	e.Spec.Type = corev1.ServiceTypeExternalName
	if f := lb.ServiceFrontends(e, nil); len(f) != 0 {
		t.Errorf("ExternalName: %v", f)
	}
}

// content is a frontends table as text, without IDs and status.
func content(t *testing.T, tt Tables, txn statedb.ReadTxn) []string {
	t.Helper()
	var out []string
	for f := range tt.Frontends.All(txn) {
		out = append(out, fmt.Sprint(f.Address, " ", f.Service, ":", f.PortName, " ", f.Backends))
	}
	return out
}

// checkIDs checks that every frontend's backend IDs name backend rows of
// the same addresses, that every backend row is used, and IDs are unique.
func checkIDs(t *testing.T, tt Tables, txn statedb.ReadTxn) {
	t.Helper()
	used := map[lb.L4Addr]bool{}
	for f := range tt.Frontends.All(txn) {
		if len(f.BackendIDs) != len(f.Backends) {
			t.Fatalf("frontend %v: %d backends, %d IDs", f.Address, len(f.Backends), len(f.BackendIDs))
		}
		for i, id := range f.BackendIDs {
			b, _, ok := tt.Backends.Get(txn, lb.BackendIDIndex.Query(id))
			if !ok || b.Address != f.Backends[i] {
				t.Fatalf("frontend %v: backend %v has ID %d, row %+v", f.Address, f.Backends[i], id, b)
			}
			used[b.Address] = true
		}
	}
	ids := map[uint32]bool{}
	for b := range tt.Backends.All(txn) {
		if !used[b.Address] {
			t.Fatalf("backend %v (ID %d) is used by no frontend", b.Address, b.ID)
		}
		if ids[b.ID] || b.ID == 0 {
			t.Fatalf("backend ID %d twice or zero", b.ID)
		}
		ids[b.ID] = true
	}
}

// checkIdle checks the deriver's idle set: the backends holding an ID
// without a reference, which check counts as freeable instead of walking
// every backend (100,000 at 10,000 Services) at each new backend.
func checkIdle(t *testing.T, d *Deriver) {
	t.Helper()
	want := map[lb.L4Addr]struct{}{}
	for b := range d.ids {
		if d.refs[b] <= 0 {
			want[b] = struct{}{}
		}
	}
	if !maps.Equal(d.idle, want) {
		t.Fatalf("idle backends %v, want %v", d.idle, want)
	}
}

// Under random churn of Services and EndpointSlices (slices moving between
// Services too), the incrementally derived tables equal what a new
// deriver derives from the final tables at once, and the backend IDs
// stay consistent.
func TestDeriverIncrementalEqualsScratch(t *testing.T) {
	portsets := [][]string{{"http TCP 80"}, {"http TCP 80", "dns UDP 53"}, {"dns UDP 53"}, {"- TCP 443"}}
	slicePorts := [][]string{{"http TCP 8080"}, {"http TCP 8080", "dns UDP 5353"}, {"dns UDP 5353"}, {"- TCP 8443"}, {"http UDP 8080"}}
	for seed := range uint64(20) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 7))
			tt := newTables(t)
			d := NewDeriver(tt.Tables, nil)
			if err := d.Subscribe(); err != nil {
				t.Fatal(err)
			}
			defer d.close()
			for round := range 60 {
				wtxn := tt.DB.WriteTxn(tt.svcs, tt.slices)
				for range 1 + rng.IntN(5) {
					i := 1 + rng.IntN(5)
					switch rng.IntN(4) {
					case 0:
						_, _, _ = tt.svcs.Insert(wtxn, service(i, portsets[rng.IntN(len(portsets))]...))
					case 1:
						_, _, _ = tt.svcs.Delete(wtxn, service(i))
					case 2:
						ready := map[int]bool{}
						for range rng.IntN(4) {
							ready[1+rng.IntN(8)] = rng.IntN(4) > 0
						}
						_, _, _ = tt.slices.Insert(wtxn, slice(fmt.Sprintf("s%d", rng.IntN(8)), rng.IntN(7)-1, ready, slicePorts[rng.IntN(len(slicePorts))]...))
					case 3:
						_, _, _ = tt.slices.Delete(wtxn, slice(fmt.Sprintf("s%d", rng.IntN(8)), 0, nil))
					}
				}
				wtxn.Commit()
				if _, _, _, err := d.Step(); err != nil {
					t.Fatal(err)
				}
				txn := tt.DB.ReadTxn()
				checkIDs(t, tt.Tables, txn)
				checkIdle(t, d)
				// From scratch: lb.ServiceFrontends of every Service.
				var want []string
				for svc := range tt.Services.All(txn) {
					var sls []*discoveryv1.EndpointSlice
					for s := range tt.Slices.List(txn, k8stables.EndpointSliceServiceIndex.Query(k8stables.Key(svc))) {
						sls = append(sls, s)
					}
					for _, f := range lb.ServiceFrontends(svc, sls) {
						want = append(want, fmt.Sprint(f.Address, " ", f.Service, ":", f.PortName, " ", f.Backends))
					}
				}
				slices.Sort(want)
				got := content(t, tt.Tables, txn)
				slices.Sort(got)
				if !slices.Equal(got, want) {
					t.Fatalf("round %d: frontends\n%v\nwant\n%v", round, got, want)
				}
			}
			// A new deriver over the final tables derives the same.
			fresh := newTables(t)
			wtxn := fresh.DB.WriteTxn(fresh.svcs, fresh.slices)
			rtxn := tt.DB.ReadTxn()
			for s := range tt.Services.All(rtxn) {
				_, _, _ = fresh.svcs.Insert(wtxn, s)
			}
			for s := range tt.Slices.All(rtxn) {
				_, _, _ = fresh.slices.Insert(wtxn, s)
			}
			wtxn.Commit()
			d2 := NewDeriver(fresh.Tables, nil)
			if err := d2.Subscribe(); err != nil {
				t.Fatal(err)
			}
			defer d2.close()
			if _, _, _, err := d2.Step(); err != nil {
				t.Fatal(err)
			}
			if a, b := content(t, tt.Tables, rtxn), content(t, fresh.Tables, fresh.DB.ReadTxn()); !slices.Equal(a, b) {
				t.Fatalf("incremental\n%v\nfrom scratch\n%v", a, b)
			}
		})
	}
}

// A restarted deriver gives backends the IDs the backends map holds.
func TestDeriverRestoresIDs(t *testing.T) {
	tt := newTables(t)
	be := lb.L4Addr{Addr: netip.MustParseAddr("10.0.0.3"), Port: 8080, Proto: lb.TCP}
	d := NewDeriver(tt.Tables, func() (map[lb.L4Addr]uint32, error) { return map[lb.L4Addr]uint32{be: 42}, nil })
	if err := d.Subscribe(); err != nil {
		t.Fatal(err)
	}
	defer d.close()
	wtxn := tt.DB.WriteTxn(tt.svcs, tt.slices)
	_, _, _ = tt.svcs.Insert(wtxn, service(1, "http TCP 80"))
	_, _, _ = tt.slices.Insert(wtxn, slice("a", 1, map[int]bool{1: true, 3: true}, "http TCP 8080"))
	wtxn.Commit()
	if _, _, _, err := d.Step(); err != nil {
		t.Fatal(err)
	}
	b, _, ok := tt.Backends.Get(tt.DB.ReadTxn(), lb.BackendAddressIndex.Query(be))
	if !ok || b.ID != 42 {
		t.Fatalf("backend %v: %+v, want ID 42", be, b)
	}
	other, _, _ := tt.Backends.Get(tt.DB.ReadTxn(), lb.BackendAddressIndex.Query(lb.L4Addr{Addr: netip.MustParseAddr("10.0.0.1"), Port: 8080, Proto: lb.TCP}))
	if other == nil || other.ID == 42 {
		t.Fatalf("other backend: %+v", other)
	}
}

func mustAddr(s string) netip.Addr { return netip.MustParseAddr(s) }

// A step that fails (here: out of backend IDs) writes nothing and leaves
// the bookkeeping as the tables are; the Service is derived again later
// and succeeds once it fits.
func TestDeriverRefusesServiceBeyondBackendIDs(t *testing.T) {
	tt := newTables(t)
	// --bpf-lb-map-max=3: backend IDs 1 and 2.
	tt.Tables.MaxBackendID = 2
	states, err := lb.NewServiceStatesTable(tt.DB)
	if err != nil {
		t.Fatal(err)
	}
	tt.States = states
	d := NewDeriver(tt.Tables, nil)
	if err := d.Subscribe(); err != nil {
		t.Fatal(err)
	}
	defer d.close()
	wtxn := tt.DB.WriteTxn(tt.svcs, tt.slices)
	_, _, _ = tt.svcs.Insert(wtxn, service(1, "http TCP 80"))
	_, _, _ = tt.slices.Insert(wtxn, slice("a", 1, map[int]bool{1: true}, "http TCP 8080"))
	wtxn.Commit()
	if _, _, _, err := d.Step(); err != nil {
		t.Fatal(err)
	}
	// Service 2 needs two more backends: one ID is left. It is refused
	// whole (no frontend of it), with a state; service 1 stays; a third
	// Service that fits is served in the same step.
	wtxn = tt.DB.WriteTxn(tt.svcs, tt.slices)
	_, _, _ = tt.svcs.Insert(wtxn, service(2, "http TCP 80"))
	_, _, _ = tt.slices.Insert(wtxn, slice("b", 2, map[int]bool{2: true, 3: true}, "http TCP 8080"))
	_, _, _ = tt.svcs.Insert(wtxn, service(3, "http TCP 80"))
	_, _, _ = tt.slices.Insert(wtxn, slice("c", 3, map[int]bool{1: true}, "http TCP 8080"))
	wtxn.Commit()
	if _, _, _, err := d.Step(); err != nil {
		t.Fatalf("step: %v (a Service that does not fit must not fail the others)", err)
	}
	txn := tt.DB.ReadTxn()
	if got, want := content(t, tt.Tables, txn), []string{
		"10.96.0.1:80/TCP ns/svc1:http [10.0.0.1:8080/TCP]",
		"10.96.0.3:80/TCP ns/svc3:http [10.0.0.1:8080/TCP]",
	}; !slices.Equal(got, want) {
		t.Fatalf("frontends: %v, want %v", got, want)
	}
	checkIDs(t, tt.Tables, txn)
	st, _, ok := states.Get(txn, lb.ServiceStateOwnerIndex.Query("ns/svc2"))
	if !ok || st.State != lb.StateRefused || st.Reason != lb.ReasonLBMapFull || !strings.Contains(st.Message, "--bpf-lb-map-max=3") {
		t.Fatalf("state of ns/svc2: %+v, want Refused/LBMapFull naming --bpf-lb-map-max=3", st)
	}
	// Service 1 and 3 go, freeing the ID: service 2 (which did not
	// change itself) is served and its state goes.
	wtxn = tt.DB.WriteTxn(tt.svcs)
	_, _, _ = tt.svcs.Delete(wtxn, service(1))
	_, _, _ = tt.svcs.Delete(wtxn, service(3))
	wtxn.Commit()
	if _, _, _, err := d.Step(); err != nil {
		t.Fatal(err)
	}
	txn = tt.DB.ReadTxn()
	if got, want := content(t, tt.Tables, txn), []string{
		"10.96.0.2:80/TCP ns/svc2:http [10.0.0.2:8080/TCP 10.0.0.3:8080/TCP]",
	}; !slices.Equal(got, want) {
		t.Fatalf("frontends: %v, want %v", got, want)
	}
	checkIDs(t, tt.Tables, txn)
	if st, _, ok := states.Get(txn, lb.ServiceStateOwnerIndex.Query("ns/svc2")); ok {
		t.Fatalf("state of ns/svc2 after it fits: %+v", st)
	}
}

// With kube-proxy replacement the tables are initialized (and the maps
// pruned) only once the node's row exists, so that a restarted agent's
// first pruning keeps its NodePorts; the NodePort frontends follow the
// row's addresses.
func TestDeriverKPRWaitsForLocalNode(t *testing.T) {
	tt := newTables(t)
	local, err := nodes.NewLocalNodeTable(tt.DB)
	if err != nil {
		t.Fatal(err)
	}
	tt.KubeProxyReplacement, tt.NodeName, tt.LocalNode = true, "node1", local
	wtxn := tt.DB.WriteTxn(tt.svcs, tt.slices)
	svcDone := tt.svcs.RegisterInitializer(wtxn, "test")
	slDone := tt.slices.RegisterInitializer(wtxn, "test")
	wtxn.Commit()
	d := NewDeriver(tt.Tables, nil)
	if err := d.Subscribe(); err != nil {
		t.Fatal(err)
	}
	defer d.close()
	svc := service(1, "http TCP 80")
	svc.Spec.Type = corev1.ServiceTypeNodePort
	svc.Spec.Ports[0].NodePort = 30080
	wtxn = tt.DB.WriteTxn(tt.svcs, tt.slices)
	_, _, _ = tt.svcs.Insert(wtxn, svc)
	_, _, _ = tt.slices.Insert(wtxn, slice("a", 1, map[int]bool{1: true}, "http TCP 8080"))
	svcDone(wtxn)
	slDone(wtxn)
	wtxn.Commit()
	_, _, initW, err := d.Step()
	if err != nil {
		t.Fatal(err)
	}
	addrs := func() []string {
		var out []string
		for f := range tt.Frontends.All(tt.DB.ReadTxn()) {
			out = append(out, f.Address.String()+" "+f.TypeName())
		}
		return out
	}
	if ok, _ := tt.Frontends.Initialized(tt.DB.ReadTxn()); ok {
		t.Fatal("frontends table initialized before the node's row exists")
	}
	if got, want := addrs(), []string{"0.0.0.0:30080/TCP NodePort", "10.96.0.1:80/TCP ClusterIP"}; !slices.Equal(got, want) {
		t.Errorf("frontends %q, want %q", got, want)
	}
	wtxn = tt.DB.WriteTxn(local)
	_, _, _ = local.Insert(wtxn, &nodes.LocalNode{Name: "node1",
		NodeAddresses: []nodes.Address{{Type: nodes.AddressInternalIP, IP: mustAddr("192.168.56.11")}, {Type: nodes.AddressInternalIP, IP: mustAddr("fd00::11")}}})
	wtxn.Commit()
	select {
	case <-initW:
	default:
		t.Fatal("the step's init channel did not close when the node's row came")
	}
	if _, _, _, err := d.Step(); err != nil {
		t.Fatal(err)
	}
	if ok, _ := tt.Frontends.Initialized(tt.DB.ReadTxn()); !ok {
		t.Fatal("frontends table not initialized with the node's row there")
	}
	if got, want := addrs(), []string{"0.0.0.0:30080/TCP NodePort", "10.96.0.1:80/TCP ClusterIP", "192.168.56.11:30080/TCP NodePort"}; !slices.Equal(got, want) {
		t.Errorf("frontends %q, want %q", got, want)
	}
}

// A step's bookkeeping changes are put back whole by rollback (a failed
// step), without copying the bookkeeping first: after random Services are
// derived again (backends taken and dropped, IDs handed out and freed,
// Services refused), rollback leaves every map as it was.
func TestDeriverRollback(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	tt := newTables(t)
	tt.Tables.MaxBackendID = 12
	d := NewDeriver(tt.Tables, nil)
	if err := d.Subscribe(); err != nil {
		t.Fatal(err)
	}
	defer d.close()
	churn := func() {
		wtxn := tt.DB.WriteTxn(tt.svcs, tt.slices)
		for range 4 {
			i := 1 + rng.IntN(5)
			ready := map[int]bool{}
			for range rng.IntN(6) {
				ready[1+rng.IntN(10)] = true
			}
			_, _, _ = tt.svcs.Insert(wtxn, service(i, "http TCP 80"))
			_, _, _ = tt.slices.Insert(wtxn, slice(fmt.Sprintf("s%d", i), i, ready, "http TCP 8080"))
		}
		wtxn.Commit()
	}
	for range 20 {
		churn()
		if _, _, _, err := d.Step(); err != nil {
			t.Fatal(err)
		}
		before := fmt.Sprint(d.refs, d.ids, d.used, d.idle, d.next, d.entries, d.total, d.refused)
		churn()
		d.begin()
		rtxn := tt.DB.ReadTxn()
		wtxn := tt.DB.WriteTxn(tt.Frontends, tt.Backends)
		for i := 1; i <= 5; i++ {
			rel, err := d.syncService(rtxn, wtxn, fmt.Sprintf("ns/svc%d", i))
			if err != nil {
				t.Fatal(err)
			}
			for _, b := range rel {
				if d.refs[b] <= 0 {
					if err := d.release(wtxn, b); err != nil {
						t.Fatal(err)
					}
				}
			}
		}
		wtxn.Abort()
		d.rollback()
		if after := fmt.Sprint(d.refs, d.ids, d.used, d.idle, d.next, d.entries, d.total, d.refused); after != before {
			t.Fatalf("after rollback:\n%s\nwant\n%s", after, before)
		}
	}
}
