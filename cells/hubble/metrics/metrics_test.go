package metrics_test

import (
	"strings"
	"testing"

	flowpb "github.com/cilium/cilium/api/v1/flow"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/goleak"

	"github.com/cellium/cellium/cells/hubble/metrics"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// newMetrics enables list and counts one conversation.
func newMetrics(t testing.TB, list string) *metrics.Metrics {
	t.Helper()
	specs, err := metrics.ParseSpecs(list)
	if err != nil {
		t.Fatal(err)
	}
	m, err := metrics.New(specs)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func feed(m *metrics.Metrics, flows []*flowpb.Flow) {
	for _, f := range flows {
		m.OnFlow(f)
	}
}

// Each metric, with and without contexts, after one conversation: the
// names, labels and counts Hubble gives the same flows.
func TestMetricsCountConversation(t *testing.T) {
	for _, tc := range []struct {
		name, list, metric, want string
	}{
		{"flow", "flow", "hubble_flows_processed_total", `
# HELP hubble_flows_processed_total Total number of flows processed
# TYPE hubble_flows_processed_total counter
hubble_flows_processed_total{protocol="ICMPv4",subtype="from-endpoint",type="Trace",verdict="FORWARDED"} 1
hubble_flows_processed_total{protocol="TCP",subtype="",type="Drop",verdict="DROPPED"} 1
hubble_flows_processed_total{protocol="TCP",subtype="",type="PolicyVerdict",verdict="DROPPED"} 1
hubble_flows_processed_total{protocol="TCP",subtype="",type="PolicyVerdict",verdict="FORWARDED"} 2
hubble_flows_processed_total{protocol="TCP",subtype="from-endpoint",type="Trace",verdict="FORWARDED"} 2
hubble_flows_processed_total{protocol="TCP",subtype="to-endpoint",type="Trace",verdict="FORWARDED"} 2
hubble_flows_processed_total{protocol="UDP",subtype="from-endpoint",type="Trace",verdict="FORWARDED"} 1
`},
		{"flow labelsContext", "flow:labelsContext=source_namespace,destination_app,traffic_direction", "hubble_flows_processed_total", `
# HELP hubble_flows_processed_total Total number of flows processed
# TYPE hubble_flows_processed_total counter
hubble_flows_processed_total{destination_app="",protocol="ICMPv4",source_namespace="demo",subtype="from-endpoint",traffic_direction="egress",type="Trace",verdict="FORWARDED"} 1
hubble_flows_processed_total{destination_app="client",protocol="TCP",source_namespace="demo",subtype="from-endpoint",traffic_direction="ingress",type="Trace",verdict="FORWARDED"} 2
hubble_flows_processed_total{destination_app="kube-dns",protocol="UDP",source_namespace="demo",subtype="from-endpoint",traffic_direction="egress",type="Trace",verdict="FORWARDED"} 1
hubble_flows_processed_total{destination_app="web",protocol="TCP",source_namespace="",subtype="",traffic_direction="ingress",type="PolicyVerdict",verdict="FORWARDED"} 1
hubble_flows_processed_total{destination_app="web",protocol="TCP",source_namespace="demo",subtype="",traffic_direction="ingress",type="Drop",verdict="DROPPED"} 1
hubble_flows_processed_total{destination_app="web",protocol="TCP",source_namespace="demo",subtype="",traffic_direction="ingress",type="PolicyVerdict",verdict="DROPPED"} 1
hubble_flows_processed_total{destination_app="web",protocol="TCP",source_namespace="demo",subtype="",traffic_direction="ingress",type="PolicyVerdict",verdict="FORWARDED"} 1
hubble_flows_processed_total{destination_app="web",protocol="TCP",source_namespace="demo",subtype="to-endpoint",traffic_direction="ingress",type="Trace",verdict="FORWARDED"} 2
`},
		// The policy verdict and the drop of the denied packet both count.
		{"drop", "drop", "hubble_drop_total", `
# HELP hubble_drop_total Number of drops
# TYPE hubble_drop_total counter
hubble_drop_total{protocol="TCP",reason="POLICY_DENIED"} 2
`},
		{"drop contexts", "drop:sourceContext=identity;destinationContext=dns|ip", "hubble_drop_total", `
# HELP hubble_drop_total Number of drops
# TYPE hubble_drop_total counter
hubble_drop_total{destination="10.0.1.20",protocol="TCP",reason="POLICY_DENIED",source="k8s:app=client,k8s:io.kubernetes.pod.namespace=demo"} 2
`},
		// The verdict of the node's own probe is not counted.
		{"policy", "policy", "hubble_policy_verdicts_total", `
# HELP hubble_policy_verdicts_total Total number of Cilium network policy verdicts
# TYPE hubble_policy_verdicts_total counter
hubble_policy_verdicts_total{action="dropped",direction="ingress",match="none"} 1
hubble_policy_verdicts_total{action="forwarded",direction="ingress",match="l3-l4"} 1
`},
		{"policy contexts", "policy:sourceContext=pod;destinationContext=workload|pod", "hubble_policy_verdicts_total", `
# HELP hubble_policy_verdicts_total Total number of Cilium network policy verdicts
# TYPE hubble_policy_verdicts_total counter
hubble_policy_verdicts_total{action="dropped",destination="demo/web",direction="ingress",match="none",source="demo/client-7d9f"} 1
hubble_policy_verdicts_total{action="forwarded",destination="demo/web",direction="ingress",match="l3-l4",source="demo/client-7d9f"} 1
`},
		// Forwarded flows only: the denied SYN is not counted.
		{"tcp", "tcp", "hubble_tcp_flags_total", `
# HELP hubble_tcp_flags_total TCP flag occurrences
# TYPE hubble_tcp_flags_total counter
hubble_tcp_flags_total{family="IPv4",flag="FIN"} 1
hubble_tcp_flags_total{family="IPv4",flag="RST"} 1
hubble_tcp_flags_total{family="IPv4",flag="SYN"} 3
hubble_tcp_flags_total{family="IPv4",flag="SYN-ACK"} 1
`},
		{"tcp contexts", "tcp:sourceContext=workload-name;destinationContext=pod-name", "hubble_tcp_flags_total", `
# HELP hubble_tcp_flags_total TCP flag occurrences
# TYPE hubble_tcp_flags_total counter
hubble_tcp_flags_total{destination="client-7d9f",family="IPv4",flag="RST",source="web"} 1
hubble_tcp_flags_total{destination="client-7d9f",family="IPv4",flag="SYN-ACK",source="web"} 1
hubble_tcp_flags_total{destination="web-1",family="IPv4",flag="FIN",source="client"} 1
hubble_tcp_flags_total{destination="web-1",family="IPv4",flag="SYN",source=""} 1
hubble_tcp_flags_total{destination="web-1",family="IPv4",flag="SYN",source="client"} 2
`},
		// Requests only: replies say nothing of the service's port.
		{"port-distribution", "port-distribution", "hubble_port_distribution_total", `
# HELP hubble_port_distribution_total Numbers of packets distributed by destination port
# TYPE hubble_port_distribution_total counter
hubble_port_distribution_total{port="0",protocol="ICMPv4"} 1
hubble_port_distribution_total{port="53",protocol="UDP"} 1
hubble_port_distribution_total{port="80",protocol="TCP"} 4
`},
		// Ingress names the source by namespace, egress by pod.
		{"port-distribution direction contexts", "port-distribution:sourceIngressContext=namespace;sourceEgressContext=pod;destinationContext=app|reserved-identity",
			"hubble_port_distribution_total", `
# HELP hubble_port_distribution_total Numbers of packets distributed by destination port
# TYPE hubble_port_distribution_total counter
hubble_port_distribution_total{destination="kube-dns",port="53",protocol="UDP",source="demo/client-7d9f"} 1
hubble_port_distribution_total{destination="reserved:world",port="0",protocol="ICMPv4",source="demo/client-7d9f"} 1
hubble_port_distribution_total{destination="web",port="80",protocol="TCP",source=""} 1
hubble_port_distribution_total{destination="web",port="80",protocol="TCP",source="demo"} 3
`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := newMetrics(t, tc.list)
			feed(m, conversation)
			if err := testutil.GatherAndCompare(m.Registry(), strings.NewReader(tc.want), tc.metric); err != nil {
				t.Error(err)
			}
		})
	}
}

// A metric not in the list is not registered, and hubble_lost_events_total
// always is.
func TestOnlyEnabledMetricsAndLostEvents(t *testing.T) {
	m := newMetrics(t, "drop")
	feed(m, conversation)
	m.OnLost(&flowpb.LostEvent{Source: flowpb.LostEventSource_PERF_EVENT_RING_BUFFER, NumEventsLost: 7})
	m.OnLost(&flowpb.LostEvent{Source: flowpb.LostEventSource_OBSERVER_EVENTS_QUEUE, NumEventsLost: 2})
	m.OnLost(&flowpb.LostEvent{Source: flowpb.LostEventSource_PERF_EVENT_RING_BUFFER, NumEventsLost: 1})
	want := `
# HELP hubble_lost_events_total Number of lost events
# TYPE hubble_lost_events_total counter
hubble_lost_events_total{source="hubble_ring_buffer"} 0
hubble_lost_events_total{source="observer_events_queue"} 2
hubble_lost_events_total{source="perf_event_ring_buffer"} 8
hubble_lost_events_total{source="unknown_lost_event_source"} 0
`
	if err := testutil.GatherAndCompare(m.Registry(), strings.NewReader(want), "hubble_lost_events_total"); err != nil {
		t.Error(err)
	}
	mfs, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		switch mf.GetName() {
		case "hubble_drop_total", "hubble_lost_events_total":
		default:
			t.Errorf("%s is registered; only drop was enabled", mf.GetName())
		}
	}
}

