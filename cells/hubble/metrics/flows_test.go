package metrics_test

import (
	flowpb "github.com/cilium/cilium/api/v1/flow"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// Endpoints as the flow producer names them.
var (
	clientEP = &flowpb.Endpoint{
		ID: 101, Identity: 20001, Namespace: "demo", PodName: "client-7d9f",
		Labels:    []string{"k8s:app=client", "k8s:io.kubernetes.pod.namespace=demo"},
		Workloads: []*flowpb.Workload{{Name: "client", Kind: "Deployment"}},
	}
	webEP = &flowpb.Endpoint{
		ID: 102, Identity: 20002, Namespace: "demo", PodName: "web-1",
		Labels:    []string{"k8s:app.kubernetes.io/name=web", "k8s:io.kubernetes.pod.namespace=demo"},
		Workloads: []*flowpb.Workload{{Name: "web", Kind: "StatefulSet"}},
	}
	dnsEP = &flowpb.Endpoint{
		ID: 103, Identity: 20003, Namespace: "kube-system", PodName: "coredns-5d78c",
		Labels:    []string{"k8s:k8s-app=kube-dns", "k8s:io.kubernetes.pod.namespace=kube-system"},
		Workloads: []*flowpb.Workload{{Name: "coredns", Kind: "Deployment"}},
	}
	hostEP  = &flowpb.Endpoint{Identity: 1, Labels: []string{"reserved:host"}}
	worldEP = &flowpb.Endpoint{Identity: 2, Labels: []string{"reserved:world"}}
)

func ip4(src, dst string) *flowpb.IP {
	return &flowpb.IP{Source: src, Destination: dst, IpVersion: flowpb.IPVersion_IPv4}
}

func tcp(sport, dport uint32, flags *flowpb.TCPFlags) *flowpb.Layer4 {
	return &flowpb.Layer4{Protocol: &flowpb.Layer4_TCP{TCP: &flowpb.TCP{SourcePort: sport, DestinationPort: dport, Flags: flags}}}
}

func udp(sport, dport uint32) *flowpb.Layer4 {
	return &flowpb.Layer4{Protocol: &flowpb.Layer4_UDP{UDP: &flowpb.UDP{SourcePort: sport, DestinationPort: dport}}}
}

func icmp4(typ uint32) *flowpb.Layer4 {
	return &flowpb.Layer4{Protocol: &flowpb.Layer4_ICMPv4{ICMPv4: &flowpb.ICMPv4{Type: typ}}}
}

// The flows of a client opening an HTTP connection to web-1 (allowed by
// policy), a DNS lookup, a ping, a connection reset, and a connection to a
// port policy denies.
var (
	// The first packet's policy verdict: allowed by an L3-L4 rule.
	verdictAllowed = &flowpb.Flow{
		Verdict: flowpb.Verdict_FORWARDED, EventType: &flowpb.CiliumEventType{Type: 5},
		IP: ip4("10.0.1.10", "10.0.1.20"), L4: tcp(40000, 80, &flowpb.TCPFlags{SYN: true}),
		Source: clientEP, Destination: webEP, TrafficDirection: flowpb.TrafficDirection_INGRESS,
		PolicyMatchType: 2, IsReply: wrapperspb.Bool(false), Type: flowpb.FlowType_L3_L4,
	}
	// Its trace to the endpoint.
	traceSYN = &flowpb.Flow{
		Verdict: flowpb.Verdict_FORWARDED, EventType: &flowpb.CiliumEventType{Type: 4, SubType: 0},
		IP: ip4("10.0.1.10", "10.0.1.20"), L4: tcp(40000, 80, &flowpb.TCPFlags{SYN: true}),
		Source: clientEP, Destination: webEP, TrafficDirection: flowpb.TrafficDirection_INGRESS,
		IsReply: wrapperspb.Bool(false), TraceObservationPoint: flowpb.TraceObservationPoint_TO_ENDPOINT,
	}
	// The reply, leaving web-1.
	traceSYNACK = &flowpb.Flow{
		Verdict: flowpb.Verdict_FORWARDED, EventType: &flowpb.CiliumEventType{Type: 4, SubType: 5},
		IP: ip4("10.0.1.20", "10.0.1.10"), L4: tcp(80, 40000, &flowpb.TCPFlags{SYN: true, ACK: true}),
		Source: webEP, Destination: clientEP, TrafficDirection: flowpb.TrafficDirection_INGRESS,
		IsReply: wrapperspb.Bool(true), TraceObservationPoint: flowpb.TraceObservationPoint_FROM_ENDPOINT,
	}
	traceFIN = &flowpb.Flow{
		Verdict: flowpb.Verdict_FORWARDED, EventType: &flowpb.CiliumEventType{Type: 4, SubType: 0},
		IP: ip4("10.0.1.10", "10.0.1.20"), L4: tcp(40000, 80, &flowpb.TCPFlags{FIN: true, ACK: true}),
		Source: clientEP, Destination: webEP, TrafficDirection: flowpb.TrafficDirection_INGRESS,
		IsReply: wrapperspb.Bool(false),
	}
	traceRST = &flowpb.Flow{
		Verdict: flowpb.Verdict_FORWARDED, EventType: &flowpb.CiliumEventType{Type: 4, SubType: 5},
		IP: ip4("10.0.1.20", "10.0.1.10"), L4: tcp(80, 40001, &flowpb.TCPFlags{RST: true}),
		Source: webEP, Destination: clientEP, TrafficDirection: flowpb.TrafficDirection_INGRESS,
		IsReply: wrapperspb.Bool(true),
	}
	// A DNS query to CoreDNS, allowed on egress.
	traceDNS = &flowpb.Flow{
		Verdict: flowpb.Verdict_FORWARDED, EventType: &flowpb.CiliumEventType{Type: 4, SubType: 5},
		IP: ip4("10.0.1.10", "10.0.0.53"), L4: udp(53000, 53),
		Source: clientEP, Destination: dnsEP, TrafficDirection: flowpb.TrafficDirection_EGRESS,
		IsReply: wrapperspb.Bool(false),
	}
	// A ping to the world.
	tracePing = &flowpb.Flow{
		Verdict: flowpb.Verdict_FORWARDED, EventType: &flowpb.CiliumEventType{Type: 4, SubType: 5},
		IP: ip4("10.0.1.10", "192.0.2.1"), L4: icmp4(8),
		Source: clientEP, Destination: worldEP, TrafficDirection: flowpb.TrafficDirection_EGRESS,
		IsReply: wrapperspb.Bool(false), DestinationNames: []string{"example.test"},
	}
	// A connection to a port no rule allows: the verdict, then the drop.
	verdictDenied = &flowpb.Flow{
		Verdict: flowpb.Verdict_DROPPED, EventType: &flowpb.CiliumEventType{Type: 5},
		IP: ip4("10.0.1.10", "10.0.1.20"), L4: tcp(40002, 8080, &flowpb.TCPFlags{SYN: true}),
		Source: clientEP, Destination: webEP, TrafficDirection: flowpb.TrafficDirection_INGRESS,
		PolicyMatchType: 0, DropReasonDesc: flowpb.DropReason_POLICY_DENIED, IsReply: wrapperspb.Bool(false),
	}
	dropDenied = &flowpb.Flow{
		Verdict: flowpb.Verdict_DROPPED, EventType: &flowpb.CiliumEventType{Type: 1, SubType: 133},
		IP: ip4("10.0.1.10", "10.0.1.20"), L4: tcp(40002, 8080, &flowpb.TCPFlags{SYN: true}),
		Source: clientEP, Destination: webEP, TrafficDirection: flowpb.TrafficDirection_INGRESS,
		DropReason: 133, DropReasonDesc: flowpb.DropReason_POLICY_DENIED, IsReply: wrapperspb.Bool(false),
	}
	// The node probing web-1: its verdicts are not counted.
	verdictFromHost = &flowpb.Flow{
		Verdict: flowpb.Verdict_FORWARDED, EventType: &flowpb.CiliumEventType{Type: 5},
		IP: ip4("10.0.1.1", "10.0.1.20"), L4: tcp(50000, 80, &flowpb.TCPFlags{SYN: true}),
		Source: hostEP, Destination: webEP, TrafficDirection: flowpb.TrafficDirection_INGRESS,
		PolicyMatchType: 4, IsReply: wrapperspb.Bool(false),
	}
)

// conversation is one round of every flow above.
var conversation = []*flowpb.Flow{
	verdictAllowed, traceSYN, traceSYNACK, traceFIN, traceRST, traceDNS, tracePing,
	verdictDenied, dropDenied, verdictFromHost,
}
