package hostportcheck_test

import (
	"context"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cilium/statedb"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/cells/hive/hivetest"
	"github.com/cellium/cellium/datapath/hostportcheck"
	"github.com/cellium/cellium/datapath/hostsockets"
	"github.com/cellium/cellium/statedb/lb"
	"github.com/cellium/cellium/statedb/reconciler"
)

var nodeAddr = netip.MustParseAddr("192.168.56.10")

// fakeLister is the host's sockets as the test sets them.
type fakeLister struct {
	mu    sync.Mutex
	socks []hostsockets.Socket
	procs map[uint32]hostsockets.Process
	calls int
	// steps counts Processes calls (the /proc walks).
	steps int
}

func (f *fakeLister) set(socks ...hostsockets.Socket) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.socks = socks
}

func (f *fakeLister) Listening() ([]hostsockets.Socket, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	return append([]hostsockets.Socket(nil), f.socks...), nil
}

func (f *fakeLister) Processes(inodes []uint32) map[uint32]hostsockets.Process {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.steps++
	out := map[uint32]hostsockets.Process{}
	for _, i := range inodes {
		if p, ok := f.procs[i]; ok {
			out[i] = p
		}
	}
	return out
}

func sock(proto uint8, addr string, port uint16, inode uint32) hostsockets.Socket {
	return hostsockets.Socket{Proto: proto, Addr: netip.MustParseAddr(addr), Port: port, Inode: inode}
}

// nodePortService is Service ns/web of type NodePort with port 80/TCP on
// nodePort np.
func nodePortService(np int32) *corev1.Service {
	return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web"}, Spec: corev1.ServiceSpec{
		Type: corev1.ServiceTypeNodePort, ClusterIP: "10.96.0.10",
		Ports: []corev1.ServicePort{{Port: 80, NodePort: np, Protocol: corev1.ProtocolTCP}},
	}}
}

// hostPortPod is pod ns/p with hostPort 8053/UDP.
func hostPortPod() *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p"},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Ports: []corev1.ContainerPort{
			{ContainerPort: 53, HostPort: 8053, Protocol: corev1.ProtocolUDP}}}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.0.1.5"}}
}

type env struct {
	db     *statedb.DB
	fes    statedb.RWTable[*lb.Frontend]
	states statedb.RWTable[*lb.ServiceState]
	lister *fakeLister
}

// start runs a Checker over its own frontends and states tables, as the
// socket load balancer's module does, listing sockets every 50ms.
func start(t *testing.T) *env { return startEvery(t, 50*time.Millisecond) }

func startEvery(t *testing.T, interval time.Duration) *env {
	e := &env{lister: &fakeLister{procs: map[uint32]hostsockets.Process{42: {PID: 1234, Comm: "nginx"}}}}
	hivetest.Start(t, nil,
		hive.Provide(lb.NewFrontendsTable, lb.NewServiceStatesTable),
		hive.Invoke(func(db *statedb.DB, fes statedb.RWTable[*lb.Frontend], states statedb.RWTable[*lb.ServiceState], jobs hive.Jobs) {
			c := hostportcheck.New(hostportcheck.Config{DB: db, Frontends: fes, States: states,
				Lister:   func() hostportcheck.Lister { return e.lister },
				Interval: interval, MinInterval: 5 * time.Millisecond})
			jobs.Add(hive.Service("check-host-port-sockets", nil, func(ctx context.Context, h hive.Health) { c.Run(ctx, h) }))
		}),
		hivetest.Capture(&e.db), hivetest.Capture(&e.fes), hivetest.Capture(&e.states),
	)
	return e
}

// setFrontends replaces owner's frontends by fs, as the deriver does.
func (e *env) setFrontends(t *testing.T, owner string, fs []*lb.Frontend) {
	t.Helper()
	wtxn := e.db.WriteTxn(e.fes)
	defer wtxn.Commit()
	var old []*lb.Frontend
	for f := range e.fes.List(wtxn, lb.FrontendServiceIndex.Query(owner)) {
		old = append(old, f)
	}
	for _, f := range old {
		if _, _, err := e.fes.Delete(wtxn, f); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range fs {
		if _, _, err := e.fes.Insert(wtxn, f.WithStatus(reconciler.Done())); err != nil {
			t.Fatal(err)
		}
	}
}

// waitState waits until owner's row satisfies ok (nil: no row).
func (e *env) waitState(t *testing.T, owner string, ok func(*lb.ServiceState) bool, what string) *lb.ServiceState {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		s, _, w, found := e.states.GetWatch(e.db.ReadTxn(), lb.ServiceStateOwnerIndex.Query(owner))
		if !found {
			s = nil
		}
		if ok(s) {
			return s
		}
		select {
		case <-w:
		case <-deadline:
			t.Fatalf("%s: %s; row: %+v", owner, what, s)
		}
	}
}

