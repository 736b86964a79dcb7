package hubble

import (
	"context"
	"fmt"
	"net/netip"
	"strconv"
	"syscall"
	"testing"
	"time"

	flowpb "github.com/cilium/cilium/api/v1/flow"
	"github.com/cilium/statedb"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	"github.com/cellium/cellium/cells/hubble/parser"
	"github.com/cellium/cellium/statedb/endpoints"
	"github.com/cellium/cellium/statedb/identity"
	"github.com/cellium/cellium/statedb/ipcache"
	k8stables "github.com/cellium/cellium/statedb/k8s"
	"github.com/cellium/cellium/statedb/labels"
	"github.com/cellium/cellium/statedb/monitor"
	"github.com/cellium/cellium/statedb/nodes"
	"github.com/cellium/cellium/statedb/policy"
)

// Sizes of the benchmark's node: local pods, remote pods on other
// nodes, nodes.
const (
	benchLocal  = 100
	benchRemote = 5000
	benchNodes  = 50
)

// benchTables fills real tables as a node of a mid-sized cluster: 100
// local endpoints with pods of Deployments and a computed policy each
// (an allow on tcp/80 from every local identity, default deny), 5000
// remote pods (ipcache rows of CiliumEndpoints on 50 nodes) and their
// identities.
func benchTables(b *testing.B) Tables {
	b.Helper()
	db := statedb.New()
	must := func(err error) {
		if err != nil {
			b.Fatal(err)
		}
	}
	eps, err := endpoints.NewTable(db)
	must(err)
	pods, err := k8stables.NewPodsTable(db)
	must(err)
	ipc, err := ipcache.NewTable(db)
	must(err)
	nds, err := nodes.NewNodesTable(db)
	must(err)
	ids, err := k8stables.NewCiliumIdentitiesTable(db)
	must(err)
	pols, err := policy.NewTable(db)
	must(err)

	ctl := true
	w := db.WriteTxn(eps, pods, ipc, nds, ids, pols)
	for n := range benchNodes {
		_, _, _ = nds.Insert(w, &nodes.Node{Name: fmt.Sprintf("node-%d", n),
			Addresses: []nodes.Address{{Type: nodes.AddressInternalIP, IP: netip.AddrFrom4([4]byte{192, 168, 1, byte(n)})}}})
	}
	for i := range benchLocal + benchRemote {
		id := identity.NumericIdentity(10000 + i)
		app := "app-" + strconv.Itoa(i)
		_, _, _ = ids.Insert(w, &ciliumv2.CiliumIdentity{ObjectMeta: metav1.ObjectMeta{Name: strconv.Itoa(int(id))},
			SecurityLabels: map[string]string{"k8s:app": app, "k8s:io.kubernetes.pod.namespace": "ns-" + strconv.Itoa(i%20),
				"k8s:io.cilium.k8s.policy.cluster": "default", "k8s:io.cilium.k8s.policy.serviceaccount": "default"}})
	}
	var allow []policy.Entry
	for i := range benchLocal {
		allow = append(allow, policy.Entry{Key: policy.NewKey(identity.NumericIdentity(10000+i), policy.Ingress, policy.ProtoTCP, 80, 16),
			DerivedFrom: []string{"CiliumNetworkPolicy/ns-0/allow-web"}})
	}
	for i := range benchLocal {
		ns, name := "ns-"+strconv.Itoa(i%20), "web-5f7c9d-"+strconv.Itoa(i)
		ip := benchLocalIP(i)
		_, _, _ = eps.Insert(w, &endpoints.Endpoint{ID: uint16(100 + i), PodNamespace: ns, PodName: name, IPv4: ip,
			Identity: identity.NumericIdentity(10000 + i), Labels: labels.ParseLabels("k8s:app=app-" + strconv.Itoa(i)),
			HostIfName: "lxc" + strconv.Itoa(i), HostIfIndex: 100 + i})
		_, _, _ = pods.Insert(w, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, GenerateName: "web-5f7c9d-",
			Labels:          map[string]string{"pod-template-hash": "5f7c9d"},
			OwnerReferences: []metav1.OwnerReference{{Kind: "ReplicaSet", Name: "web-5f7c9d", Controller: &ctl}}}})
		_, _, _ = pols.Insert(w, &policy.EndpointPolicyRow{EndpointID: uint16(100 + i), Identity: identity.NumericIdentity(10000 + i),
			Policy: &policy.EndpointPolicy{Revision: 9,
				Ingress: policy.DirectionPolicy{Enforcing: true, Entries: allow, EnforcedBy: []string{"CiliumNetworkPolicy/ns-0/allow-web"}},
				Egress:  policy.DirectionPolicy{Entries: []policy.Entry{{Key: policy.NewKey(0, policy.Egress, 0, 0, 0)}}}}})
		_, _, _ = ipc.Insert(w, &ipcache.Entry{Prefix: netip.PrefixFrom(ip, 32), Identity: identity.NumericIdentity(10000 + i),
			Source: ipcache.SourceEndpoint, Owner: "endpoint " + strconv.Itoa(100+i)})
	}
	for i := range benchRemote {
		_, _, _ = ipc.Insert(w, &ipcache.Entry{Prefix: netip.PrefixFrom(benchRemoteIP(i), 32),
			Identity: identity.NumericIdentity(10000 + benchLocal + i), Source: ipcache.SourceCiliumEndpoint,
			Owner:  "cep ns-" + strconv.Itoa(i%20) + "/db-" + strconv.Itoa(i),
			HostIP: netip.AddrFrom4([4]byte{192, 168, 1, byte(i % benchNodes)})})
	}
	for n := range benchNodes {
		_, _, _ = ipc.Insert(w, &ipcache.Entry{Prefix: netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 100, byte(n), 0}), 24),
			Identity: identity.ReservedIdentityWorld, Source: ipcache.SourceNodeCIDR, Owner: fmt.Sprintf("node node-%d", n),
			HostIP: netip.AddrFrom4([4]byte{192, 168, 1, byte(n)})})
	}
	w.Commit()
	return Tables{DB: db, Endpoints: eps, Pods: pods, IPCache: ipc, Nodes: nds, Identities: ids, Policies: pols}
}

