package hubble

import (
	"net/netip"
	"testing"
	"time"

	flowpb "github.com/cilium/cilium/api/v1/flow"
	"github.com/cilium/statedb"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"
	"google.golang.org/protobuf/types/known/structpb"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/cells/hive/hivetest"
	"github.com/cellium/cellium/cells/ipcache"
	"github.com/cellium/cellium/cells/k8s"
	monitorcell "github.com/cellium/cellium/cells/monitor"
	"github.com/cellium/cellium/statedb/endpoints"
	ipcachetbl "github.com/cellium/cellium/statedb/ipcache"
	k8stables "github.com/cellium/cellium/statedb/k8s"
	"github.com/cellium/cellium/statedb/labels"
	"github.com/cellium/cellium/statedb/monitor"
	"github.com/cellium/cellium/statedb/nodes"
	"github.com/cellium/cellium/statedb/policy"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// chanSink hands flows and lost events to the test; block, when set, is
// waited on by the first OnFlow (entered is closed when it starts).
type chanSink struct {
	flows   chan *flowpb.Flow
	lost    chan *flowpb.LostEvent
	block   chan struct{}
	entered chan struct{}
}

func newChanSink() *chanSink {
	return &chanSink{flows: make(chan *flowpb.Flow, 100), lost: make(chan *flowpb.LostEvent, 10)}
}

func (s *chanSink) OnFlow(f *flowpb.Flow) {
	if s.block != nil {
		close(s.entered)
		<-s.block
		s.block = nil
	}
	s.flows <- f
}

func (s *chanSink) OnLost(l *flowpb.LostEvent) { s.lost <- l }

// agent is the partial hive of a test: the real tables, the real ipcache
// deriver, the real monitor hub and the hubble cell with a sink.
type agent struct {
	db       *statedb.DB
	hub      *monitor.Hub
	reg      *prometheus.Registry
	eps      statedb.RWTable[*endpoints.Endpoint]
	pods     statedb.RWTable[*corev1.Pod]
	local    statedb.RWTable[*nodes.LocalNode]
	nodes    statedb.RWTable[*nodes.Node]
	ceps     statedb.RWTable[*ciliumv2.CiliumEndpoint]
	ids      statedb.RWTable[*ciliumv2.CiliumIdentity]
	pols     statedb.RWTable[*policy.EndpointPolicyRow]
	k8sNodes statedb.RWTable[*corev1.Node]
	ipc      statedb.Table[*ipcachetbl.Entry]
}

func startAgent(t *testing.T, args []string, sink Sink) *agent {
	t.Helper()
	a := &agent{reg: prometheus.NewPedanticRegistry()}
	hivetest.Start(t, args,
		hive.Provide(endpoints.NewTable, k8stables.NewPodsTable, nodes.NewLocalNodeTable, nodes.NewNodesTable,
			k8stables.NewCiliumEndpointsTable, k8stables.NewCiliumIdentitiesTable, policy.NewCIDRTable, policy.NewTable,
			k8stables.NewNodesTable, statedb.RWTable[*corev1.Node].ToTable,
			statedb.RWTable[*endpoints.Endpoint].ToTable, statedb.RWTable[*corev1.Pod].ToTable,
			statedb.RWTable[*nodes.LocalNode].ToTable, statedb.RWTable[*nodes.Node].ToTable,
			statedb.RWTable[*ciliumv2.CiliumEndpoint].ToTable, statedb.RWTable[*ciliumv2.CiliumIdentity].ToTable,
			statedb.RWTable[*policy.CIDRIdentity].ToTable, statedb.RWTable[*policy.EndpointPolicyRow].ToTable,
			func() prometheus.Registerer { return a.reg },
			func() k8s.NodeName { return "n1" },
			func() SinkOut { return SinkOut{Sink: sink} }),
		monitorcell.Cell,
		ipcache.Cell,
		Cell,
		hivetest.Capture(&a.db), hivetest.Capture(&a.hub), hivetest.Capture(&a.eps), hivetest.Capture(&a.pods),
		hivetest.Capture(&a.local), hivetest.Capture(&a.nodes), hivetest.Capture(&a.ceps), hivetest.Capture(&a.ids),
		hivetest.Capture(&a.pols), hivetest.Capture(&a.ipc), hivetest.Capture(&a.k8sNodes),
	)
	return a
}

var (
	addr = netip.MustParseAddr
	pfx  = netip.MustParsePrefix
)

func identityObj(id, app string) *ciliumv2.CiliumIdentity {
	return &ciliumv2.CiliumIdentity{ObjectMeta: metav1.ObjectMeta{Name: id},
		SecurityLabels: map[string]string{"k8s:app": app, "k8s:io.kubernetes.pod.namespace": "demo"}}
}

// populate writes node n1 (this one, pods 10.1.0.0/24) and n2 (pods
// 10.2.0.0/24), the local pods web-1 (endpoint 12, of Deployment web) and
// client (endpoint 13), the pod db-0 of n2 (its CiliumEndpoint), and a
// NetworkPolicy deny-all on web's ingress; it waits for db-0's ipcache
// row.
func (a *agent) populate(t *testing.T) {
	t.Helper()
	ctl := true
	w := a.db.WriteTxn(a.eps, a.pods, a.local, a.nodes, a.ceps, a.ids, a.pols, a.k8sNodes)
	_, _, _ = a.k8sNodes.Insert(w, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", Labels: map[string]string{"zone": "a"}}})
	_, _, _ = a.local.Insert(w, &nodes.LocalNode{Name: "n1", InternalIP: addr("192.168.0.1"), RouterIP: addr("10.1.0.1"),
		PodCIDRs: []netip.Prefix{pfx("10.1.0.0/24")}})
	_, _, _ = a.nodes.Insert(w, &nodes.Node{Name: "n1", Local: true, PodCIDRs: []netip.Prefix{pfx("10.1.0.0/24")},
		Addresses: []nodes.Address{{Type: nodes.AddressInternalIP, IP: addr("192.168.0.1")}}})
	_, _, _ = a.nodes.Insert(w, &nodes.Node{Name: "n2", PodCIDRs: []netip.Prefix{pfx("10.2.0.0/24")},
		Addresses: []nodes.Address{{Type: nodes.AddressInternalIP, IP: addr("192.168.0.2")}}})
	_, _, _ = a.ids.Insert(w, identityObj("2000", "web"))
	_, _, _ = a.ids.Insert(w, identityObj("2001", "client"))
	_, _, _ = a.ids.Insert(w, identityObj("3000", "db"))
	_, _, _ = a.eps.Insert(w, &endpoints.Endpoint{ID: 12, PodNamespace: "demo", PodName: "web-1", IPv4: addr("10.1.0.10"),
		Identity: 2000, Labels: labels.ParseLabels("k8s:app=web")})
	_, _, _ = a.eps.Insert(w, &endpoints.Endpoint{ID: 13, PodNamespace: "demo", PodName: "client", IPv4: addr("10.1.0.11"), Identity: 2001})
	_, _, _ = a.pods.Insert(w, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "demo", Name: "web-1", GenerateName: "web-5f7c9d-",
		Labels:          map[string]string{"app": "web", "pod-template-hash": "5f7c9d"},
		OwnerReferences: []metav1.OwnerReference{{Kind: "ReplicaSet", Name: "web-5f7c9d", Controller: &ctl}}}})
	c := &ciliumv2.CiliumEndpoint{ObjectMeta: metav1.ObjectMeta{Namespace: "demo", Name: "db-0"}}
	c.Status.Identity = &ciliumv2.EndpointIdentity{ID: 3000}
	c.Status.Networking = &ciliumv2.EndpointNetworking{NodeIP: "192.168.0.2",
		Addressing: []*ciliumv2.AddressPair{{IPV4: "10.2.0.20"}}}
	_, _, _ = a.ceps.Insert(w, c)
	_, _, _ = a.pols.Insert(w, &policy.EndpointPolicyRow{EndpointID: 12, Identity: 2000, Policy: &policy.EndpointPolicy{Revision: 4,
		Ingress: policy.DirectionPolicy{Enforcing: true, EnforcedBy: []string{"NetworkPolicy/demo/deny-all"}},
		Egress:  policy.DirectionPolicy{Entries: []policy.Entry{{Key: policy.NewKey(0, policy.Egress, 0, 0, 0)}}}}})
	w.Commit()

	timeout := time.After(10 * time.Second)
	for {
		txn := a.db.ReadTxn()
		_, watch := a.ipc.AllWatch(txn)
		if _, _, ok := a.ipc.Get(txn, ipcachetbl.PrefixIndex.Query(pfx("10.2.0.20/32"))); ok {
			return
		}
		select {
		case <-watch:
		case <-timeout:
			t.Fatal("no ipcache row for db-0 within 10s")
		}
	}
}