func gone(s *lb.ServiceState) bool { return s == nil }

func hostPortInUse(parts ...string) func(*lb.ServiceState) bool {
	return func(s *lb.ServiceState) bool {
		if s == nil || s.State != lb.StateDegraded || s.Reason != lb.ReasonHostPortInUse {
			return false
		}
		for _, p := range parts {
			if !strings.Contains(s.Message, p) {
				return false
			}
		}
		return true
	}
}

// listed waits until the lister has been asked n more times than at the
// call, so that a state seen afterwards is the checker's answer to the
// sockets set before.
func (e *env) listed(t *testing.T, n int) {
	t.Helper()
	e.lister.mu.Lock()
	want := e.lister.calls + n
	e.lister.mu.Unlock()
	deadline := time.Now().Add(10 * time.Second)
	for {
		e.lister.mu.Lock()
		c := e.lister.calls
		e.lister.mu.Unlock()
		if c >= want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the checker listed the sockets %d times, want %d", c, want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestNodePortOnHostSocket(t *testing.T) {
	e := start(t)
	o := lb.Options{KubeProxyReplacement: true, NodeName: "node1", NodeAddrs: []netip.Addr{nodeAddr}}
	owner := lb.HostSocketOwner("ns/web")
	// The deriver's row of the Service (endpoints skipped) is not the
	// checker's: it stays.
	wtxn := e.db.WriteTxn(e.states)
	deriverRow := &lb.ServiceState{Owner: "ns/web", State: lb.StateDegraded, Reason: lb.ReasonInvalidEndpoints, Message: "skipped"}
	if _, _, err := e.states.Insert(wtxn, deriverRow); err != nil {
		t.Fatal(err)
	}
	wtxn.Commit()

	e.lister.set(sock(lb.TCP, "0.0.0.0", 30080, 42))
	e.setFrontends(t, "ns/web", lb.DeriveFrontends(nodePortService(30080), nil, o))
	s := e.waitState(t, owner, hostPortInUse("NodePort 30080/TCP", "0.0.0.0:30080", "nginx (pid 1234)", "goes to the Service"),
		"a listener on the NodePort on 0.0.0.0 is reported")
	if strings.Count(s.Message, "NodePort 30080/TCP") != 1 {
		t.Errorf("the socket on 0.0.0.0 is reported once per frontend, not once: %q", s.Message)
	}
	if ns, name := s.Object(); ns != "ns" || name != "web" || s.IsPod() {
		t.Errorf("row %s is about %s/%s (pod %v), want the Service ns/web", s.Owner, ns, name, s.IsPod())
	}

	// The socket goes: the periodic listing clears the row.
	e.lister.set()
	e.waitState(t, owner, gone, "a closed listener is cleared")

	// Bound to the node's address, or IPv6 any: reported; to loopback,
	// another address, UDP, or the agent's own (its healthCheckNodePort
	// server): not.
	e.lister.set(sock(lb.TCP, nodeAddr.String(), 30080, 43))
	e.waitState(t, owner, hostPortInUse("192.168.56.10:30080"), "a listener on the node address is reported")
	e.lister.set(sock(lb.TCP, "::", 30080, 44))
	e.waitState(t, owner, hostPortInUse("[::]:30080"), "a listener on :: is reported")
	e.lister.set(sock(lb.TCP, "127.0.0.1", 30080, 45), sock(lb.TCP, "10.1.2.3", 30080, 46), sock(lb.UDP, "0.0.0.0", 30080, 47),
		hostsockets.Socket{Proto: lb.TCP, Addr: netip.IPv4Unspecified(), Port: 30080, Inode: 48, Own: true})
	e.waitState(t, owner, gone, "sockets on loopback, other addresses, other protocols and the agent's own are not reported")
	e.listed(t, 2)
	if s, _, ok := e.states.Get(e.db.ReadTxn(), lb.ServiceStateOwnerIndex.Query(owner)); ok {
		t.Fatalf("reported after two more listings: %+v", s)
	}

	// The Service moves to another nodePort: the row goes at the change.
	e.lister.set(sock(lb.TCP, "0.0.0.0", 30080, 42))
	e.waitState(t, owner, hostPortInUse("30080"), "reported again")
	e.setFrontends(t, "ns/web", lb.DeriveFrontends(nodePortService(30081), nil, o))
	e.waitState(t, owner, gone, "the Service moved off the port")

	if s, _, ok := e.states.Get(e.db.ReadTxn(), lb.ServiceStateOwnerIndex.Query("ns/web")); !ok || *s != *deriverRow {
		t.Errorf("the deriver's row changed: %+v, %v", s, ok)
	}
}

func TestHostPortOnHostSocket(t *testing.T) {
	e := start(t)
	o := lb.Options{NodeName: "node1", NodeAddrs: []netip.Addr{nodeAddr}}
	pod := lb.HostPortOwner("ns/p")
	owner := lb.HostSocketOwner(pod)
	e.lister.set(sock(lb.UDP, "::", 8053, 50))
	e.setFrontends(t, pod, lb.PodHostPortFrontends(hostPortPod(), o))
	s := e.waitState(t, owner, hostPortInUse("HostPort 8053/UDP", "[::]:8053", "goes to the pod", "hostPort"),
		"a UDP socket on the hostPort is reported")
	if ns, name := s.Object(); ns != "ns" || name != "p" || !s.IsPod() {
		t.Errorf("row %s is about %s/%s (pod %v), want the pod ns/p", s.Owner, ns, name, s.IsPod())
	}
	// The pod goes: so does the row.
	e.setFrontends(t, pod, nil)
	e.waitState(t, owner, gone, "the pod's hostPort is gone")
}

// A change of the frontends is checked at once, not at the next
// Interval.
func TestChecksOnFrontendChange(t *testing.T) {
	e := startEvery(t, time.Hour)
	o := lb.Options{KubeProxyReplacement: true, NodeName: "node1", NodeAddrs: []netip.Addr{nodeAddr}}
	owner := lb.HostSocketOwner("ns/web")
	e.lister.set(sock(lb.TCP, "0.0.0.0", 30080, 42), sock(lb.TCP, "0.0.0.0", 30081, 43))
	// No NodePort yet: nothing listed at start; the Service's frontends
	// are a change, listed at once.
	e.setFrontends(t, "ns/web", lb.DeriveFrontends(nodePortService(30080), nil, o))
	e.waitState(t, owner, hostPortInUse("NodePort 30080/TCP"), "the new NodePort is checked at once")
	e.setFrontends(t, "ns/web", lb.DeriveFrontends(nodePortService(30081), nil, o))
	e.waitState(t, owner, hostPortInUse("NodePort 30081/TCP"), "the moved NodePort is checked at once")
}

// Step lists the sockets again (and walks /proc again) only when asked
// to or when a NodePort or hostPort changed, not for new backends.
func TestStepListsOnPortChange(t *testing.T) {
	db := statedb.New()
	fes, err := lb.NewFrontendsTable(db)
	if err != nil {
		t.Fatal(err)
	}
	states, err := lb.NewServiceStatesTable(db)
	if err != nil {
		t.Fatal(err)
	}
	e := &env{db: db, fes: fes, states: states, lister: &fakeLister{procs: map[uint32]hostsockets.Process{42: {PID: 1234, Comm: "nginx"}}}}
	c := hostportcheck.New(hostportcheck.Config{DB: db, Frontends: fes, States: states})
	o := lb.Options{KubeProxyReplacement: true, NodeName: "node1", NodeAddrs: []netip.Addr{nodeAddr}}
	owner := lb.HostSocketOwner("ns/web")
	step := func(relist bool, wantRow string, listings, walks int) {
		t.Helper()
		if _, _, err := c.Step(e.lister, relist); err != nil {
			t.Fatal(err)
		}
		s, _, ok := states.Get(db.ReadTxn(), lb.ServiceStateOwnerIndex.Query(owner))
		switch {
		case wantRow == "" && ok:
			t.Errorf("row %+v, want none", s)
		case wantRow != "" && (!ok || !strings.Contains(s.Message, wantRow)):
			t.Errorf("row %+v (%v), want one with %q", s, ok, wantRow)
		}
		e.lister.mu.Lock()
		defer e.lister.mu.Unlock()
		if e.lister.calls != listings || e.lister.steps != walks {
			t.Errorf("%d listings and %d /proc walks, want %d and %d", e.lister.calls, e.lister.steps, listings, walks)
		}
	}
	e.lister.set(sock(lb.TCP, "0.0.0.0", 30080, 42))
	step(true, "", 0, 0) // no NodePort: nothing to list
	e.setFrontends(t, "ns/web", lb.DeriveFrontends(nodePortService(30080), nil, o))
	step(false, "by nginx (pid 1234)", 1, 1) // new ports: listed
	// New backends, the socket closed meanwhile: matched against the
	// last listing, its process remembered.
	e.lister.set()
	fs := lb.DeriveFrontends(nodePortService(30080), nil, o)
	for _, f := range fs {
		f.Backends = []lb.L4Addr{{Addr: netip.MustParseAddr("10.0.1.5"), Port: 8080, Proto: lb.TCP}}
	}
	e.setFrontends(t, "ns/web", fs)
	step(false, "NodePort 30080/TCP", 1, 1)
	step(true, "", 2, 1) // the Interval: listed again, gone
	e.lister.set(sock(lb.TCP, "0.0.0.0", 30081, 42))
	step(false, "", 2, 1)
	e.setFrontends(t, "ns/web", lb.DeriveFrontends(nodePortService(30081), nil, o))
	step(false, "NodePort 30081/TCP", 3, 2) // another port: listed
}

// TestConflictsRules checks the matching on its own.
func TestConflictsRules(t *testing.T) {
	fe := func(typ, addr string, port uint16, proto uint8, svc string) *lb.Frontend {
		return &lb.Frontend{Type: typ, Address: lb.L4Addr{Addr: netip.MustParseAddr(addr), Port: port, Proto: proto}, Service: svc}
	}
	fes := []*lb.Frontend{
		fe(lb.TypeNodePort, "192.168.56.10", 30080, lb.TCP, "ns/a"),
		fe(lb.TypeNodePort, "0.0.0.0", 30080, lb.TCP, "ns/a"),
		fe(lb.TypeClusterIP, "10.96.0.10", 80, lb.TCP, "ns/a"),
		fe(lb.TypeLoadBalancer, "172.18.0.100", 80, lb.TCP, "ns/a"),
		fe(lb.TypeHostPort, "192.168.56.10", 8080, lb.TCP, "ns/p/host-port"),
	}
	for _, c := range []struct {
		name  string
		sock  hostsockets.Socket
		owner string
	}{
		{"wildcard", sock(lb.TCP, "0.0.0.0", 30080, 1), "ns/a/host-socket"},
		{"node address", sock(lb.TCP, "192.168.56.10", 30080, 1), "ns/a/host-socket"},
		{"ipv6 any", sock(lb.TCP, "::", 8080, 1), "ns/p/host-port/host-socket"},
		{"loopback", sock(lb.TCP, "127.0.0.1", 30080, 1), ""},
		{"other address", sock(lb.TCP, "192.168.56.11", 30080, 1), ""},
		{"other protocol", sock(lb.UDP, "0.0.0.0", 30080, 1), ""},
		{"other port", sock(lb.TCP, "0.0.0.0", 30081, 1), ""},
		{"ClusterIP port", sock(lb.TCP, "0.0.0.0", 80, 1), ""},
		{"own", hostsockets.Socket{Proto: lb.TCP, Addr: netip.IPv4Unspecified(), Port: 30080, Inode: 1, Own: true}, ""},
	} {
		got := hostportcheck.Conflicts(fes, []hostsockets.Socket{c.sock}, nil)
		switch {
		case c.owner == "" && len(got) != 0:
			t.Errorf("%s: reported %+v", c.name, got[0])
		case c.owner != "" && (len(got) != 1 || got[0].Owner != c.owner):
			t.Errorf("%s: got %+v, want one row of %s", c.name, got, c.owner)
		}
	}
	// Several sockets on one Service: one row naming each once.
	got := hostportcheck.Conflicts(fes, []hostsockets.Socket{sock(lb.TCP, "0.0.0.0", 30080, 1), sock(lb.TCP, "192.168.56.10", 30080, 2)}, nil)
	if len(got) != 1 || strings.Count(got[0].Message, "NodePort 30080/TCP") != 2 {
		t.Errorf("two sockets: %+v", got)
	}
}
