package maps

import (
	"fmt"

	"github.com/cilium/ebpf"

	"github.com/cellium/cellium/datapath/bpf"
)

// TrafficDir is the direction of metrics and events, seen from the
// endpoint: Cilium's METRIC_INGRESS and METRIC_EGRESS.
type TrafficDir uint8

// The two traffic directions.
const (
	DirIngress TrafficDir = 1
	DirEgress  TrafficDir = 2
)

// String returns "ingress", "egress" or "unknown".
func (d TrafficDir) String() string {
	switch d {
	case DirIngress:
		return "ingress"
	case DirEgress:
		return "egress"
	}
	return "unknown"
}

// MetricsKey is one counter: a reason (ReasonForwarded or a drop reason)
// in a direction.
type MetricsKey struct {
	Reason uint8
	Dir    TrafficDir
}

// MetricsValue is a counter summed over CPUs.
type MetricsValue struct {
	Packets uint64
	Bytes   uint64
}

// Metrics is cellium_metrics: per-CPU packet and byte counters.
type Metrics struct{ m *ebpf.Map }

// Map returns the underlying map.
func (m *Metrics) Map() *ebpf.Map { return m.m }

// Read returns every counter, summed over CPUs.
func (m *Metrics) Read() (map[MetricsKey]MetricsValue, error) {
	out := map[MetricsKey]MetricsValue{}
	var k bpf.LxcMetricsKey
	var per []bpf.LxcMetricsValue
	it := m.m.Iterate()
	for it.Next(&k, &per) {
		out[MetricsKey{Reason: k.Reason, Dir: TrafficDir(k.Dir)}] = sum(per)
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("read metrics: %w", err)
	}
	return out, nil
}

// Get returns one counter summed over CPUs; a counter never hit is zero.
func (m *Metrics) Get(k MetricsKey) (MetricsValue, error) {
	bk := bpf.LxcMetricsKey{Reason: k.Reason, Dir: uint8(k.Dir)}
	var per []bpf.LxcMetricsValue
	if err := m.m.Lookup(&bk, &per); err != nil {
		if isNotExist(err) {
			return MetricsValue{}, nil
		}
		return MetricsValue{}, fmt.Errorf("read metric %d/%s: %w", k.Reason, k.Dir, err)
	}
	return sum(per), nil
}

func sum(per []bpf.LxcMetricsValue) MetricsValue {
	var v MetricsValue
	for _, p := range per {
		v.Packets += p.Packets
		v.Bytes += p.Bytes
	}
	return v
}
