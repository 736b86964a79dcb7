package maps

import (
	"encoding/binary"
	"errors"
	"net"
	"net/netip"
	"strings"
	"testing"
	"unsafe"

	"github.com/cellium/cellium/datapath/bpf"
	"github.com/cellium/cellium/statedb/identity"
	"github.com/cellium/cellium/statedb/policy"
)

// The Go mirrors of the C structs must have the C sizes of BPF ABI v1.
func TestStructSizes(t *testing.T) {
	for _, c := range []struct {
		name string
		got  uintptr
		want uintptr
	}{
		{"ipcache_key", unsafe.Sizeof(bpf.LxcIpcacheKey{}), 24},
		{"ipcache_value", unsafe.Sizeof(bpf.LxcIpcacheValue{}), 12},
		{"endpoint_key", unsafe.Sizeof(bpf.LxcEndpointKey{}), 20},
		{"endpoint_info", unsafe.Sizeof(bpf.LxcEndpointInfo{}), 24},
		{"policy_key", unsafe.Sizeof(bpf.LxcPolicyKey{}), 12},
		{"policy_entry", unsafe.Sizeof(bpf.LxcPolicyEntry{}), 8},
		{"ct4_key", unsafe.Sizeof(bpf.LxcCt4Key{}), 16},
		{"ct_entry", unsafe.Sizeof(bpf.LxcCtEntry{}), 56},
		{"metrics_key", unsafe.Sizeof(bpf.LxcMetricsKey{}), 4},
		{"metrics_value", unsafe.Sizeof(bpf.LxcMetricsValue{}), 16},
		{"event", unsafe.Sizeof(bpf.LxcEvent{}), EventSize},
	} {
		if c.got != c.want {
			t.Errorf("sizeof(%s) = %d, want %d", c.name, c.got, c.want)
		}
	}
}

func TestIPCacheKey(t *testing.T) {
	for _, c := range []struct {
		prefix  string
		plen    uint32
		family  uint8
		ipBytes []byte
	}{
		{"10.1.2.3/32", 64, FamilyIPv4, []byte{10, 1, 2, 3}},
		{"10.1.2.0/24", 56, FamilyIPv4, []byte{10, 1, 2, 0}},
		{"10.1.2.3/24", 56, FamilyIPv4, []byte{10, 1, 2, 0}}, // masked
		{"0.0.0.0/0", 32, FamilyIPv4, []byte{0, 0, 0, 0}},
		{"fd00::1/128", 160, FamilyIPv6, netip.MustParseAddr("fd00::1").AsSlice()},
	} {
		k, err := IPCacheKey(netip.MustParsePrefix(c.prefix))
		if err != nil {
			t.Fatalf("%s: %v", c.prefix, err)
		}
		if k.Prefixlen != c.plen || k.Family != c.family {
			t.Errorf("%s: prefixlen %d family %d, want %d %d", c.prefix, k.Prefixlen, k.Family, c.plen, c.family)
		}
		// The address bytes must sit in memory in network order.
		mem := make([]byte, 16)
		for i, w := range k.Ip {
			binary.LittleEndian.PutUint32(mem[4*i:], w)
		}
		if string(mem[:len(c.ipBytes)]) != string(c.ipBytes) {
			t.Errorf("%s: key bytes %v, want %v", c.prefix, mem, c.ipBytes)
		}
		back, err := ipcachePrefix(&k)
		if err != nil || back != netip.MustParsePrefix(c.prefix).Masked() {
			t.Errorf("%s: decoded %v, %v", c.prefix, back, err)
		}
	}
	if _, err := IPCacheKey(netip.Prefix{}); !errors.Is(err, ErrInvalidKey) {
		t.Errorf("invalid prefix: %v, want ErrInvalidKey", err)
	}
	k, err := IPCacheKey(netip.MustParsePrefix("::ffff:10.0.0.0/104"))
	if err != nil || k.Family != FamilyIPv4 || k.Prefixlen != 32+8 {
		t.Errorf("IPv4-mapped prefix: %+v, %v; want family 2 prefixlen 40", k, err)
	}
}

func TestIPCacheValue(t *testing.T) {
	e := IPCacheEntry{Identity: 1234, TunnelEndpoint: netip.MustParseAddr("192.168.1.2"), Flags: 1}
	v, err := ipcacheValue(e)
	if err != nil {
		t.Fatal(err)
	}
	var b [4]byte
	binary.LittleEndian.PutUint32(b[:], v.TunnelEndpoint)
	if b != [4]byte{192, 168, 1, 2} || v.SecIdentity != 1234 {
		t.Errorf("value %+v", v)
	}
	if got := ipcacheEntry(&v); got != e {
		t.Errorf("round trip: %+v, want %+v", got, e)
	}
	if got := ipcacheEntry(&bpf.LxcIpcacheValue{SecIdentity: 5}); got.TunnelEndpoint.IsValid() {
		t.Errorf("no tunnel endpoint decoded as %v", got.TunnelEndpoint)
	}
	if _, err := ipcacheValue(IPCacheEntry{TunnelEndpoint: netip.MustParseAddr("fd00::1")}); err == nil {
		t.Error("IPv6 tunnel endpoint accepted")
	}
}

