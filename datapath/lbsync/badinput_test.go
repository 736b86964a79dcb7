package lbsync

import (
	"fmt"
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

// badTables are newTables with the states table, and with kube-proxy
// replacement, hostPorts and this node's row (192.168.56.11).
type badTables struct {
	testTables
	states statedb.RWTable[*lb.ServiceState]
	pods   statedb.RWTable[*corev1.Pod]
}

func newBadTables(t *testing.T, kpr bool) (badTables, *Deriver) {
	t.Helper()
	tt := badTables{testTables: newTables(t)}
	var err error
	if tt.states, err = lb.NewServiceStatesTable(tt.DB); err != nil {
		t.Fatal(err)
	}
	tt.States = tt.states
	if kpr {
		if tt.pods, err = k8stables.NewPodsTable(tt.DB); err != nil {
			t.Fatal(err)
		}
		local, err := nodes.NewLocalNodeTable(tt.DB)
		if err != nil {
			t.Fatal(err)
		}
		wtxn := tt.DB.WriteTxn(local)
		_, _, _ = local.Insert(wtxn, &nodes.LocalNode{Name: "node1",
			NodeAddresses: []nodes.Address{{Type: nodes.AddressInternalIP, IP: mustAddr("192.168.56.11")}}})
		wtxn.Commit()
		tt.KubeProxyReplacement, tt.NodeName, tt.LocalNode, tt.Pods = true, "node1", local, tt.pods
	}
	return tt, nil
}

func (tt badTables) deriver(t *testing.T) *Deriver {
	t.Helper()
	d := NewDeriver(tt.Tables, nil)
	if err := d.Subscribe(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.close)
	return d
}

func (tt badTables) state(owner string) *lb.ServiceState {
	s, _, _ := tt.states.Get(tt.DB.ReadTxn(), lb.ServiceStateOwnerIndex.Query(owner))
	return s
}

// frontendsOf lists the frontend addresses of owner.
func (tt badTables) frontendsOf(owner string) []string {
	var out []string
	for f := range tt.Frontends.List(tt.DB.ReadTxn(), lb.FrontendServiceIndex.Query(owner)) {
		out = append(out, f.Address.String())
	}
	return out
}

func step(t *testing.T, d *Deriver) {
	t.Helper()
	if _, _, _, err := d.Step(); err != nil {
		t.Fatalf("step: %v", err)
	}
}

// A Service whose frontends and backend slots do not fit in the services
// map beside the others' (here a Service with 40 ports against
// --bpf-lb-map-max=20) is refused whole, with a state naming the flag;
// the others keep theirs; once it shrinks it is served.
func TestDeriverRefusesServiceBeyondServicesMap(t *testing.T) {
	tt, _ := newBadTables(t, false)
	tt.MaxServiceEntries = 20
	d := tt.deriver(t)
	var ports, eps []string
	for i := range 40 {
		ports = append(ports, fmt.Sprintf("p%d TCP %d", i, 1000+i))
		eps = append(eps, fmt.Sprintf("p%d TCP %d", i, 2000+i))
	}
	wtxn := tt.DB.WriteTxn(tt.svcs, tt.slices)
	_, _, _ = tt.svcs.Insert(wtxn, service(1, "http TCP 80"))
	_, _, _ = tt.slices.Insert(wtxn, slice("a", 1, map[int]bool{1: true}, "http TCP 8080"))
	_, _, _ = tt.svcs.Insert(wtxn, service(2, ports...))
	_, _, _ = tt.slices.Insert(wtxn, slice("b", 2, map[int]bool{2: true}, eps...))
	wtxn.Commit()
	step(t, d)
	if got := tt.frontendsOf("ns/svc2"); len(got) != 0 {
		t.Fatalf("refused Service has frontends %v", got)
	}
	if got := tt.frontendsOf("ns/svc1"); len(got) != 1 {
		t.Fatalf("ns/svc1 frontends %v, want its one", got)
	}
	st := tt.state("ns/svc2")
	if st == nil || st.State != lb.StateRefused || st.Reason != lb.ReasonLBMapFull ||
		!strings.Contains(st.Message, "--bpf-lb-map-max=20") || !strings.Contains(st.Message, "80 entries") {
		t.Fatalf("state %+v, want Refused/LBMapFull with 80 entries and --bpf-lb-map-max=20", st)
	}
	checkIDs(t, tt.Tables, tt.DB.ReadTxn())
	// 9 ports (18 entries, 1 more while a frontend is updated) beside
	// ns/svc1's 2 do not fit; 8 do.
	wtxn = tt.DB.WriteTxn(tt.svcs, tt.slices)
	_, _, _ = tt.svcs.Insert(wtxn, service(2, ports[:9]...))
	wtxn.Commit()
	step(t, d)
	if got := tt.frontendsOf("ns/svc2"); len(got) != 0 {
		t.Fatalf("ns/svc2 frontends %v, want none (no room to update one)", got)
	}
	wtxn = tt.DB.WriteTxn(tt.svcs, tt.slices)
	_, _, _ = tt.svcs.Insert(wtxn, service(2, ports[:8]...))
	wtxn.Commit()
	step(t, d)
	if got := tt.frontendsOf("ns/svc2"); len(got) != 8 {
		t.Fatalf("ns/svc2 frontends %v, want 8", got)
	}
	if st := tt.state("ns/svc2"); st != nil {
		t.Fatalf("state after it fits: %+v", st)
	}
	checkIDs(t, tt.Tables, tt.DB.ReadTxn())
}

// hostPortPod is pod name on node1 with IP 10.0.1.<i> and a hostPort.
func hostPortPod(name string, i int, hostPort int32) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name},
		Spec: corev1.PodSpec{NodeName: "node1", Containers: []corev1.Container{{Name: "c",
			Ports: []corev1.ContainerPort{{ContainerPort: 8080, HostPort: hostPort, Protocol: corev1.ProtocolTCP}}}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: fmt.Sprintf("10.0.1.%d", i)}}
}