func benchLocalIP(i int) netip.Addr { return netip.AddrFrom4([4]byte{10, 1, 0, byte(10 + i)}) }
func benchRemoteIP(i int) netip.Addr {
	return netip.AddrFrom4([4]byte{10, 100, byte(i % benchNodes), byte(i / benchNodes)})
}

// benchEvents is a mix as a busy node makes: traces between local pods
// and to remote pods (half of them replies), policy verdicts (allowed,
// denied by default), policy drops, and drops from world.
func benchEvents() []monitor.Event {
	var evs []monitor.Event
	now := time.Now()
	for i := range 1000 {
		a, c := i%benchLocal, (i*7+3)%benchLocal
		r := i * 13 % benchRemote
		switch i % 5 {
		case 0, 1:
			evs = append(evs, monitor.Event{Type: monitor.TypeTrace, Reason: 5, Direction: monitor.DirectionEgress, EndpointID: uint16(100 + a),
				Timestamp: now, SrcIdentity: uint32(10000 + a), SrcIP: benchLocalIP(a), DstIP: benchRemoteIP(r), SrcPort: 40000, DstPort: 5432,
				Protocol: 6, TCPFlags: 0x18, ReplyKnown: true, IsReply: i%2 == 0, Ifindex: uint32(100 + a)})
		case 2:
			evs = append(evs, monitor.Event{Type: monitor.TypePolicyVerdict, Verdict: monitor.VerdictAllow, Direction: monitor.DirectionIngress,
				EndpointID: uint16(100 + a), Timestamp: now, SrcIdentity: uint32(10000 + c), DstIdentity: uint32(10000 + a),
				SrcIP: benchLocalIP(c), DstIP: benchLocalIP(a), SrcPort: 40001, DstPort: 80, Protocol: 6, TCPFlags: 0x02})
		case 3:
			evs = append(evs, monitor.Event{Type: monitor.TypeDrop, Reason: 133, Direction: monitor.DirectionIngress,
				EndpointID: uint16(100 + a), Timestamp: now, SrcIdentity: uint32(10000 + benchLocal + r), DstIdentity: uint32(10000 + a),
				SrcIP: benchRemoteIP(r), DstIP: benchLocalIP(a), SrcPort: 40002, DstPort: 8080, Protocol: 6, TCPFlags: 0x02})
		case 4:
			evs = append(evs, monitor.Event{Type: monitor.TypeDrop, Reason: 133, Direction: monitor.DirectionIngress,
				EndpointID: uint16(100 + a), Timestamp: now, SrcIdentity: 2, DstIdentity: uint32(10000 + a),
				SrcIP: netip.AddrFrom4([4]byte{8, 8, byte(i), 8}), DstIP: benchLocalIP(a), SrcPort: 53, DstPort: 53, Protocol: 17})
		}
	}
	return evs
}

