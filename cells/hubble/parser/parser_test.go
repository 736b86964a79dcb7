package parser

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"

	flowpb "github.com/cilium/cilium/api/v1/flow"
	"github.com/google/uuid"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/cellium/cellium/statedb/monitor"
)

var t0 = time.Date(2026, 12, 2, 14, 0, 0, 0, time.UTC)

// Expected ends of flows in world().
func webEP() *flowpb.Endpoint {
	return &flowpb.Endpoint{ID: 12, Identity: uint32(webID), ClusterName: "default", Namespace: "demo", PodName: "web-1",
		Labels: podLabels("web"), Workloads: []*flowpb.Workload{{Kind: "Deployment", Name: "web"}}}
}

func clientEP() *flowpb.Endpoint {
	return &flowpb.Endpoint{ID: 13, Identity: uint32(clientID), ClusterName: "default", Namespace: "demo", PodName: "client",
		Labels: podLabels("client")}
}

func dbEP() *flowpb.Endpoint {
	return &flowpb.Endpoint{Identity: uint32(remoteID), ClusterName: "default", Namespace: "demo", PodName: "db-0", Labels: podLabels("db")}
}

func reservedEP(id uint32, name string) *flowpb.Endpoint {
	return &flowpb.Endpoint{Identity: id, Labels: []string{"reserved:" + name}}
}

func tcp(sport, dport uint32, flags *flowpb.TCPFlags) *flowpb.Layer4 {
	return &flowpb.Layer4{Protocol: &flowpb.Layer4_TCP{TCP: &flowpb.TCP{SourcePort: sport, DestinationPort: dport, Flags: flags}}}
}

func ip4(src, dst string) *flowpb.IP {
	return &flowpb.IP{Source: src, Destination: dst, IpVersion: flowpb.IPVersion_IPv4}
}

