package bpf

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/cilium/ebpf"
)

// Aggregation is a monitor aggregation level (MONITOR_AGGREGATION,
// --monitor-aggregation), numbered as Cilium's.
type Aggregation uint8

// The levels. Drops and policy verdicts are never aggregated.
const (
	// AggregationNone traces every passed packet at every observation
	// point.
	AggregationNone Aggregation = 0
	// AggregationLowest traces no packet where it arrives (from-endpoint,
	// from-overlay): one trace per packet and program.
	AggregationLowest Aggregation = 1
	// AggregationLow is AggregationLowest (as in Cilium).
	AggregationLow Aggregation = 2
	// AggregationMedium also traces a packet of a connection only when
	// its conntrack entry has news: its first packet each way, a report
	// TCP flag that direction has not traced, or the report interval
	// since that direction's last trace.
	AggregationMedium Aggregation = 3
	// AggregationMax is AggregationMedium (as in Cilium, for now).
	AggregationMax Aggregation = 4
)

// DefaultAggregation is --monitor-aggregation's default: medium, the
// Cilium Helm chart's bpf.monitorAggregation (Documentation/operations/monitor.md).
const DefaultAggregation = AggregationMedium

// DefaultReportInterval is --monitor-aggregation-interval's default
// (Cilium's).
const DefaultReportInterval = 5 * time.Second

// The TCP flags (the header's flags byte).
const (
	TCPFlagFIN uint8 = 0x01
	TCPFlagSYN uint8 = 0x02
	TCPFlagRST uint8 = 0x04
	TCPFlagPSH uint8 = 0x08
	TCPFlagACK uint8 = 0x10
	TCPFlagURG uint8 = 0x20
	TCPFlagECE uint8 = 0x40
	TCPFlagCWR uint8 = 0x80
)

// DefaultReportFlags are --monitor-aggregation-flags' default: syn, fin,
// rst (Cilium's).
const DefaultReportFlags = TCPFlagSYN | TCPFlagFIN | TCPFlagRST

var aggregationNames = map[string]Aggregation{
	"none": AggregationNone, "disabled": AggregationNone,
	"lowest": AggregationLowest, "low": AggregationLow,
	"medium": AggregationMedium,
	"max":    AggregationMax, "maximum": AggregationMax,
}

// String returns the level's name: none, lowest, low, medium, maximum.
func (a Aggregation) String() string {
	switch a {
	case AggregationNone:
		return "none"
	case AggregationLowest:
		return "lowest"
	case AggregationLow:
		return "low"
	case AggregationMedium:
		return "medium"
	case AggregationMax:
		return "maximum"
	}
	return strconv.Itoa(int(a))
}

// ParseAggregation parses a level as Cilium's --monitor-aggregation
// takes it: none (or disabled), lowest, low, medium, max (or maximum),
// any case, or its number 0 to 4.
//
// Errors: an error naming the valid values.
func ParseAggregation(s string) (Aggregation, error) {
	if a, ok := aggregationNames[strings.ToLower(strings.TrimSpace(s))]; ok {
		return a, nil
	}
	if n, err := strconv.Atoi(s); err == nil && n >= 0 && n <= int(AggregationMax) {
		return Aggregation(n), nil
	}
	return 0, fmt.Errorf("invalid monitor aggregation level %q: use none, lowest, low, medium, maximum or 0 to 4", s)
}

var tcpFlagNames = map[string]uint8{
	"none": 0, "all": 0xff,
	"fin": TCPFlagFIN, "syn": TCPFlagSYN, "rst": TCPFlagRST, "psh": TCPFlagPSH,
	"ack": TCPFlagACK, "urg": TCPFlagURG, "ece": TCPFlagECE, "cwr": TCPFlagCWR,
}

// ParseReportFlags parses --monitor-aggregation-flags: TCP flag names
// (fin, syn, rst, psh, ack, urg, ece, cwr, or all, or none), any case.
//
// Errors: an error naming the flag that is none of them.
func ParseReportFlags(names []string) (uint8, error) {
	var out uint8
	for _, n := range names {
		f, ok := tcpFlagNames[strings.ToLower(strings.TrimSpace(n))]
		if !ok {
			return 0, fmt.Errorf("invalid TCP flag %q in --monitor-aggregation-flags: use fin, syn, rst, psh, ack, urg, ece, cwr, all or none", n)
		}
		out |= f
	}
	return out, nil
}

// reportSeconds is MONITOR_REPORT_INTERVAL for d: whole seconds, at
// least 1; 0 is DefaultReportInterval.
func reportSeconds(d time.Duration) uint32 {
	if d == 0 {
		d = DefaultReportInterval
	}
	s := uint32(d / time.Second)
	if s == 0 {
		s = 1
	}
	return s
}

// reportFlags is MONITOR_REPORT_FLAGS for f: 0 is DefaultReportFlags.
func reportFlags(f uint8) uint8 {
	if f == 0 {
		return DefaultReportFlags
	}
	return f
}

// Monitor is what the agent's monitor flags give the programs: the
// aggregation level, the report interval and the report TCP flags
// (--monitor-aggregation, --monitor-aggregation-interval,
// --monitor-aggregation-flags).
type Monitor struct {
	Aggregation    Aggregation
	ReportInterval time.Duration
	// ReportFlags: 0 is DefaultReportFlags.
	ReportFlags uint8
}

// DefaultMonitor is the flags' defaults.
var DefaultMonitor = Monitor{Aggregation: DefaultAggregation, ReportInterval: DefaultReportInterval, ReportFlags: DefaultReportFlags}

// ApplyOverlay sets the overlay programs' TRACE_ENABLED (trace),
// MONITOR_AGGREGATION and MONITOR_REPORT_FLAGS in spec, a spec of
// LoadOverlay, before it is loaded.
func (m Monitor) ApplyOverlay(spec *ebpf.CollectionSpec, trace bool) error {
	for _, v := range []struct {
		name  string
		value any
	}{
		{OverlayVarTRACE_ENABLED, boolByte(trace)},
		{OverlayVarMONITOR_AGGREGATION, uint8(m.Aggregation)},
		{OverlayVarMONITOR_REPORT_FLAGS, reportFlags(m.ReportFlags)},
	} {
		vs, ok := spec.Variables[v.name]
		if !ok {
			return fmt.Errorf("BPF object has no constant %s", v.name)
		}
		if err := vs.Set(v.value); err != nil {
			return fmt.Errorf("set %s: %w", v.name, err)
		}
	}
	return nil
}

// SetOverlayViaStack sets the overlay programs' DELIVER_VIA_STACK: packets
// for local endpoints go up the host stack (kube-proxy's conntrack reverses
// its DNAT there) instead of straight to the endpoint's policy program.
func SetOverlayViaStack(spec *ebpf.CollectionSpec, viaStack bool) error {
	v, ok := spec.Variables[OverlayVarDELIVER_VIA_STACK]
	if !ok {
		return fmt.Errorf("BPF object has no constant %s", OverlayVarDELIVER_VIA_STACK)
	}
	if err := v.Set(boolByte(viaStack)); err != nil {
		return fmt.Errorf("set %s: %w", OverlayVarDELIVER_VIA_STACK, err)
	}
	return nil
}