// BenchmarkParseEnriched turns datapath events into flows enriched from
// real tables, on the calling goroutine: flows/s and allocations per flow
// on one core (run with -cpu 1).
func BenchmarkParseEnriched(b *testing.B) {
	p := parser.New("node-0", NewSources(benchTables(b)))
	evs := benchEvents()
	// Warm the caches as a running agent has them.
	for i := range evs {
		if _, err := p.Parse(&evs[i]); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	b.ResetTimer()
	start, cpuStart := time.Now(), cpuTime(b)
	for i := range b.N {
		if _, err := p.Parse(&evs[i%len(evs)]); err != nil {
			b.Fatal(err)
		}
	}
	reportRates(b, start, cpuStart)
}

// BenchmarkParseBare is the conversion alone, without any table.
func BenchmarkParseBare(b *testing.B) {
	p := parser.New("node-0", parser.Sources{})
	evs := benchEvents()
	b.ReportAllocs()
	b.ResetTimer()
	start, cpuStart := time.Now(), cpuTime(b)
	for i := range b.N {
		if _, err := p.Parse(&evs[i%len(evs)]); err != nil {
			b.Fatal(err)
		}
	}
	reportRates(b, start, cpuStart)
}

// countSink counts flows and signals when it has seen want.
type countSink struct {
	n, want int
	done    chan struct{}
}

func (s *countSink) OnFlow(*flowpb.Flow) {
	s.n++
	if s.n == s.want {
		close(s.done)
	}
}

func (s *countSink) OnLost(*flowpb.LostEvent) {}

// BenchmarkProducerThroughHub is the whole path of the cell: events published into
// the monitor hub, read by the producer's goroutine, parsed, enriched and
// handed to a sink. The publisher waits for room (a real datapath would
// lose events instead).
func BenchmarkProducerThroughHub(b *testing.B) {
	hub := monitor.NewHub()
	defer hub.Close()
	sink := &countSink{want: b.N, done: make(chan struct{})}
	pr := newProducer(hub, parser.New("node-0", NewSources(benchTables(b))), []Sink{sink}, 4096, DefaultLostEventSendInterval, nil, nil)
	pr.Subscribe()
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan struct{})
	go func() { defer close(stopped); _ = pr.Run(ctx, nil) }()
	evs := benchEvents()
	b.ReportAllocs()
	b.ResetTimer()
	start, cpuStart := time.Now(), cpuTime(b)
	for i := range b.N {
		for len(pr.sub.Events()) == cap(pr.sub.Events()) {
			time.Sleep(10 * time.Microsecond)
		}
		hub.Publish(evs[i%len(evs)])
	}
	<-sink.done
	reportRates(b, start, cpuStart)
	b.StopTimer()
	cancel()
	<-stopped
	if lost := pr.sub.Lost(); lost != 0 {
		b.Fatalf("%d events lost", lost)
	}
}

// cpuTime is the CPU time (user and system) the process has used. This
// machine's cores are shared, so wall time per flow says more about the
// neighbours than about the parser: run with -cpu 1 and read cpu-ns/flow.
func cpuTime(b *testing.B) time.Duration {
	b.Helper()
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatalf("getrusage: %v", err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// reportRates reports flows per wall second, and CPU time per flow and
// flows per CPU second (what one core would do).
func reportRates(b *testing.B, start time.Time, cpuStart time.Duration) {
	cpu := cpuTime(b) - cpuStart
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "flows/s")
	if cpu > 0 {
		b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N), "cpu-ns/flow")
		b.ReportMetric(float64(b.N)/cpu.Seconds(), "flows/cpu-s")
	}
}