// PolicyKey must produce statedb/policy's prefix lengths and the port in
// network byte order, and PolicyKeyFrom must invert it.
func TestPolicyKeyRoundTrip(t *testing.T) {
	for _, k := range []policy.Key{
		policy.NewKey(0, policy.Ingress, policy.ProtoAny, 0, 0),
		policy.NewKey(1234, policy.Egress, policy.ProtoTCP, 80, 16),
		policy.NewKey(1234, policy.Ingress, policy.ProtoUDP, 1024, 6),
		policy.NewKey(identity.ReservedIdentityWorld, policy.Egress, policy.ProtoTCP, 0, 0),
		policy.NewKey(70000, policy.Ingress, policy.ProtoICMP, 0, 16),
	} {
		b := PolicyKey(k)
		if b.Prefixlen != k.PrefixLen() {
			t.Errorf("%s: prefixlen %d, want %d", k, b.Prefixlen, k.PrefixLen())
		}
		var port [2]byte
		binary.LittleEndian.PutUint16(port[:], b.Dport)
		if binary.BigEndian.Uint16(port[:]) != k.Port {
			t.Errorf("%s: dport bytes %v", k, port)
		}
		back, err := PolicyKeyFrom(b)
		if err != nil || back != k {
			t.Errorf("%s: decoded %s, %v", k, back, err)
		}
		if v := policyValue(policy.Entry{Key: k, Deny: true}); v.Deny != 1 || v.LpmPrefixLength != k.LPMPrefixLen() {
			t.Errorf("%s: value %+v", k, v)
		}
	}
	// A key given without normalisation is normalised.
	if b := PolicyKey(policy.Key{Identity: 1, Proto: 0, Port: 80, PortPrefixLen: 16}); b.Prefixlen != 40 || b.Dport != 0 {
		t.Errorf("unnormalised any-protocol key encoded as %+v", b)
	}
	for _, plen := range []uint32{0, 39, 41, 47, 65} {
		if _, err := PolicyKeyFrom(bpf.LxcPolicyKey{Prefixlen: plen, Protocol: 6}); !errors.Is(err, ErrInvalidKey) {
			t.Errorf("prefixlen %d: %v, want ErrInvalidKey", plen, err)
		}
	}
}

func TestEndpointAndCTKeys(t *testing.T) {
	a := netip.MustParseAddr("10.0.0.7")
	k, err := EndpointKey(a)
	if err != nil || k.Family != FamilyIPv4 {
		t.Fatalf("%+v %v", k, err)
	}
	mac := net.HardwareAddr{0x02, 0, 0, 0, 0, 0x01}
	v, err := endpointValue(EndpointInfo{IfIndex: 3, ID: 42, MAC: mac, Identity: 1000})
	if err != nil || v.Mac != [6]uint8(mac) || v.LxcId != 42 {
		t.Fatalf("%+v %v", v, err)
	}
	if _, err := endpointValue(EndpointInfo{MAC: net.HardwareAddr{1, 2}}); err == nil {
		t.Error("2-byte MAC accepted")
	}
	ck := CTKey{Src: a, Dst: netip.MustParseAddr("10.0.0.8"), SrcPort: 40000, DstPort: 80, Proto: 6, Dir: CTEgress}
	bk, err := ct4Key(ck)
	if err != nil {
		t.Fatal(err)
	}
	if got := ctKey(&bk); got != ck {
		t.Errorf("ct key round trip %+v, want %+v", got, ck)
	}
	if _, err := ct4Key(CTKey{Src: netip.MustParseAddr("fd00::1"), Dst: a}); !errors.Is(err, ErrInvalidKey) {
		t.Errorf("IPv6 ct key: %v", err)
	}
	m, err := MACConstant(net.HardwareAddr{1, 2, 3, 4, 5, 6})
	if err != nil || m != 0x060504030201 {
		t.Errorf("MACConstant = %#x, %v", m, err)
	}
}

