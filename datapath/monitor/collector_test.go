package monitor

import (
	"errors"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/cellium/cellium/datapath/maps"
)

type fakeMetrics struct {
	counters map[maps.MetricsKey]maps.MetricsValue
	err      error
}

func (f *fakeMetrics) Read() (map[maps.MetricsKey]maps.MetricsValue, error) { return f.counters, f.err }

// scrape gathers reg into sorted "name{label=value,...} value" lines.
func scrape(t *testing.T, reg *prometheus.Registry) []string {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, l.GetName()+"="+l.GetValue())
			}
			out = append(out, mf.GetName()+"{"+strings.Join(labels, ",")+"} "+
				strconv.FormatFloat(m.GetCounter().GetValue(), 'f', -1, 64))
		}
	}
	sort.Strings(out)
	return out
}

func TestCollector(t *testing.T) {
	src := &fakeMetrics{counters: map[maps.MetricsKey]maps.MetricsValue{
		{Reason: 0, Dir: maps.DirIngress}:   {Packets: 10, Bytes: 1000},
		{Reason: 0, Dir: maps.DirEgress}:    {Packets: 20, Bytes: 2000},
		{Reason: 133, Dir: maps.DirIngress}: {Packets: 3, Bytes: 222},
		{Reason: 181, Dir: maps.DirEgress}:  {Packets: 1, Bytes: 84},
		// Cilium names both 2 and 134 "Invalid packet": one series.
		{Reason: 2, Dir: maps.DirIngress}:   {Packets: 1, Bytes: 10},
		{Reason: 134, Dir: maps.DirIngress}: {Packets: 2, Bytes: 20},
		{Reason: 200, Dir: 0}:               {Packets: 1, Bytes: 1},
	}}
	var current MetricsSource
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(NewCollector(func() MetricsSource { return current }))

	// No map yet: only the error counter.
	if got, want := scrape(t, reg), []string{"cellium_datapath_metrics_read_errors_total{} 0"}; !slices.Equal(got, want) {
		t.Errorf("before the map is open:\n%s", strings.Join(got, "\n"))
	}

	current = src
	want := []string{
		"cellium_datapath_metrics_read_errors_total{} 0",
		"cellium_drop_bytes_total{direction=EGRESS,reason=Policy denied by denylist} 84",
		"cellium_drop_bytes_total{direction=INGRESS,reason=Invalid packet} 30",
		"cellium_drop_bytes_total{direction=INGRESS,reason=Policy denied} 222",
		"cellium_drop_bytes_total{direction=UNKNOWN,reason=200} 1",
		"cellium_drop_count_total{direction=EGRESS,reason=Policy denied by denylist} 1",
		"cellium_drop_count_total{direction=INGRESS,reason=Invalid packet} 3",
		"cellium_drop_count_total{direction=INGRESS,reason=Policy denied} 3",
		"cellium_drop_count_total{direction=UNKNOWN,reason=200} 1",
		"cellium_forward_bytes_total{direction=EGRESS} 2000",
		"cellium_forward_bytes_total{direction=INGRESS} 1000",
		"cellium_forward_count_total{direction=EGRESS} 20",
		"cellium_forward_count_total{direction=INGRESS} 10",
	}
	if got := scrape(t, reg); !slices.Equal(got, want) {
		t.Errorf("scrape:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}

	// Counters are read at each scrape.
	src.counters[maps.MetricsKey{Reason: 133, Dir: maps.DirIngress}] = maps.MetricsValue{Packets: 4, Bytes: 296}
	if got := scrape(t, reg); !slices.Contains(got, "cellium_drop_count_total{direction=INGRESS,reason=Policy denied} 4") {
		t.Errorf("second scrape did not read the map again:\n%s", strings.Join(got, "\n"))
	}

	src.err = errors.New("map gone")
	if got, want := scrape(t, reg), []string{"cellium_datapath_metrics_read_errors_total{} 1"}; !slices.Equal(got, want) {
		t.Errorf("failing read:\n%s", strings.Join(got, "\n"))
	}
}
