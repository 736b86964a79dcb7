package bpf_test

import (
	"net"
	"net/netip"
	"testing"

	"github.com/cellium/cellium/datapath/bpf"
)

func TestEndpointConstantsApply(t *testing.T) {
	spec, err := bpf.LoadLxc()
	if err != nil {
		t.Fatal(err)
	}
	c := bpf.EndpointConstants{
		EndpointID: 42, Identity: 70000, IfIndex: 9,
		MAC: net.HardwareAddr{1, 2, 3, 4, 5, 6}, IPv4: netip.MustParseAddr("10.1.2.3"), AuditMode: true,
	}
	if err := c.Apply(spec); err != nil {
		t.Fatal(err)
	}
	var id uint16
	var ident, ifindex, ip4 uint32
	var mac uint64
	var audit, trace uint8
	for name, out := range map[string]any{
		bpf.LxcVarENDPOINT_ID: &id, bpf.LxcVarSECURITY_IDENTITY: &ident, bpf.LxcVarENDPOINT_IFINDEX: &ifindex,
		bpf.LxcVarENDPOINT_MAC: &mac, bpf.LxcVarPOLICY_AUDIT_MODE: &audit, bpf.LxcVarTRACE_ENABLED: &trace,
		bpf.LxcVarENDPOINT_IPV4: &ip4,
	} {
		if err := spec.Variables[name].Get(out); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
	}
	if id != 42 || ident != 70000 || ifindex != 9 || mac != 0x060504030201 || audit != 1 || trace != 0 {
		t.Errorf("constants: id %d identity %d ifindex %d mac %#x audit %d trace %d", id, ident, ifindex, mac, audit, trace)
	}
	// The address as the programs load it from a packet: its bytes in
	// order in memory, a little-endian word.
	if ip4 != 0x0302010a {
		t.Errorf("ENDPOINT_IPV4 = %#x, want 0x0302010a (10.1.2.3 in network order)", ip4)
	}
	if err := (bpf.EndpointConstants{IPv4: netip.MustParseAddr("fd00::1")}).Apply(spec); err == nil {
		t.Error("an IPv6 endpoint address was accepted")
	}
	if err := (bpf.EndpointConstants{MAC: net.HardwareAddr{1}}).Apply(spec); err == nil {
		t.Error("a 1-byte MAC was accepted")
	}
}

// --bpf-lb-mode reaches the uplink program as NODEPORT_LB_MODE, whose
// default in the object is snat (0).
func TestNodePortConstantsLBMode(t *testing.T) {
	spec, err := bpf.LoadNodeport()
	if err != nil {
		t.Fatal(err)
	}
	var mode uint8
	if err := spec.Variables[bpf.NodeportVarNODEPORT_LB_MODE].Get(&mode); err != nil || mode != bpf.LBModeSNAT {
		t.Fatalf("object's NODEPORT_LB_MODE %d (%v), want snat", mode, err)
	}
	for _, want := range []uint8{bpf.LBModeDSR, bpf.LBModeHybrid} {
		if err := (bpf.NodePortConstants{LBMode: want}).Apply(spec); err != nil {
			t.Fatal(err)
		}
		if err := spec.Variables[bpf.NodeportVarNODEPORT_LB_MODE].Get(&mode); err != nil || mode != want {
			t.Errorf("NODEPORT_LB_MODE %d (%v), want %d", mode, err, want)
		}
	}
}