func nodesExt(t *testing.T, src, dst string) *structpb.Struct {
	t.Helper()
	m := map[string]any{}
	if src != "" {
		m[ExtSourceNode] = src
	}
	if dst != "" {
		m[ExtDestinationNode] = dst
	}
	s, err := structpb.NewStruct(m)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestParse(t *testing.T) {
	syn := &flowpb.TCPFlags{SYN: true}
	tests := []struct {
		name     string
		ev       monitor.Event
		want     *flowpb.Flow
		src, dst string // node names in the extension
	}{{
		name: "policy drop, default deny names the enforcing policies",
		ev: monitor.Event{Type: monitor.TypeDrop, Reason: 133, Direction: monitor.DirectionIngress, EndpointID: 12,
			SrcIdentity: uint32(clientID), DstIdentity: uint32(webID), SrcIP: clientIP, DstIP: webIP,
			SrcPort: 40000, DstPort: 8080, Protocol: 6, TCPFlags: 0x02},
		want: &flowpb.Flow{Verdict: flowpb.Verdict_DROPPED, DropReason: 133, DropReasonDesc: flowpb.DropReason_POLICY_DENIED,
			IP: ip4("10.0.1.11", "10.0.1.10"), L4: tcp(40000, 8080, syn), Source: clientEP(), Destination: webEP(),
			EventType: &flowpb.CiliumEventType{Type: 1, SubType: 133}, TrafficDirection: flowpb.TrafficDirection_INGRESS,
			IngressDeniedBy: []*flowpb.Policy{
				{Kind: "CiliumNetworkPolicy", Namespace: "demo", Name: "allow-web", Revision: 7, Labels: []string{
					"k8s:io.cilium.k8s.policy.derived-from=CiliumNetworkPolicy", "k8s:io.cilium.k8s.policy.name=allow-web", "k8s:io.cilium.k8s.policy.namespace=demo"}},
				{Kind: "NetworkPolicy", Namespace: "demo", Name: "deny-all", Revision: 7, Labels: []string{
					"k8s:io.cilium.k8s.policy.derived-from=NetworkPolicy", "k8s:io.cilium.k8s.policy.name=deny-all", "k8s:io.cilium.k8s.policy.namespace=demo"}},
			}},
		src: "node-1", dst: "node-1",
	}, {
		name: "non-policy drop: no provenance, reason kept",
		ev: monitor.Event{Type: monitor.TypeDrop, Reason: 174, Direction: monitor.DirectionEgress, EndpointID: 13,
			SrcIdentity: uint32(clientID), DstIdentity: 2, SrcIP: clientIP, DstIP: svcIP, SrcPort: 40001, DstPort: 80, Protocol: 6},
		want: &flowpb.Flow{Verdict: flowpb.Verdict_DROPPED, DropReason: 174, DropReasonDesc: flowpb.DropReason_IS_A_CLUSTERIP,
			IP: ip4("10.0.1.11", "10.96.0.10"), L4: tcp(40001, 80, nil), Source: clientEP(), Destination: reservedEP(2, "world"),
			EventType: &flowpb.CiliumEventType{Type: 1, SubType: 174}, TrafficDirection: flowpb.TrafficDirection_EGRESS,
			DestinationService: &flowpb.Service{Name: "web", Namespace: "demo"}},
		src: "node-1",
	}, {
		name: "policy verdict allow names the allowing rule",
		ev: monitor.Event{Type: monitor.TypePolicyVerdict, Verdict: monitor.VerdictAllow, Direction: monitor.DirectionIngress, EndpointID: 12,
			SrcIdentity: uint32(clientID), DstIdentity: uint32(webID), SrcIP: clientIP, DstIP: webIP,
			SrcPort: 40000, DstPort: 80, Protocol: 6, TCPFlags: 0x02},
		want: &flowpb.Flow{Verdict: flowpb.Verdict_FORWARDED, IP: ip4("10.0.1.11", "10.0.1.10"), L4: tcp(40000, 80, syn),
			Source: clientEP(), Destination: webEP(), EventType: &flowpb.CiliumEventType{Type: 5},
			IsReply: wrapperspb.Bool(false), TrafficDirection: flowpb.TrafficDirection_INGRESS, PolicyMatchType: PolicyMatchL3L4,
			IngressAllowedBy: []*flowpb.Policy{{Kind: "CiliumNetworkPolicy", Namespace: "demo", Name: "allow-web", Revision: 7, Labels: []string{
				"k8s:io.cilium.k8s.policy.derived-from=CiliumNetworkPolicy", "k8s:io.cilium.k8s.policy.name=allow-web", "k8s:io.cilium.k8s.policy.namespace=demo"}}}},
		src: "node-1", dst: "node-1",
	}, {
		name: "policy verdict deny by a deny rule, to a remote pod",
		ev: monitor.Event{Type: monitor.TypePolicyVerdict, Verdict: monitor.VerdictDeny, Reason: 181, Direction: monitor.DirectionEgress, EndpointID: 13,
			SrcIdentity: uint32(clientID), DstIdentity: uint32(remoteID), SrcIP: clientIP, DstIP: remoteIP,
			SrcPort: 40002, DstPort: 5432, Protocol: 6},
		want: &flowpb.Flow{Verdict: flowpb.Verdict_DROPPED, DropReason: 181, DropReasonDesc: flowpb.DropReason_POLICY_DENY,
			IP: ip4("10.0.1.11", "10.0.2.20"), L4: tcp(40002, 5432, nil), Source: clientEP(), Destination: dbEP(),
			EventType: &flowpb.CiliumEventType{Type: 5}, TrafficDirection: flowpb.TrafficDirection_EGRESS, PolicyMatchType: PolicyMatchL3L4,
			EgressDeniedBy: []*flowpb.Policy{{Kind: "CiliumNetworkPolicy", Namespace: "demo", Name: "no-db", Revision: 7, Labels: []string{
				"k8s:io.cilium.k8s.policy.derived-from=CiliumNetworkPolicy", "k8s:io.cilium.k8s.policy.name=no-db", "k8s:io.cilium.k8s.policy.namespace=demo"}}}},
		src: "node-1", dst: "node-2",
	}, {
		name: "policy verdict deny without a reason is Policy denied; audit names the deny",
		ev: monitor.Event{Type: monitor.TypePolicyVerdict, Verdict: monitor.VerdictAudit, Direction: monitor.DirectionIngress, EndpointID: 12,
			SrcIdentity: 2, DstIdentity: uint32(webID), SrcIP: worldIP, DstIP: webIP, SrcPort: 5000, DstPort: 443, Protocol: 6},
		want: &flowpb.Flow{Verdict: flowpb.Verdict_AUDIT, IP: ip4("8.8.8.8", "10.0.1.10"), L4: tcp(5000, 443, nil),
			Source: reservedEP(2, "world"), Destination: webEP(), EventType: &flowpb.CiliumEventType{Type: 5},
			IsReply: wrapperspb.Bool(false), TrafficDirection: flowpb.TrafficDirection_INGRESS,
			IngressDeniedBy: PolicyList([]string{"CiliumNetworkPolicy/demo/allow-web", "NetworkPolicy/demo/deny-all"}, 7)},
		dst: "node-1",
	}, {
		name: "policy verdict allow by an allow-all of a clusterwide policy",
		ev: monitor.Event{Type: monitor.TypePolicyVerdict, Verdict: monitor.VerdictAllow, Direction: monitor.DirectionEgress, EndpointID: 13,
			SrcIdentity: uint32(clientID), DstIdentity: 2, SrcIP: clientIP, DstIP: worldIP, SrcPort: 40003, DstPort: 53, Protocol: 17},
		want: &flowpb.Flow{Verdict: flowpb.Verdict_FORWARDED, IP: ip4("10.0.1.11", "8.8.8.8"),
			L4:     &flowpb.Layer4{Protocol: &flowpb.Layer4_UDP{UDP: &flowpb.UDP{SourcePort: 40003, DestinationPort: 53}}},
			Source: clientEP(), Destination: reservedEP(2, "world"), EventType: &flowpb.CiliumEventType{Type: 5},
			IsReply: wrapperspb.Bool(false), TrafficDirection: flowpb.TrafficDirection_EGRESS, PolicyMatchType: PolicyMatchAll,
			EgressAllowedBy: []*flowpb.Policy{{Kind: "CiliumClusterwideNetworkPolicy", Name: "egress-all", Revision: 7, Labels: []string{
				"k8s:io.cilium.k8s.policy.derived-from=CiliumClusterwideNetworkPolicy", "k8s:io.cilium.k8s.policy.name=egress-all"}}}},
		src: "node-1",
	}, {
		name: "a remote pod's address in an ipBlock: allowed by the CIDR identity's entry",
		ev: monitor.Event{Type: monitor.TypePolicyVerdict, Verdict: monitor.VerdictAllow, Direction: monitor.DirectionIngress, EndpointID: 12,
			SrcIdentity: uint32(remoteID), DstIdentity: uint32(webID), SrcIP: remoteIP, DstIP: webIP, SrcPort: 40010, DstPort: 9000, Protocol: 6},
		want: &flowpb.Flow{Verdict: flowpb.Verdict_FORWARDED, IP: ip4("10.0.2.20", "10.0.1.10"), L4: tcp(40010, 9000, nil),
			Source: dbEP(), Destination: webEP(), EventType: &flowpb.CiliumEventType{Type: 5},
			IsReply: wrapperspb.Bool(false), TrafficDirection: flowpb.TrafficDirection_INGRESS, PolicyMatchType: PolicyMatchL3L4,
			IngressAllowedBy: PolicyList([]string{"NetworkPolicy/demo/ipblock"}, 7)},
		src: "node-2", dst: "node-1",
	}, {
		name: "ICMP echo allowed by type",
		ev: monitor.Event{Type: monitor.TypePolicyVerdict, Verdict: monitor.VerdictAllow, Direction: monitor.DirectionIngress, EndpointID: 12,
			SrcIdentity: uint32(clientID), DstIdentity: uint32(webID), SrcIP: clientIP, DstIP: webIP, Protocol: 1, ICMPType: 8},
		want: &flowpb.Flow{Verdict: flowpb.Verdict_FORWARDED, IP: ip4("10.0.1.11", "10.0.1.10"),
			L4:     &flowpb.Layer4{Protocol: &flowpb.Layer4_ICMPv4{ICMPv4: &flowpb.ICMPv4{Type: 8}}},
			Source: clientEP(), Destination: webEP(), EventType: &flowpb.CiliumEventType{Type: 5},
			IsReply: wrapperspb.Bool(false), TrafficDirection: flowpb.TrafficDirection_INGRESS, PolicyMatchType: PolicyMatchL3L4,
			IngressAllowedBy: PolicyList([]string{"NetworkPolicy/demo/ping"}, 7)},
		src: "node-1", dst: "node-1",
	}, {
		name: "trace to-endpoint of a reply: direction of the connection, interface named",
		ev: monitor.Event{Type: monitor.TypeTrace, Reason: 0, Direction: monitor.DirectionIngress, EndpointID: 13, Ifindex: 41,
			SrcIdentity: uint32(webID), DstIdentity: uint32(clientID), SrcIP: webIP, DstIP: clientIP,
			SrcPort: 80, DstPort: 40000, Protocol: 6, TCPFlags: 0x12, IsReply: true, ReplyKnown: true},
		want: &flowpb.Flow{Verdict: flowpb.Verdict_FORWARDED, IP: ip4("10.0.1.10", "10.0.1.11"), L4: tcp(80, 40000, &flowpb.TCPFlags{SYN: true, ACK: true}),
			Source: webEP(), Destination: clientEP(), EventType: &flowpb.CiliumEventType{Type: 4, SubType: 0},
			TraceObservationPoint: flowpb.TraceObservationPoint_TO_ENDPOINT, IsReply: wrapperspb.Bool(true), Reply: true,
			TrafficDirection: flowpb.TrafficDirection_EGRESS, Interface: &flowpb.NetworkInterface{Index: 41, Name: "lxc13"}},
		src: "node-1", dst: "node-1",
	}, {
		name: "trace from-endpoint, reply unknown: no direction (as Hubble)",
		ev: monitor.Event{Type: monitor.TypeTrace, Reason: 5, Direction: monitor.DirectionEgress, EndpointID: 13, Ifindex: 41,
			SrcIP: clientIP, DstIP: remoteIP, SrcPort: 40000, DstPort: 5432, Protocol: 6, TCPFlags: 0x18},
		want: &flowpb.Flow{Verdict: flowpb.Verdict_FORWARDED, IP: ip4("10.0.1.11", "10.0.2.20"), L4: tcp(40000, 5432, &flowpb.TCPFlags{PSH: true, ACK: true}),
			Source: clientEP(), Destination: dbEP(), EventType: &flowpb.CiliumEventType{Type: 4, SubType: 5},
			TraceObservationPoint: flowpb.TraceObservationPoint_FROM_ENDPOINT, Interface: &flowpb.NetworkInterface{Index: 41, Name: "lxc13"}},
		src: "node-1", dst: "node-2",
	}, {
		name: "trace to-overlay from the host to a remote node",
		ev: monitor.Event{Type: monitor.TypeTrace, Reason: 4, Direction: monitor.DirectionEgress, Ifindex: 3,
			SrcIP: netip.MustParseAddr("192.168.0.1"), DstIP: node2IP, Protocol: 17, SrcPort: 1000, DstPort: 8472},
		want: &flowpb.Flow{Verdict: flowpb.Verdict_FORWARDED, IP: ip4("192.168.0.1", "192.168.0.2"),
			L4:     &flowpb.Layer4{Protocol: &flowpb.Layer4_UDP{UDP: &flowpb.UDP{SourcePort: 1000, DestinationPort: 8472}}},
			Source: reservedEP(1, "host"), Destination: reservedEP(6, "remote-node"), EventType: &flowpb.CiliumEventType{Type: 4, SubType: 4},
			TraceObservationPoint: flowpb.TraceObservationPoint_TO_OVERLAY, Interface: &flowpb.NetworkInterface{Index: 3}},
		src: "node-1", dst: "node-2",
	}, {
		name: "trace from-overlay, a pod of node-2 without its CiliumEndpoint yet",
		ev: monitor.Event{Type: monitor.TypeTrace, Reason: 9, Direction: monitor.DirectionIngress, Ifindex: 3,
			SrcIP: netip.MustParseAddr("10.0.2.99"), DstIP: webIP, Protocol: 6, SrcPort: 1, DstPort: 80, TCPFlags: 0x01},
		want: &flowpb.Flow{Verdict: flowpb.Verdict_FORWARDED, IP: ip4("10.0.2.99", "10.0.1.10"), L4: tcp(1, 80, &flowpb.TCPFlags{FIN: true}),
			Source: reservedEP(2, "world"), Destination: webEP(), EventType: &flowpb.CiliumEventType{Type: 4, SubType: 9},
			TraceObservationPoint: flowpb.TraceObservationPoint_FROM_OVERLAY, Interface: &flowpb.NetworkInterface{Index: 3}},
		src: "node-2", dst: "node-1",
	}, {
		name: "policy CIDR identity without labels: cidr and world labels",
		ev: monitor.Event{Type: monitor.TypeDrop, Reason: 133, Direction: monitor.DirectionEgress, EndpointID: 13,
			SrcIP: clientIP, DstIP: cidrIP, Protocol: 6, SrcPort: 2, DstPort: 22},
		want: &flowpb.Flow{Verdict: flowpb.Verdict_DROPPED, DropReason: 133, DropReasonDesc: flowpb.DropReason_POLICY_DENIED,
			IP: ip4("10.0.1.11", "172.16.5.5"), L4: tcp(2, 22, nil), Source: clientEP(),
			Destination: &flowpb.Endpoint{Identity: uint32(cidrID), Labels: []string{"cidr:172.16.0.0/16", "reserved:world"}},
			EventType:   &flowpb.CiliumEventType{Type: 1, SubType: 133}, TrafficDirection: flowpb.TrafficDirection_EGRESS},
		src: "node-1",
	}, {
		name: "translated ClusterIP names the destination Service",
		ev: monitor.Event{Type: monitor.TypeTrace, Reason: 0, Direction: monitor.DirectionIngress, EndpointID: 12, Ifindex: 40,
			SrcIP: clientIP, DstIP: webIP, SrcPort: 40005, DstPort: 8080, Protocol: 6, TCPFlags: 0x02,
			ReplyKnown: true, OrigDstIP: svcIP, OrigDstPort: 80},
		want: &flowpb.Flow{Verdict: flowpb.Verdict_FORWARDED, IP: ip4("10.0.1.11", "10.0.1.10"), L4: tcp(40005, 8080, syn),
			Source: clientEP(), Destination: webEP(), EventType: &flowpb.CiliumEventType{Type: 4},
			TraceObservationPoint: flowpb.TraceObservationPoint_TO_ENDPOINT, IsReply: wrapperspb.Bool(false),
			TrafficDirection: flowpb.TrafficDirection_INGRESS, Interface: &flowpb.NetworkInterface{Index: 40, Name: "lxc12"},
			DestinationService: &flowpb.Service{Name: "web", Namespace: "demo"}},
		src: "node-1", dst: "node-1",
	}}
	p := New("node-1", world().sources())
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tc.ev.Timestamp = t0
			got, err := p.Parse(&tc.ev)
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			if _, err := uuid.Parse(got.GetUuid()); err != nil {
				t.Errorf("uuid %q: %v", got.GetUuid(), err)
			}
			want := proto.Clone(tc.want).(*flowpb.Flow)
			want.Time = timestamppb.New(t0)
			want.Uuid = got.GetUuid()
			want.Emitter = &flowpb.Emitter{Name: "Hubble"}
			want.Type = flowpb.FlowType_L3_L4
			want.NodeName = "node-1"
			want.NodeLabels = []string{"kubernetes.io/hostname=node-1", "zone=a"}
			if tc.src != "" || tc.dst != "" {
				ext := nodesExt(t, tc.src, tc.dst)
				var gotExt structpb.Struct
				if got.GetExtensions() == nil || got.GetExtensions().UnmarshalTo(&gotExt) != nil || !proto.Equal(&gotExt, ext) {
					t.Errorf("extensions: got %v, want %v", got.GetExtensions(), ext)
				}
			} else if got.GetExtensions() != nil {
				t.Errorf("extensions: got %v, want none", got.GetExtensions())
			}
			got.Extensions = nil
			got.Summary = "" //nolint:staticcheck // TestSummary checks it
			if !proto.Equal(got, want) {
				t.Errorf("flow differs:\n got %s\nwant %s", protojson.Format(got), protojson.Format(want))
			}
		})
	}
}

