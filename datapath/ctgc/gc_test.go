package ctgc

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/cellium/cellium/datapath/maps"
)

// fakeCT is an in-memory conntrack map. beforeLookup, when set, runs
// before each Lookup (a packet refreshing an entry meanwhile).
type fakeCT struct {
	m            map[maps.CTKey]maps.CTEntry
	beforeLookup func(maps.CTKey)
	failDelete   bool
}

func (f *fakeCT) Iterate(yield func(maps.CTKey, maps.CTEntry) bool) error {
	for k, v := range f.m {
		if !yield(k, v) {
			return nil
		}
	}
	return nil
}

func (f *fakeCT) Lookup(k maps.CTKey) (maps.CTEntry, error) {
	if f.beforeLookup != nil {
		f.beforeLookup(k)
	}
	v, ok := f.m[k]
	if !ok {
		return v, fmt.Errorf("look up conntrack: %w", ebpf.ErrKeyNotExist)
	}
	return v, nil
}

func (f *fakeCT) Delete(k maps.CTKey) error {
	if f.failDelete {
		return errors.New("injected failure")
	}
	delete(f.m, k)
	return nil
}

func ctKey(i int) maps.CTKey {
	return maps.CTKey{Src: netip.AddrFrom4([4]byte{10, 0, byte(i >> 8), byte(i)}), Dst: netip.MustParseAddr("10.1.0.1"),
		SrcPort: uint16(40000 + i), DstPort: 80, Proto: 6}
}

const now = uint64(1_000_000_000_000)

func clock() (uint64, error) { return now, nil }

// A pass deletes the entries whose deadline is not after now, keeps the
// others and one refreshed between the listing and the deletion, and
// records the counts, the pass and the map's fill ratio.
func TestRun(t *testing.T) {
	ct := &fakeCT{m: map[maps.CTKey]maps.CTEntry{}}
	for i := range 10 {
		ct.m[ctKey(i)] = maps.CTEntry{Expires: now + 1} // alive
	}
	for i := 10; i < 16; i++ {
		ct.m[ctKey(i)] = maps.CTEntry{Expires: now - uint64(i)} // expired
	}
	ct.m[ctKey(16)] = maps.CTEntry{Expires: now} // expires now: dead to the programs
	refreshed, vanished := ctKey(10), ctKey(11)
	ct.beforeLookup = func(k maps.CTKey) {
		switch k {
		case refreshed:
			ct.m[k] = maps.CTEntry{Expires: now + 60e9}
		case vanished:
			delete(ct.m, k)
		}
	}
	reg := prometheus.NewPedanticRegistry()
	m, err := NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	res, err := New(ct, maps.CT4MapName, 100, clock, m).Run(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if res.Alive != 11 || res.Deleted != 5 || len(ct.m) != 11 {
		t.Errorf("result %+v with %d entries left, want 11 alive, 5 deleted", res, len(ct.m))
	}
	if _, ok := ct.m[refreshed]; !ok {
		t.Error("the entry refreshed during the pass was deleted")
	}
	for k, v := range ct.m {
		if v.Expires <= now {
			t.Errorf("expired entry %v left", k)
		}
	}
	got := gather(t, reg)
	for series, v := range map[string]float64{
		`cellium_datapath_conntrack_gc_entries{family="ipv4",status="alive"}`:              11,
		`cellium_datapath_conntrack_gc_entries{family="ipv4",status="deleted"}`:            5,
		`cellium_datapath_conntrack_gc_runs_total{family="ipv4",status="completed"}`:       1,
		`cellium_bpf_map_pressure{map_name="cellium_ct4"}`:                                 0.11,
		`cellium_datapath_conntrack_gc_duration_seconds{family="ipv4",status="completed"}`: 1, // samples
	} {
		if got[series] != v {
			t.Errorf("%s = %v, want %v (all: %v)", series, got[series], v, got)
		}
	}
}

// A failed pass counts as uncompleted and leaves the last counts alone.
func TestRunFails(t *testing.T) {
	ct := &fakeCT{m: map[maps.CTKey]maps.CTEntry{ctKey(1): {Expires: 1}}, failDelete: true}
	reg := prometheus.NewPedanticRegistry()
	m, err := NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := New(ct, maps.CT4MapName, 100, clock, m).Run(context.Background()); err == nil {
		t.Fatal("a failing delete passed")
	}
	got := gather(t, reg)
	if v := got[`cellium_datapath_conntrack_gc_runs_total{family="ipv4",status="uncompleted"}`]; v != 1 {
		t.Errorf("uncompleted runs %v, want 1 (all: %v)", v, got)
	}
	for series := range got {
		if strings.HasPrefix(series, "cellium_datapath_conntrack_gc_entries") {
			t.Errorf("%s after a failed pass, want none", series)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	ct.failDelete = false
	if _, err := New(ct, maps.CT4MapName, 100, clock, nil).Run(ctx); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled pass: %v", err)
	}
}

func TestConfig(t *testing.T) {
	if got := DefaultConfig.EffectiveInterval(); got != DefaultInterval {
		t.Errorf("default interval %v", got)
	}
	if err := (Config{Interval: -1}).Validate(); err == nil || !strings.Contains(err.Error(), FlagInterval) {
		t.Errorf("negative interval: %v", err)
	}
}

// gather returns every series of reg as `name{label="value",...}` (labels
// in their order): the value of a counter or gauge, the sample count of a
// histogram.
func gather(t *testing.T, reg prometheus.Gatherer) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
			}
			name := mf.GetName() + "{" + strings.Join(labels, ",") + "}"
			switch {
			case m.GetCounter() != nil:
				out[name] = m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				out[name] = m.GetGauge().GetValue()
			case m.GetHistogram() != nil:
				out[name] = float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return out
}
