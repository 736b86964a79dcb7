package bpf_test

import (
	"strings"
	"testing"
	"time"

	"github.com/cellium/cellium/datapath/bpf"
)

func TestParseAggregation(t *testing.T) {
	for in, want := range map[string]bpf.Aggregation{
		"none": bpf.AggregationNone, "disabled": bpf.AggregationNone, "0": bpf.AggregationNone,
		"lowest": bpf.AggregationLowest, "low": bpf.AggregationLow, "Medium": bpf.AggregationMedium,
		"3": bpf.AggregationMedium, "max": bpf.AggregationMax, "maximum": bpf.AggregationMax, "4": bpf.AggregationMax,
	} {
		got, err := bpf.ParseAggregation(in)
		if err != nil || got != want {
			t.Errorf("ParseAggregation(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "high", "5", "-1"} {
		if _, err := bpf.ParseAggregation(bad); err == nil || !strings.Contains(err.Error(), "use none, lowest, low, medium, maximum") {
			t.Errorf("ParseAggregation(%q): %v, want an error naming the levels", bad, err)
		}
	}
	if bpf.DefaultAggregation.String() != "medium" {
		t.Errorf("default %s, want medium (Cilium's chart)", bpf.DefaultAggregation)
	}
}

func TestParseReportFlags(t *testing.T) {
	for _, c := range []struct {
		in   []string
		want uint8
	}{
		{[]string{"syn", "fin", "rst"}, bpf.DefaultReportFlags},
		{[]string{"all"}, 0xff},
		{[]string{"ACK", "psh"}, bpf.TCPFlagACK | bpf.TCPFlagPSH},
		{nil, 0},
	} {
		got, err := bpf.ParseReportFlags(c.in)
		if err != nil || got != c.want {
			t.Errorf("ParseReportFlags(%q) = %#x, %v; want %#x", c.in, got, err, c.want)
		}
	}
	if _, err := bpf.ParseReportFlags([]string{"syn", "bogus"}); err == nil || !strings.Contains(err.Error(), `"bogus"`) {
		t.Errorf("bogus flag: %v", err)
	}
}

// TestAggregationConstants: Apply writes the level, the interval in whole
// seconds and the flags, with Cilium's defaults for zero values.
func TestAggregationConstants(t *testing.T) {
	for _, c := range []struct {
		consts       bpf.EndpointConstants
		agg, flags   uint8
		intervalSecs uint32
	}{
		{bpf.EndpointConstants{}, 0, bpf.DefaultReportFlags, 5},
		{bpf.EndpointConstants{Aggregation: bpf.AggregationMedium, ReportInterval: 1500 * time.Millisecond, ReportFlags: 0xff}, 3, 0xff, 1},
		{bpf.EndpointConstants{ReportInterval: time.Millisecond}, 0, bpf.DefaultReportFlags, 1},
	} {
		spec, err := bpf.LoadLxc()
		if err != nil {
			t.Fatal(err)
		}
		if err := c.consts.Apply(spec); err != nil {
			t.Fatal(err)
		}
		var agg, flags uint8
		var secs uint32
		get := func(name string, v any) {
			if err := spec.Variables[name].Get(v); err != nil {
				t.Fatalf("%s: %v", name, err)
			}
		}
		get(bpf.LxcVarMONITOR_AGGREGATION, &agg)
		get(bpf.LxcVarMONITOR_REPORT_FLAGS, &flags)
		get(bpf.LxcVarMONITOR_REPORT_INTERVAL, &secs)
		if agg != c.agg || flags != c.flags || secs != c.intervalSecs {
			t.Errorf("%+v: level %d, flags %#x, interval %d s; want %d, %#x, %d", c.consts, agg, flags, secs, c.agg, c.flags, c.intervalSecs)
		}
	}
}
