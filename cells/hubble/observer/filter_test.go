package observer

import (
	"strings"
	"testing"

	flowpb "github.com/cilium/cilium/api/v1/flow"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

var (
	web = &flowpb.Endpoint{ID: 101, Identity: 12345, Namespace: "demo", PodName: "web-1",
		Labels:    []string{"k8s:app=web", "k8s:io.kubernetes.pod.namespace=demo", "k8s:io.cilium.k8s.policy.cluster=default"},
		Workloads: []*flowpb.Workload{{Kind: "Deployment", Name: "web"}}}
	db = &flowpb.Endpoint{ID: 102, Identity: 23456, Namespace: "demo", PodName: "db-0",
		Labels: []string{"k8s:app=db", "k8s:io.kubernetes.pod.namespace=demo"}}
	tcpSYN = &flowpb.Flow{
		Verdict: flowpb.Verdict_FORWARDED, NodeName: "node-1",
		IP:     &flowpb.IP{Source: "10.0.1.5", Destination: "10.0.1.9", IpVersion: flowpb.IPVersion_IPv4},
		L4:     &flowpb.Layer4{Protocol: &flowpb.Layer4_TCP{TCP: &flowpb.TCP{SourcePort: 40000, DestinationPort: 5432, Flags: &flowpb.TCPFlags{SYN: true}}}},
		Source: web, Destination: db,
		EventType:          &flowpb.CiliumEventType{Type: 5},
		TrafficDirection:   flowpb.TrafficDirection_INGRESS,
		IsReply:            wrapperspb.Bool(false),
		DestinationService: &flowpb.Service{Name: "db", Namespace: "demo"},
	}
	udpDrop = &flowpb.Flow{
		Verdict: flowpb.Verdict_DROPPED, DropReasonDesc: flowpb.DropReason_POLICY_DENIED, NodeName: "prod/node-2",
		IP:     &flowpb.IP{Source: "10.0.2.7", Destination: "10.0.1.5", IpVersion: flowpb.IPVersion_IPv4},
		L4:     &flowpb.Layer4{Protocol: &flowpb.Layer4_UDP{UDP: &flowpb.UDP{SourcePort: 5353, DestinationPort: 53}}},
		Source: db, Destination: web,
		EventType:        &flowpb.CiliumEventType{Type: 1, SubType: 133},
		TrafficDirection: flowpb.TrafficDirection_EGRESS,
	}
)

func TestFilters(t *testing.T) {
	for _, tc := range []struct {
		name         string
		ff           *flowpb.FlowFilter
		syn, udpdrop bool
	}{
		{"empty filter matches all", &flowpb.FlowFilter{}, true, true},
		{"source ip", &flowpb.FlowFilter{SourceIp: []string{"10.0.1.5"}}, true, false},
		{"destination cidr", &flowpb.FlowFilter{DestinationIp: []string{"10.0.1.0/24"}}, true, true},
		{"pod ns/name", &flowpb.FlowFilter{SourcePod: []string{"demo/web-1"}}, true, false},
		{"pod prefix", &flowpb.FlowFilter{DestinationPod: []string{"demo/we"}}, false, true},
		{"namespace", &flowpb.FlowFilter{SourcePod: []string{"demo/"}}, true, true},
		{"pod without namespace is in default", &flowpb.FlowFilter{SourcePod: []string{"web-1"}}, false, false},
		{"label any source", &flowpb.FlowFilter{SourceLabel: []string{"app=web"}}, true, false},
		{"label k8s source", &flowpb.FlowFilter{SourceLabel: []string{"k8s:app in (db, x)"}}, false, true},
		{"label other source", &flowpb.FlowFilter{SourceLabel: []string{"reserved:app=web"}}, false, false},
		{"label negation", &flowpb.FlowFilter{SourceLabel: []string{"!app"}}, false, false},
		{"label namespace key", &flowpb.FlowFilter{DestinationLabel: []string{"k8s:io.kubernetes.pod.namespace=demo,app=web"}}, false, true},
		{"verdict", &flowpb.FlowFilter{Verdict: []flowpb.Verdict{flowpb.Verdict_DROPPED}}, false, true},
		{"drop reason", &flowpb.FlowFilter{DropReasonDesc: []flowpb.DropReason{flowpb.DropReason_POLICY_DENIED}}, false, true},
		{"event type drop", &flowpb.FlowFilter{EventType: []*flowpb.EventTypeFilter{{Type: 1}}}, false, true},
		{"event type and subtype", &flowpb.FlowFilter{EventType: []*flowpb.EventTypeFilter{{Type: 1, SubType: 130, MatchSubType: true}}}, false, false},
		{"event type policy verdict", &flowpb.FlowFilter{EventType: []*flowpb.EventTypeFilter{{Type: 5}}}, true, false},
		{"protocol", &flowpb.FlowFilter{Protocol: []string{"TCP"}}, true, false},
		{"protocols", &flowpb.FlowFilter{Protocol: []string{"udp", "icmp"}}, false, true},
		{"destination port", &flowpb.FlowFilter{DestinationPort: []string{"53"}}, false, true},
		{"source port", &flowpb.FlowFilter{SourcePort: []string{"40000"}}, true, false},
		{"tcp flags", &flowpb.FlowFilter{TcpFlags: []*flowpb.TCPFlags{{SYN: true}}}, true, false},
		{"tcp flags all needed", &flowpb.FlowFilter{TcpFlags: []*flowpb.TCPFlags{{SYN: true, ACK: true}}}, false, false},
		{"node name", &flowpb.FlowFilter{NodeName: []string{"node-1"}}, true, false},
		{"node name glob with cluster", &flowpb.FlowFilter{NodeName: []string{"prod/node-*"}}, false, true},
		{"node name any cluster", &flowpb.FlowFilter{NodeName: []string{"node-*"}}, true, true},
		{"traffic direction", &flowpb.FlowFilter{TrafficDirection: []flowpb.TrafficDirection{flowpb.TrafficDirection_EGRESS}}, false, true},
		{"reply false; a drop counts as a request", &flowpb.FlowFilter{Reply: []bool{false}}, true, true},
		{"reply true", &flowpb.FlowFilter{Reply: []bool{true}}, false, false},
		{"identity", &flowpb.FlowFilter{SourceIdentity: []uint32{23456}}, false, true},
		{"workload", &flowpb.FlowFilter{SourceWorkload: []*flowpb.Workload{{Name: "web"}}}, true, false},
		{"service", &flowpb.FlowFilter{DestinationService: []string{"demo/db"}}, true, false},
		{"ip version", &flowpb.FlowFilter{IpVersion: []flowpb.IPVersion{flowpb.IPVersion_IPv6}}, false, false},
		{"fields AND", &flowpb.FlowFilter{SourcePod: []string{"demo/"}, Verdict: []flowpb.Verdict{flowpb.Verdict_FORWARDED}}, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fl, err := compileFilters([]*flowpb.FlowFilter{tc.ff})
			if err != nil {
				t.Fatal(err)
			}
			if got := fl.any(tcpSYN); got != tc.syn {
				t.Errorf("tcp syn flow: %v, want %v", got, tc.syn)
			}
			if got := fl.any(udpDrop); got != tc.udpdrop {
				t.Errorf("udp drop flow: %v, want %v", got, tc.udpdrop)
			}
		})
	}
}