func nextFlow(t *testing.T, s *chanSink) *flowpb.Flow {
	t.Helper()
	select {
	case f := <-s.flows:
		return f
	case <-time.After(10 * time.Second):
		t.Fatal("no flow at the sink within 10s")
		return nil
	}
}

// Monitor events published into the real hub reach the sink as flows
// enriched from the real tables: pod names, workload, identity labels,
// the remote pod's name and node, and the NetworkPolicy that denied.
func TestCellFlowsFromTables(t *testing.T) {
	sink := newChanSink()
	a := startAgent(t, nil, sink)
	a.populate(t)

	a.hub.Publish(monitor.Event{Type: monitor.TypeDrop, Reason: 133, Direction: monitor.DirectionIngress, EndpointID: 12,
		Timestamp: time.Now(), SrcIdentity: 2001, DstIdentity: 2000, SrcIP: addr("10.1.0.11"), DstIP: addr("10.1.0.10"),
		SrcPort: 40000, DstPort: 80, Protocol: 6, TCPFlags: 0x02})
	f := nextFlow(t, sink)
	if f.GetVerdict() != flowpb.Verdict_DROPPED || f.GetDropReasonDesc() != flowpb.DropReason_POLICY_DENIED || f.GetNodeName() != "n1" {
		t.Errorf("drop flow: verdict %v reason %v node %q", f.GetVerdict(), f.GetDropReasonDesc(), f.GetNodeName())
	}
	if l := f.GetNodeLabels(); len(l) != 1 || l[0] != "zone=a" {
		t.Errorf("node labels %v, want [zone=a]", l)
	}
	if s := f.GetSource(); s.GetPodName() != "client" || s.GetNamespace() != "demo" || s.GetID() != 13 || s.GetIdentity() != 2001 {
		t.Errorf("source %v, want demo/client, endpoint 13, identity 2001", s)
	}
	d := f.GetDestination()
	if d.GetPodName() != "web-1" || d.GetID() != 12 || len(d.GetWorkloads()) != 1 ||
		d.GetWorkloads()[0].GetKind() != "Deployment" || d.GetWorkloads()[0].GetName() != "web" {
		t.Errorf("destination %v, want demo/web-1 of Deployment web", d)
	}
	if want := []string{"k8s:app=web", "k8s:io.kubernetes.pod.namespace=demo"}; len(d.GetLabels()) != 2 || d.GetLabels()[0] != want[0] || d.GetLabels()[1] != want[1] {
		t.Errorf("destination labels %v, want %v", d.GetLabels(), want)
	}
	if by := f.GetIngressDeniedBy(); len(by) != 1 || by[0].GetName() != "deny-all" || by[0].GetKind() != "NetworkPolicy" ||
		by[0].GetNamespace() != "demo" || by[0].GetRevision() != 4 {
		t.Errorf("ingress denied by %v, want NetworkPolicy demo/deny-all at revision 4", by)
	}

	a.hub.Publish(monitor.Event{Type: monitor.TypeTrace, Reason: 5, Direction: monitor.DirectionEgress, EndpointID: 13,
		Timestamp: time.Now(), SrcIdentity: 2001, SrcIP: addr("10.1.0.11"), DstIP: addr("10.2.0.20"),
		SrcPort: 40001, DstPort: 5432, Protocol: 6, TCPFlags: 0x02, ReplyKnown: true})
	f = nextFlow(t, sink)
	if d := f.GetDestination(); d.GetPodName() != "db-0" || d.GetNamespace() != "demo" || d.GetIdentity() != 3000 || d.GetID() != 0 {
		t.Errorf("remote destination %v, want demo/db-0 identity 3000", d)
	}
	var ext structpb.Struct
	if err := f.GetExtensions().UnmarshalTo(&ext); err != nil {
		t.Fatalf("extensions: %v", err)
	}
	if src, dst := ext.GetFields()["source_node"].GetStringValue(), ext.GetFields()["destination_node"].GetStringValue(); src != "n1" || dst != "n2" {
		t.Errorf("nodes %q -> %q, want n1 -> n2", src, dst)
	}
	if f.GetTraceObservationPoint() != flowpb.TraceObservationPoint_FROM_ENDPOINT || f.GetTrafficDirection() != flowpb.TrafficDirection_EGRESS {
		t.Errorf("trace: %v %v", f.GetTraceObservationPoint(), f.GetTrafficDirection())
	}

	if got := metricFlows(t, a, "drop"); got != 1 {
		t.Errorf("cellium_hubble_flows_produced_total{type=drop} = %v, want 1", got)
	}
}