// A frontend belongs to its first owner (as Cilium's ErrFrontendConflict):
// a pod's hostPort equal to a Service's NodePort, or a second pod's
// hostPort on the same port and protocol, is refused whole with a state
// naming the owner; the owner keeps its frontends; when the owner goes,
// the refused one gets them.
func TestDeriverFrontendConflicts(t *testing.T) {
	tt, _ := newBadTables(t, true)
	d := tt.deriver(t)
	svc := service(1, "http TCP 80")
	svc.Spec.Type = corev1.ServiceTypeNodePort
	svc.Spec.Ports[0].NodePort = 30080
	wtxn := tt.DB.WriteTxn(tt.svcs, tt.slices)
	_, _, _ = tt.svcs.Insert(wtxn, svc)
	_, _, _ = tt.slices.Insert(wtxn, slice("a", 1, map[int]bool{1: true}, "http TCP 8080"))
	wtxn.Commit()
	step(t, d)
	svcFEs := tt.frontendsOf("ns/svc1")
	if len(svcFEs) != 3 {
		t.Fatalf("ns/svc1 frontends %v", svcFEs)
	}
	// The pods come later: a hostPort on the NodePort, and two pods on
	// hostPort 8000.
	wtxn = tt.DB.WriteTxn(tt.pods)
	_, _, _ = tt.pods.Insert(wtxn, hostPortPod("np", 1, 30080))
	_, _, _ = tt.pods.Insert(wtxn, hostPortPod("a", 2, 8000))
	wtxn.Commit()
	step(t, d)
	wtxn = tt.DB.WriteTxn(tt.pods)
	_, _, _ = tt.pods.Insert(wtxn, hostPortPod("b", 3, 8000))
	wtxn.Commit()
	step(t, d)
	if got := tt.frontendsOf("ns/svc1"); !slices.Equal(got, svcFEs) {
		t.Fatalf("ns/svc1 frontends %v after the hostPort, want %v (the first owner keeps them)", got, svcFEs)
	}
	for _, c := range []struct{ owner, by string }{
		{"ns/np/host-port", "owned by Service ns/svc1"},
		{"ns/b/host-port", "owned by the hostPort of pod ns/a"},
	} {
		if got := tt.frontendsOf(c.owner); len(got) != 0 {
			t.Errorf("%s has frontends %v", c.owner, got)
		}
		st := tt.state(c.owner)
		if st == nil || st.State != lb.StateRefused || st.Reason != lb.ReasonFrontendConflict || !strings.Contains(st.Message, c.by) {
			t.Errorf("state of %s: %+v, want Refused/FrontendConflict %q", c.owner, st, c.by)
		}
	}
	if got := tt.frontendsOf("ns/a/host-port"); len(got) != 2 {
		t.Errorf("ns/a hostPort frontends %v", got)
	}
	// The owners go: the refused get their frontends, the states go.
	wtxn = tt.DB.WriteTxn(tt.svcs, tt.pods)
	_, _, _ = tt.svcs.Delete(wtxn, svc)
	_, _, _ = tt.pods.Delete(wtxn, hostPortPod("a", 2, 8000))
	wtxn.Commit()
	step(t, d)
	for _, owner := range []string{"ns/np/host-port", "ns/b/host-port"} {
		if got := tt.frontendsOf(owner); len(got) != 2 {
			t.Errorf("%s frontends %v after the owner went", owner, got)
		}
		if st := tt.state(owner); st != nil {
			t.Errorf("state of %s after the owner went: %+v", owner, st)
		}
	}
	checkIDs(t, tt.Tables, tt.DB.ReadTxn())
}