func TestParseErrors(t *testing.T) {
	p := New("n", Sources{})
	_, err := p.Parse(&monitor.Event{Type: 9})
	if !errors.Is(err, ErrUnknownEventType) {
		t.Fatalf("type 9: got %v, want ErrUnknownEventType", err)
	}
	// Without any source, a flow still has its datapath facts and world
	// for unknown ends; a zero timestamp becomes now.
	f, err := p.Parse(&monitor.Event{Type: monitor.TypeDrop, Reason: 133, SrcIP: clientIP, DstIP: webIP, Protocol: 6})
	if err != nil {
		t.Fatal(err)
	}
	if f.GetSource().GetIdentity() != 2 || f.GetDestination().GetLabels()[0] != "reserved:world" || f.GetTime().AsTime().IsZero() {
		t.Errorf("flow without sources: %s", protojson.Format(f))
	}
}

func TestLostEvent(t *testing.T) {
	l := LostEvent(7, t0, t0.Add(time.Second))
	if l.GetSource() != flowpb.LostEventSource_OBSERVER_EVENTS_QUEUE || l.GetNumEventsLost() != 7 ||
		!l.GetFirst().AsTime().Equal(t0) || !l.GetLast().AsTime().Equal(t0.Add(time.Second)) {
		t.Errorf("LostEvent: %v", l)
	}
}