func metricFlows(t *testing.T, a *agent, typ string) float64 {
	t.Helper()
	mfs, err := a.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "cellium_hubble_flows_produced_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			if m.GetLabel()[0].GetValue() == typ {
				return m.GetCounter().GetValue()
			}
		}
	}
	t.Fatalf("no cellium_hubble_flows_produced_total{type=%q}", typ)
	return 0
}

// With a queue of one event and a sink that stalls, the events the hub
// cannot queue become one LostEvent before the next flow, counted in
// cellium_hubble_lost_events_total.
func TestCellLostEvents(t *testing.T) {
	sink := newChanSink()
	sink.block, sink.entered = make(chan struct{}), make(chan struct{})
	a := startAgent(t, []string{"--hubble-event-queue-size=1"}, sink)
	ev := monitor.Event{Type: monitor.TypeDrop, Reason: 133, Timestamp: time.Now(), SrcIP: addr("10.1.0.11"), DstIP: addr("10.1.0.10"), Protocol: 6}
	a.hub.Publish(ev)
	select {
	case <-sink.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the first flow did not reach the sink")
	}
	for range 9 {
		a.hub.Publish(ev) // one queued, eight lost
	}
	close(sink.block)
	select {
	case l := <-sink.lost:
		if l.GetNumEventsLost() != 8 || l.GetSource() != flowpb.LostEventSource_OBSERVER_EVENTS_QUEUE {
			t.Errorf("lost event %v, want 8 from OBSERVER_EVENTS_QUEUE", l)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no LostEvent within 10s")
	}
	nextFlow(t, sink)
	nextFlow(t, sink)
	mfs, _ := a.reg.Gather()
	for _, mf := range mfs {
		if mf.GetName() != "cellium_hubble_lost_events_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			want := 0.0
			if m.GetLabel()[0].GetValue() == "observer_events_queue" {
				want = 8
			}
			if m.GetCounter().GetValue() != want {
				t.Errorf("cellium_hubble_lost_events_total{source=%q} = %v, want %v", m.GetLabel()[0].GetValue(), m.GetCounter().GetValue(), want)
			}
		}
	}
}

// With --enable-hubble=false nothing subscribes to the hub.
func TestCellDisabled(t *testing.T) {
	a := startAgent(t, []string{"--enable-hubble=false"}, newChanSink())
	if n := a.hub.Stats().Subscribers; n != 0 {
		t.Errorf("%d subscribers with Hubble off, want 0", n)
	}
}