// A malformed EndpointSlice: the good endpoints are served, the bad ones
// skipped, and the Service's state says which (Degraded).
func TestDeriverMalformedEndpointSlice(t *testing.T) {
	tt, _ := newBadTables(t, false)
	d := tt.deriver(t)
	sl := slice("a", 1, map[int]bool{1: true, 2: true}, "http TCP 8080", "http TCP 70000")
	sl.Endpoints = append(sl.Endpoints,
		discoveryv1.Endpoint{Addresses: []string{"10.0.0.999"}},
		discoveryv1.Endpoint{Addresses: []string{"fd00::1"}},
		discoveryv1.Endpoint{Addresses: []string{"10.0.0.1"}})
	wtxn := tt.DB.WriteTxn(tt.svcs, tt.slices)
	_, _, _ = tt.svcs.Insert(wtxn, service(1, "http TCP 80", "metrics TCP 9090"))
	_, _, _ = tt.slices.Insert(wtxn, sl)
	wtxn.Commit()
	step(t, d)
	if got, want := content(t, tt.Tables, tt.DB.ReadTxn()), []string{
		"10.96.0.1:80/TCP ns/svc1:http [10.0.0.1:8080/TCP 10.0.0.2:8080/TCP]",
		"10.96.0.1:9090/TCP ns/svc1:metrics []",
	}; !slices.Equal(got, want) {
		t.Fatalf("frontends %v, want %v", got, want)
	}
	st := tt.state("ns/svc1")
	if st == nil || st.State != lb.StateDegraded || st.Reason != lb.ReasonInvalidEndpoints {
		t.Fatalf("state %+v, want Degraded/InvalidEndpoints", st)
	}
	for _, want := range []string{`"10.0.0.999" is not an IP address`, `"fd00::1" is not of the slice's addressType IPv4`,
		"10.0.0.1 is listed twice", "70000 is out of range", `port "metrics"/TCP`} {
		if !strings.Contains(st.Message, want) {
			t.Errorf("state message %q lacks %q", st.Message, want)
		}
	}
	// Fixed: the state goes.
	wtxn = tt.DB.WriteTxn(tt.svcs, tt.slices)
	_, _, _ = tt.svcs.Insert(wtxn, service(1, "http TCP 80"))
	_, _, _ = tt.slices.Insert(wtxn, slice("a", 1, map[int]bool{1: true, 2: true}, "http TCP 8080"))
	wtxn.Commit()
	step(t, d)
	if st := tt.state("ns/svc1"); st != nil {
		t.Fatalf("state after the fix: %+v", st)
	}
}