// TestDecodeEvent decodes a version 1 record (72 bytes, what programs
// loaded by an older agent still write).
func TestDecodeEvent(t *testing.T) {
	b := make([]byte, EventSizeV1)
	b[0], b[1], b[2], b[3] = 1, 133, 2, 0
	binary.LittleEndian.PutUint16(b[4:], 42)
	b[6], b[7] = 6, FamilyIPv4
	binary.LittleEndian.PutUint32(b[8:], 1000)
	binary.LittleEndian.PutUint32(b[12:], 2)
	copy(b[16:], []byte{10, 0, 0, 1})
	copy(b[32:], []byte{10, 0, 0, 2})
	binary.BigEndian.PutUint16(b[48:], 40000)
	binary.BigEndian.PutUint16(b[50:], 80)
	binary.LittleEndian.PutUint32(b[52:], 7)
	binary.LittleEndian.PutUint32(b[56:], 74)
	binary.LittleEndian.PutUint64(b[64:], 123456789)
	e, err := DecodeEvent(b)
	if err != nil {
		t.Fatal(err)
	}
	want := Event{
		Type: EventDrop, Reason: DropPolicy, Dir: DirEgress, EndpointID: 42, Proto: 6,
		Src: netip.MustParseAddr("10.0.0.1"), Dst: netip.MustParseAddr("10.0.0.2"),
		SrcIdentity: 1000, DstIdentity: 2, SrcPort: 40000, DstPort: 80,
		IfIndex: 7, OrigLen: 74, KtimeNs: 123456789, Version: 1,
	}
	if e != want {
		t.Errorf("decoded %+v\nwant    %+v", e, want)
	}
	if s, w := e.String(), "drop (Policy denied) egress ep 42 10.0.0.1:40000 (1000) -> 10.0.0.2:80 (2) tcp"; s != w {
		t.Errorf("String() = %q, want %q", s, w)
	}
	if _, err := DecodeEvent(b[:EventSizeV1-1]); !errors.Is(err, ErrShortEvent) {
		t.Errorf("short record: %v", err)
	}
}

// TestDecodeEventV2 decodes the fields of version 2: TCP flags, ICMP type
// and code, the reply flags and the original destination.
func TestDecodeEventV2(t *testing.T) {
	base := func() []byte {
		b := make([]byte, EventSize)
		b[0], b[1], b[2] = byte(EventTrace), TraceToStack, byte(DirEgress)
		binary.LittleEndian.PutUint16(b[4:], 42)
		b[6], b[7] = 6, FamilyIPv4
		copy(b[16:], []byte{10, 0, 0, 1})
		copy(b[32:], []byte{10, 0, 0, 2})
		binary.BigEndian.PutUint16(b[48:], 40000)
		binary.BigEndian.PutUint16(b[50:], 8080)
		b[60] = EventVersion
		return b
	}
	b := base()
	b[61] = 0x12                                 // SYN, ACK
	b[72] = eventFlagReply | eventFlagReplyKnown // a reply
	b[72] |= eventFlagOrigDst                    // translated from
	binary.BigEndian.PutUint16(b[74:], 80)       // 10.96.0.10:80
	copy(b[76:], []byte{10, 96, 0, 10})
	e, err := DecodeEvent(b)
	if err != nil {
		t.Fatal(err)
	}
	if e.Version != 2 || e.TCPFlags != 0x12 || !e.IsReply || !e.ReplyKnown ||
		e.OrigDst != netip.MustParseAddr("10.96.0.10") || e.OrigDstPort != 80 {
		t.Errorf("decoded %+v", e)
	}
	if s, w := e.String(), "trace to-stack egress ep 42 10.0.0.1:40000 (0) -> 10.0.0.2:8080 (0) tcp SYN, ACK reply service 10.96.0.10:80"; s != w {
		t.Errorf("String() = %q, want %q", s, w)
	}

	// ICMP: type and code; no reply flags known; no original
	// destination without its flag, whatever the bytes say.
	b = base()
	b[6] = 1
	b[62], b[63] = 3, 4
	copy(b[76:], []byte{10, 96, 0, 10})
	if e, err = DecodeEvent(b); err != nil {
		t.Fatal(err)
	}
	if e.ICMPType != 3 || e.ICMPCode != 4 || e.ReplyKnown || e.IsReply || e.OrigDst.IsValid() {
		t.Errorf("decoded %+v", e)
	}
	if s := e.String(); !strings.HasSuffix(s, "icmp type 3 code 4") {
		t.Errorf("String() = %q, want the ICMP type and code at the end", s)
	}

	if _, err := DecodeEvent(b[:EventSize-1]); !errors.Is(err, ErrShortEvent) {
		t.Errorf("short version 2 record: %v", err)
	}
	b[60] = 9
	if _, err := DecodeEvent(b); !errors.Is(err, ErrEventVersion) {
		t.Errorf("version 9: %v, want ErrEventVersion", err)
	}
}

func TestTCPFlagsString(t *testing.T) {
	for f, want := range map[uint8]string{0: "", 0x02: "SYN", 0x12: "SYN, ACK", 0x11: "FIN, ACK", 0xff: "FIN, SYN, RST, PSH, ACK, URG, ECE, CWR"} {
		if got := TCPFlagsString(f); got != want {
			t.Errorf("TCPFlagsString(%#x) = %q, want %q", f, got, want)
		}
	}
}

func TestReasonNames(t *testing.T) {
	for code, want := range map[uint8]string{
		133: "Policy denied", 181: "Policy denied by denylist", 134: "Invalid packet",
		135: "CT: Truncated or invalid header", 139: "Unsupported L3 protocol",
		155: "CT: Map insertion failed", 250: "250",
	} {
		if got := DropReasonName(code); got != want {
			t.Errorf("DropReasonName(%d) = %q, want %q", code, got, want)
		}
	}
	if TraceObsPointName(TraceToLxc) != "to-endpoint" || TraceObsPointName(TraceFromLxc) != "from-endpoint" {
		t.Error("trace observation point names")
	}
}
