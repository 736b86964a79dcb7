package bpf

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"time"

	"github.com/cilium/ebpf"
)

// EndpointConstants are the load-time constants of one endpoint's
// programs (the `volatile const` globals of bpf/lxc.c).
type EndpointConstants struct {
	// EndpointID is the endpoint ID (ENDPOINT_ID), in events.
	EndpointID uint16
	// Identity is the endpoint's security identity (SECURITY_IDENTITY).
	Identity uint32
	// IfIndex is the host-side veth's ifindex (ENDPOINT_IFINDEX).
	IfIndex uint32
	// MAC is the pod-side MAC (ENDPOINT_MAC); nil for none (then the
	// programs check no source MAC).
	MAC net.HardwareAddr
	// IPv4 is the endpoint's IPv4 address (ENDPOINT_IPV4), the only
	// source address its packets may carry; invalid for none (then every
	// IPv4 packet it sends drops with 132 "Invalid source ip").
	IPv4 netip.Addr
	// AuditMode reports policy denials as audit verdicts and drops
	// nothing for policy (POLICY_AUDIT_MODE).
	AuditMode bool
	// NodePort translates replies of connections the kube-proxy
	// replacement's uplink program sent to the endpoint back
	// (NODEPORT_ENABLED, --kube-proxy-replacement). Only set when true: a
	// spec without the constant is fine while it is off.
	NodePort bool
	// Trace emits trace events of passed packets (TRACE_ENABLED), as
	// many as Aggregation allows.
	Trace bool
	// Aggregation is the monitor aggregation level (MONITOR_AGGREGATION,
	// --monitor-aggregation): AggregationNone traces every passed packet.
	Aggregation Aggregation
	// ReportInterval is how long a connection's direction goes without a
	// trace at AggregationMedium and above (MONITOR_REPORT_INTERVAL,
	// whole seconds; 0 is 5 s, Cilium's default).
	ReportInterval time.Duration
	// ReportFlags are the TCP flags whose first appearance in a
	// direction of a connection is traced at AggregationMedium and above
	// (MONITOR_REPORT_FLAGS; 0 is DefaultReportFlags).
	ReportFlags uint8
}

// Apply sets the constants in spec, a spec from LoadLxc, before it is
// loaded.
func (c EndpointConstants) Apply(spec *ebpf.CollectionSpec) error {
	mac, err := MACConstant(c.MAC)
	if err != nil {
		return err
	}
	ip4, err := IPv4Constant(c.IPv4)
	if err != nil {
		return err
	}
	for _, v := range []struct {
		name  string
		value any
	}{
		{LxcVarENDPOINT_ID, c.EndpointID},
		{LxcVarSECURITY_IDENTITY, c.Identity},
		{LxcVarENDPOINT_IFINDEX, c.IfIndex},
		{LxcVarENDPOINT_MAC, mac},
		{LxcVarENDPOINT_IPV4, ip4},
		{LxcVarPOLICY_AUDIT_MODE, boolByte(c.AuditMode)},
		{LxcVarTRACE_ENABLED, boolByte(c.Trace)},
		{LxcVarMONITOR_AGGREGATION, uint8(c.Aggregation)},
		{LxcVarMONITOR_REPORT_INTERVAL, reportSeconds(c.ReportInterval)},
		{LxcVarMONITOR_REPORT_FLAGS, reportFlags(c.ReportFlags)},
	} {
		vs, ok := spec.Variables[v.name]
		if !ok {
			return fmt.Errorf("BPF object has no constant %s", v.name)
		}
		if err := vs.Set(v.value); err != nil {
			return fmt.Errorf("set %s: %w", v.name, err)
		}
	}
	if c.NodePort {
		vs, ok := spec.Variables[LxcVarNODEPORT_ENABLED]
		if !ok {
			return fmt.Errorf("BPF object has no constant %s", LxcVarNODEPORT_ENABLED)
		}
		if err := vs.Set(uint8(1)); err != nil {
			return fmt.Errorf("set %s: %w", LxcVarNODEPORT_ENABLED, err)
		}
	}
	return nil
}

func boolByte(b bool) uint8 {
	if b {
		return 1
	}
	return 0
}

// MACConstant returns the value of ENDPOINT_MAC for mac: its 6 bytes, in
// order, in the low 48 bits of a little-endian __u64 (0 for nil).
func MACConstant(mac net.HardwareAddr) (uint64, error) {
	if mac == nil {
		return 0, nil
	}
	if len(mac) != 6 {
		return 0, fmt.Errorf("MAC address %v is not 6 bytes long", mac)
	}
	var w [8]byte
	copy(w[:], mac)
	return binary.LittleEndian.Uint64(w[:]), nil
}

// IPv4Constant returns the value of ENDPOINT_IPV4 for addr: its 4 bytes in
// network order as the programs compare them with a __be32 loaded from the
// packet (0 for an invalid addr). An address that is not IPv4 is an error.
func IPv4Constant(addr netip.Addr) (uint32, error) {
	if !addr.IsValid() {
		return 0, nil
	}
	addr = addr.Unmap()
	if !addr.Is4() {
		return 0, fmt.Errorf("endpoint address %s is not IPv4", addr)
	}
	b := addr.As4()
	return binary.LittleEndian.Uint32(b[:]), nil
}

// NodePortConstants are the load-time constants of the uplink program
// (bpf/nodeport.c) on one device.
type NodePortConstants struct {
	// SNATIPv4 is the node's IPv4 address on the device, the source of
	// connections translated with externalTrafficPolicy Cluster
	// (NODEPORT_SNAT_IPV4; invalid: the frontend's own address).
	SNATIPv4 netip.Addr
	// MaglevTableSize is the slots of the frontends' Maglev tables
	// (LB_MAGLEV_TABLE_SIZE, --bpf-lb-maglev-table-size); 0 picks
	// backends at random (--bpf-lb-algorithm=random).
	MaglevTableSize uint32
	// MaglevSeed seeds the hash of a connection's 5-tuple
	// (LB_MAGLEV_SEED, from --bpf-lb-maglev-hash-seed).
	MaglevSeed uint32
	// LBMode is --bpf-lb-mode (NODEPORT_LB_MODE): LBModeSNAT, LBModeDSR
	// or LBModeHybrid.
	LBMode uint8
}

// NODEPORT_LB_MODE values (bpf/include/dsr.h).
const (
	LBModeSNAT   uint8 = 0
	LBModeDSR    uint8 = 1
	LBModeHybrid uint8 = 2
)

// Apply sets the constants in spec, a spec from LoadNodeport, before it
// is loaded.
func (c NodePortConstants) Apply(spec *ebpf.CollectionSpec) error {
	ip4, err := IPv4Constant(c.SNATIPv4)
	if err != nil {
		return err
	}
	for _, v := range []struct {
		name  string
		value any
	}{
		{NodeportVarNODEPORT_SNAT_IPV4, ip4},
		{NodeportVarLB_MAGLEV_TABLE_SIZE, c.MaglevTableSize},
		{NodeportVarLB_MAGLEV_SEED, c.MaglevSeed},
		{NodeportVarNODEPORT_LB_MODE, c.LBMode},
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