func TestWhitelistBlacklist(t *testing.T) {
	white, _ := compileFilters([]*flowpb.FlowFilter{{SourcePod: []string{"demo/web"}}, {SourcePod: []string{"demo/db"}}})
	black, _ := compileFilters([]*flowpb.FlowFilter{{Verdict: []flowpb.Verdict{flowpb.Verdict_DROPPED}}})
	if !accepts(white, black, tcpSYN) || accepts(white, black, udpDrop) || !accepts(white, nil, udpDrop) || !accepts(nil, nil, udpDrop) {
		t.Fatal("whitelist OR, blacklist NOT")
	}
}

func TestFilterErrors(t *testing.T) {
	for _, tc := range []struct {
		ff   *flowpb.FlowFilter
		code codes.Code
		want string
	}{
		{&flowpb.FlowFilter{SourceFqdn: []string{"*.cilium.io"}}, codes.Unimplemented, "source_fqdn"},
		{&flowpb.FlowFilter{HttpStatusCode: []string{"200"}}, codes.Unimplemented, "http_status_code"},
		{&flowpb.FlowFilter{Experimental: &flowpb.FlowFilter_Experimental{CelExpression: []string{"true"}}}, codes.Unimplemented, "experimental"},
		{&flowpb.FlowFilter{SourceIp: []string{"10.0.0.300"}}, codes.InvalidArgument, `invalid source_ip filter: "10.0.0.300" is not an IP address`},
		{&flowpb.FlowFilter{DestinationPort: []string{"http"}}, codes.InvalidArgument, `destination port "http" is not a port number`},
		{&flowpb.FlowFilter{Protocol: []string{"quic"}}, codes.InvalidArgument, `unknown protocol "quic"`},
		{&flowpb.FlowFilter{SourceLabel: []string{"app in (a"}}, codes.InvalidArgument, "invalid source_label filter"},
		{&flowpb.FlowFilter{SourcePod: []string{""}}, codes.InvalidArgument, "must not be empty"},
		{&flowpb.FlowFilter{NodeName: []string{"a/b/c"}}, codes.InvalidArgument, "more than one /"},
	} {
		_, err := compileFilters([]*flowpb.FlowFilter{tc.ff})
		if status.Code(err) != tc.code || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: got %v, want %s containing %q", tc.ff, err, tc.code, tc.want)
		}
	}
	if u := Unimplemented(); len(u) == 0 || strings.Contains(strings.Join(u, ","), "source_pod") {
		t.Errorf("Unimplemented() = %v", u)
	}
}