// A flow with its node extension marshals to JSON as Hubble's CLI prints
// it (-o json): the Struct's type resolves from the global registry.
func TestFlowJSON(t *testing.T) {
	p := New("node-1", world().sources())
	f, err := p.Parse(&monitor.Event{Type: monitor.TypeDrop, Reason: 133, Direction: monitor.DirectionEgress, EndpointID: 13,
		SrcIP: clientIP, DstIP: remoteIP, SrcPort: 1, DstPort: 5432, Protocol: 6})
	if err != nil {
		t.Fatal(err)
	}
	b, err := protojson.Marshal(f)
	if err != nil {
		t.Fatalf("marshal: %v", err)
	}
	for _, want := range []string{`"destination_node":"node-2"`, `"source_node":"node-1"`, `"podName":"db-0"`, `"POLICY_DENIED"`} {
		if !strings.Contains(strings.ReplaceAll(string(b), " ", ""), want) {
			t.Errorf("JSON lacks %s: %s", want, b)
		}
	}
}

func TestSummary(t *testing.T) {
	for _, tc := range []struct {
		ev   monitor.Event
		want string
	}{
		{monitor.Event{Protocol: 6, TCPFlags: 0x12}, "TCP Flags: SYN, ACK"},
		{monitor.Event{Protocol: 6}, "TCP"},
		{monitor.Event{Protocol: 17}, "UDP"},
		{monitor.Event{Protocol: 1, ICMPType: 8}, "ICMPv4 EchoRequest"},
		{monitor.Event{Protocol: 1, ICMPType: 13, ICMPCode: 0}, "ICMPv4 type 13 code 0"},
		{monitor.Event{Protocol: 47}, "IPv4"},
	} {
		if got := summary(&tc.ev); got != tc.want {
			t.Errorf("summary(%+v) = %q, want %q", tc.ev, got, tc.want)
		}
	}
}
