package observer_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"path/filepath"
	"testing"
	"time"

	flowpb "github.com/cilium/cilium/api/v1/flow"
	observerpb "github.com/cilium/cilium/api/v1/observer"
	"github.com/cilium/statedb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/timestamppb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/cellium/cellium/cells/agentapi"
	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/cells/hive/hivetest"
	"github.com/cellium/cellium/cells/hubble"
	"github.com/cellium/cellium/cells/hubble/observer"
	"github.com/cellium/cellium/cells/identity"
	"github.com/cellium/cellium/cells/k8s"
	"github.com/cellium/cellium/statedb/nodes"
)

// agent is a partial hive: the observer cell with stand-ins for the node
// name, the cluster name, the agent API's config and the nodes table.
type agent struct {
	sinks  []hubble.Sink
	socket string
	db     *statedb.DB
	nodes  statedb.RWTable[*nodes.Node]
}

// sink is the flow producer's view: every sink of the group.
func (a *agent) OnFlow(f *flowpb.Flow) {
	for _, s := range a.sinks {
		s.OnFlow(f)
	}
}

func (a *agent) OnLost(l *flowpb.LostEvent) {
	for _, s := range a.sinks {
		s.OnLost(l)
	}
}

func startAgent(t *testing.T, args ...string) *agent {
	t.Helper()
	dir := t.TempDir()
	a := &agent{socket: filepath.Join(dir, "hubble.sock")}
	var in hubble.SinksIn
	hivetest.Start(t, append([]string{"--hubble-socket-path=" + a.socket}, args...),
		hive.Provide(
			func() agentapi.Config { return agentapi.Config{SocketPath: filepath.Join(dir, "cellium.sock")} },
			func() k8s.NodeName { return "node-1" },
			func() identity.ClusterName { return "default" },
			nodes.NewNodesTable, statedb.RWTable[*nodes.Node].ToTable,
		),
		hive.Config(hubble.DefaultConfig), observer.Cell,
		hivetest.Capture(&in), hivetest.Capture(&a.db), hivetest.Capture(&a.nodes),
	)
	a.sinks = in.Sinks
	if len(a.sinks) != 1 {
		t.Fatalf("the observer cell provides %d sinks, want 1", len(a.sinks))
	}
	return a
}

func (a *agent) client(t *testing.T) observerpb.ObserverClient {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+a.socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return observerpb.NewObserverClient(conn)
}

func (a *agent) addNode(t *testing.T, name string, ip string) {
	t.Helper()
	txn := a.db.WriteTxn(a.nodes)
	n := &nodes.Node{Name: name, Source: nodes.SourceCustomResource,
		Addresses: []nodes.Address{{Type: nodes.AddressInternalIP, IP: netip.MustParseAddr(ip)}}}
	if _, _, err := a.nodes.Insert(txn, n); err != nil {
		t.Fatal(err)
	}
	txn.Commit()
}

func (a *agent) deleteNode(t *testing.T, name string) {
	t.Helper()
	txn := a.db.WriteTxn(a.nodes)
	if _, _, err := a.nodes.Delete(txn, &nodes.Node{Name: name}); err != nil {
		t.Fatal(err)
	}
	txn.Commit()
}

// Endpoints of the demo flows: pods as the flow producer enriches them.
func pod(ns, name, app string, id uint32, identity uint32) *flowpb.Endpoint {
	return &flowpb.Endpoint{ID: id, Identity: identity, Namespace: ns, PodName: name,
		ClusterName: "default",
		Labels: []string{"k8s:app=" + app, "k8s:io.cilium.k8s.policy.cluster=default",
			"k8s:io.kubernetes.pod.namespace=" + ns},
		Workloads: []*flowpb.Workload{{Kind: "Deployment", Name: app}}}
}

var (
	web1    = pod("demo", "web-1", "web", 101, 12001)
	db0     = pod("demo", "db-0", "db", 102, 12002)
	coredns = pod("kube-system", "coredns-7d9f", "coredns", 103, 12003)
)

