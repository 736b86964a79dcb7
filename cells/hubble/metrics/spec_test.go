package metrics_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/cellium/cellium/cells/hubble/metrics"
)

func TestParseSpecs(t *testing.T) {
	for _, tc := range []struct {
		list  string
		names []string
		// labels are the context label names of each metric.
		labels [][]string
	}{
		{"", nil, nil},
		{"drop tcp flow", []string{"drop", "tcp", "flow"}, [][]string{nil, nil, nil}},
		{"drop,tcp, flow ,port-distribution", []string{"drop", "tcp", "flow", "port-distribution"}, [][]string{nil, nil, nil, nil}},
		{
			"drop,tcp,flow,port-distribution,policy:sourceContext=pod;destinationContext=pod",
			[]string{"drop", "tcp", "flow", "port-distribution", "policy"},
			[][]string{nil, nil, nil, nil, {"source", "destination"}},
		},
		{
			"flow:labelsContext=destination_namespace,source_namespace,traffic_direction,drop:sourceContext=namespace|reserved-identity",
			[]string{"flow", "drop"},
			[][]string{{"source_namespace", "destination_namespace", "traffic_direction"}, {"source"}},
		},
		{
			"policy:sourceEgressContext=pod;destinationIngressContext=workload;labelsContext=source_app",
			[]string{"policy"},
			[][]string{{"source_app", "source", "destination"}},
		},
		{"tcp:DestinationContext=Pod-Name", []string{"tcp"}, [][]string{{"destination"}}},
	} {
		specs, err := metrics.ParseSpecs(tc.list)
		if err != nil {
			t.Errorf("ParseSpecs(%q): %v", tc.list, err)
			continue
		}
		if len(specs) != len(tc.names) {
			t.Errorf("ParseSpecs(%q) = %d metrics, want %v", tc.list, len(specs), tc.names)
			continue
		}
		for i, s := range specs {
			if s.Name != tc.names[i] {
				t.Errorf("ParseSpecs(%q)[%d].Name = %q, want %q", tc.list, i, s.Name, tc.names[i])
			}
			if got := strings.Join(s.Context.LabelNames(), ","); got != strings.Join(tc.labels[i], ",") {
				t.Errorf("ParseSpecs(%q)[%d] labels %q, want %q", tc.list, i, got, strings.Join(tc.labels[i], ","))
			}
		}
	}
}

func TestParseSpecsRefusesBadInput(t *testing.T) {
	for _, tc := range []struct {
		list string
		is   error
		says string
	}{
		{"drp", metrics.ErrUnknownMetric, `unknown hubble metric "drp": the metrics cellium counts are drop, flow, policy, port-distribution, tcp`},
		{"drop dns:query", metrics.ErrUnknownMetric, `"dns": it needs the L7 DNS proxy`},
		{"flow:sourceContxt=pod", metrics.ErrBadOption, `option "sourceContxt" of metric "flow": the options are sourceContext`},
		{"flow:sourceContext=pods", metrics.ErrBadOption, `unknown context "pods": use identity, namespace, pod,`},
		{"flow:sourceContext", metrics.ErrBadOption, `it needs a value (sourceContext=...)`},
		{"flow:sourceContext=|", metrics.ErrBadOption, `no context in "|"`},
		{"flow:sourceContext=pod;sourceContext=ip", metrics.ErrBadOption, `given twice`},
		{"flow:labelsContext=source_namespace,pod", metrics.ErrBadOption, `unknown label "pod": use source_ip`},
		{"drop flow drop", nil, `metric "drop" is listed twice`},
	} {
		_, err := metrics.ParseSpecs(tc.list)
		if err == nil {
			t.Errorf("ParseSpecs(%q) accepted it", tc.list)
			continue
		}
		if tc.is != nil && !errors.Is(err, tc.is) {
			t.Errorf("ParseSpecs(%q) = %v, want %v", tc.list, err, tc.is)
		}
		if !strings.Contains(err.Error(), tc.says) {
			t.Errorf("ParseSpecs(%q) = %q, want it to say %q", tc.list, err, tc.says)
		}
	}
}