// Counting a flow allocates nothing once its series exist, even with the
// pod and workload contexts, whose "namespace/name" values are interned.
func TestOnFlowDoesNotAllocate(t *testing.T) {
	m := newMetrics(t, "flow:sourceContext=pod;destinationContext=workload drop:sourceContext=namespace;destinationContext=app "+
		"policy:sourceContext=pod;destinationContext=pod tcp port-distribution:labelsContext=source_namespace,destination_pod,traffic_direction")
	feed(m, conversation)
	allocs := testing.AllocsPerRun(100, func() { feed(m, conversation) })
	if allocs != 0 {
		t.Errorf("counting %d flows allocated %.1f times; want 0", len(conversation), allocs)
	}
}

// A label value that is not UTF-8 skips the count; it does not panic the
// agent.
func TestInvalidLabelValueIsSkipped(t *testing.T) {
	m := newMetrics(t, "policy:sourceContext=pod-name")
	bad := &flowpb.Flow{
		Verdict: flowpb.Verdict_FORWARDED, EventType: &flowpb.CiliumEventType{Type: 5},
		Source:           &flowpb.Endpoint{PodName: "bad\xff"},
		TrafficDirection: flowpb.TrafficDirection_EGRESS,
	}
	m.OnFlow(bad)
	m.OnFlow(verdictAllowed)
	if n := testutil.CollectAndCount(m.Registry(), "hubble_policy_verdicts_total"); n != 1 {
		t.Errorf("%d series, want 1 (the valid flow's)", n)
	}
}

func BenchmarkOnFlow(b *testing.B) {
	m := newMetrics(b, "flow:sourceContext=pod;destinationContext=pod drop:sourceContext=pod;destinationContext=pod "+
		"policy:sourceContext=pod;destinationContext=pod tcp port-distribution")
	feed(m, conversation)
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		m.OnFlow(conversation[i%len(conversation)])
	}
}