// demoFlow is the i-th of a realistic mix, at time t: web-1 to db-0 on
// TCP 5432 allowed by policy (a policy verdict, then traces), db-0 to
// CoreDNS on UDP 53, and web-1 to db-0 on TCP 6379 denied by policy
// (dropped).
func demoFlow(i int, t time.Time) *flowpb.Flow {
	f := &flowpb.Flow{
		Time:     timestamppb.New(t),
		Uuid:     fmt.Sprintf("flow-%d", i),
		NodeName: "node-1",
		Type:     flowpb.FlowType_L3_L4,
		Ethernet: &flowpb.Ethernet{Source: "02:00:00:00:00:01", Destination: "02:00:00:00:00:02"},
		IsReply:  wrapperspb.Bool(false),
	}
	switch i % 4 {
	case 0: // the first packet of a connection: policy verdict
		f.Verdict = flowpb.Verdict_FORWARDED
		f.EventType = &flowpb.CiliumEventType{Type: 5}
		f.Source, f.Destination = web1, db0
		f.IP = &flowpb.IP{Source: "10.244.1.5", Destination: "10.244.1.9", IpVersion: flowpb.IPVersion_IPv4}
		f.L4 = &flowpb.Layer4{Protocol: &flowpb.Layer4_TCP{TCP: &flowpb.TCP{SourcePort: uint32(40000 + i), DestinationPort: 5432, Flags: &flowpb.TCPFlags{SYN: true}}}}
		f.TrafficDirection = flowpb.TrafficDirection_INGRESS
		f.PolicyMatchType = 2 // L3-L4
		f.Summary = "TCP Flags: SYN"
		f.IngressAllowedBy = []*flowpb.Policy{{Name: "db-allow-web", Namespace: "demo", Kind: "CiliumNetworkPolicy"}}
	case 1: // established traffic: trace to the endpoint
		f.Verdict = flowpb.Verdict_FORWARDED
		f.EventType = &flowpb.CiliumEventType{Type: 4}
		f.Source, f.Destination = web1, db0
		f.IP = &flowpb.IP{Source: "10.244.1.5", Destination: "10.244.1.9", IpVersion: flowpb.IPVersion_IPv4}
		f.L4 = &flowpb.Layer4{Protocol: &flowpb.Layer4_TCP{TCP: &flowpb.TCP{SourcePort: uint32(40000 + i - 1), DestinationPort: 5432, Flags: &flowpb.TCPFlags{ACK: true, PSH: true}}}}
		f.TraceObservationPoint = flowpb.TraceObservationPoint_TO_ENDPOINT
		f.TrafficDirection = flowpb.TrafficDirection_INGRESS
		f.Summary = "TCP Flags: ACK, PSH"
	case 2: // DNS to CoreDNS through the kube-dns Service
		f.Verdict = flowpb.Verdict_FORWARDED
		f.EventType = &flowpb.CiliumEventType{Type: 4}
		f.Source, f.Destination = db0, coredns
		f.IP = &flowpb.IP{Source: "10.244.1.9", Destination: "10.244.0.3", IpVersion: flowpb.IPVersion_IPv4}
		f.L4 = &flowpb.Layer4{Protocol: &flowpb.Layer4_UDP{UDP: &flowpb.UDP{SourcePort: uint32(50000 + i), DestinationPort: 53}}}
		f.DestinationService = &flowpb.Service{Name: "kube-dns", Namespace: "kube-system"}
		f.TraceObservationPoint = flowpb.TraceObservationPoint_FROM_ENDPOINT
		f.Summary = "UDP"
		f.TrafficDirection = flowpb.TrafficDirection_EGRESS
	case 3: // denied by policy
		f.Verdict = flowpb.Verdict_DROPPED
		f.DropReason = 133
		f.DropReasonDesc = flowpb.DropReason_POLICY_DENIED
		f.Summary = "TCP Flags: SYN"
		f.EventType = &flowpb.CiliumEventType{Type: 1, SubType: 133}
		f.Source, f.Destination = web1, db0
		f.IP = &flowpb.IP{Source: "10.244.1.5", Destination: "10.244.1.9", IpVersion: flowpb.IPVersion_IPv4}
		f.L4 = &flowpb.Layer4{Protocol: &flowpb.Layer4_TCP{TCP: &flowpb.TCP{SourcePort: uint32(41000 + i), DestinationPort: 6379, Flags: &flowpb.TCPFlags{SYN: true}}}}
		f.TrafficDirection = flowpb.TrafficDirection_INGRESS
	}
	return f
}

// feed writes n demo flows through the sink, one millisecond apart,
// ending at end.
func feed(s hubble.Sink, from, n int, end time.Time) {
	for i := from; i < from+n; i++ {
		s.OnFlow(demoFlow(i, end.Add(time.Duration(i-from-n+1)*time.Millisecond)))
	}
}

func recvAll(t *testing.T, stream grpc.ServerStreamingClient[observerpb.GetFlowsResponse]) (flows []*flowpb.Flow, lost []*flowpb.LostEvent, err error) {
	t.Helper()
	for {
		resp, err := stream.Recv()
		if err != nil {
			return flows, lost, err
		}
		if f := resp.GetFlow(); f != nil {
			flows = append(flows, f)
		}
		if l := resp.GetLostEvents(); l != nil {
			lost = append(lost, l)
		}
	}
}

func getFlows(t *testing.T, c observerpb.ObserverClient, req *observerpb.GetFlowsRequest) ([]*flowpb.Flow, []*flowpb.LostEvent, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stream, err := c.GetFlows(ctx, req)
	if err != nil {
		return nil, nil, err
	}
	flows, lost, err := recvAll(t, stream)
	if err != nil && !errors.Is(err, io.EOF) {
		return flows, lost, err
	}
	return flows, lost, nil
}
