package datapathmonitor

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/pflag"

	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/cells/hive/hivetest"
	"github.com/cellium/cellium/cells/metrics"
	cellmonitor "github.com/cellium/cellium/cells/monitor"
)

// loaderConfig stands in for daemon/bpfloader's configuration: the same
// flags behind the same feature switch.
type loaderConfig struct{ BPFRoot string }

func (def loaderConfig) Flags(fs *pflag.FlagSet) {
	fs.String(BPFRootFlag, def.BPFRoot, "where bpffs is mounted")
}

var fakeLoader = hive.Module("fake-loader", "Stands in for the flags of the loader",
	hive.Feature(EnableFlag, true, "load the programs", hive.Config(loaderConfig{BPFRoot: DefaultBPFRoot})))

func TestLoaderFlags(t *testing.T) {
	for _, tc := range []struct {
		name   string
		args   []string
		loader bool
		dir    string
		on     bool
	}{
		{name: "no loader in the agent"},
		{name: "defaults", loader: true, dir: "/sys/fs/bpf/cellium", on: true},
		{name: "other root", args: []string{"--bpf-root=/run/bpf"}, loader: true, dir: "/run/bpf/cellium", on: true},
		{name: "off", args: []string{"--enable-bpf-datapath=false"}, loader: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var flags hive.FlagValues
			cells := []hive.Cell{hivetest.Capture(&flags)}
			if tc.loader {
				cells = append(cells, fakeLoader)
			}
			h := hivetest.New(t, tc.args, cells...)
			if err := h.Populate(); err != nil {
				t.Fatal(err)
			}
			if dir, on := LoaderFlags(flags); dir != tc.dir || on != tc.on {
				t.Errorf("LoaderFlags = %q, %v; want %q, %v", dir, on, tc.dir, tc.on)
			}
		})
	}
}

// TestOffDoesNothing: without the loader the cell adds no job and no
// collector.
func TestOffDoesNothing(t *testing.T) {
	var reg *prometheus.Registry
	var health hive.HealthReporter
	hivetest.Start(t, nil, metrics.Cell, cellmonitor.Cell, Cell, hivetest.Capture(&reg), hivetest.Capture(&health))
	for _, s := range health.Statuses() {
		if s.Module == "datapath-monitor" {
			t.Errorf("the cell reports %+v with the datapath off", s)
		}
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if strings.HasPrefix(mf.GetName(), "cellium_d") || strings.HasPrefix(mf.GetName(), "cellium_forward") {
			t.Errorf("metric %s registered with the datapath off", mf.GetName())
		}
	}
}

// TestWaitsForTheMaps: with the datapath on and no maps pinned yet (no
// endpoint programs loaded), the job says what it waits for and the hive
// stops cleanly.
func TestWaitsForTheMaps(t *testing.T) {
	root := t.TempDir()
	var health hive.HealthReporter
	var reg *prometheus.Registry
	hivetest.Start(t, []string{"--bpf-root=" + root}, fakeLoader, metrics.Cell, cellmonitor.Cell, Cell,
		hivetest.Capture(&health), hivetest.Capture(&reg))
	want := "waiting for " + filepath.Join(root, "cellium", "cellium_events")
	deadline := time.Now().Add(30 * time.Second)
	for !hasStatus(health, want) {
		if time.Now().After(deadline) {
			t.Fatalf("no health report %q: %+v", want, health.Statuses())
		}
		time.Sleep(10 * time.Millisecond)
	}
	// The collector is registered and reports no datapath counter yet.
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, mf := range mfs {
		switch mf.GetName() {
		case "cellium_datapath_metrics_read_errors_total":
			found = true
		case "cellium_drop_count_total", "cellium_forward_count_total":
			t.Errorf("%s reported before the map is open", mf.GetName())
		}
	}
	if !found {
		t.Error("the datapath collector is not registered")
	}
}

func hasStatus(h hive.HealthReporter, prefix string) bool {
	for _, s := range h.Statuses() {
		if s.Module == "datapath-monitor" && strings.HasPrefix(s.Message, prefix) {
			return true
		}
	}
	return false
}
