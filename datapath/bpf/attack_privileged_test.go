package bpf_test

import (
	"encoding/binary"
	"errors"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/containernetworking/plugins/pkg/ns"
	"golang.org/x/sys/unix"

	"github.com/cellium/cellium/datapath/bpf"
	"github.com/cellium/cellium/datapath/maps"
	"github.com/cellium/cellium/statedb/identity"
	"github.com/cellium/cellium/statedb/policy"
	"github.com/cellium/cellium/test/privileged"
)

// The tests of this file are attacks by a pod with NET_RAW, written as the
// pod would send them, run through the real programs (BPF_PROG_TEST_RUN).
// Each failed before the datapath's security model
// (Documentation/concepts/datapath-security.md) and must keep failing to
// get through.

// attackMAC is the Ethernet source of packet() and the endpoints' MAC here.
var attackMAC = net.HardwareAddr{2, 0, 0, 0, 0, 1}

// attackBed is a node of four endpoints in one set of maps: the attacker
// A, a default-deny victim Z, a server D whose ingress allows only V, and
// V, a pod D trusts; R is a remote (world) address.
type attackBed struct {
	m          *maps.Maps
	dir        string
	events     *eventReader
	a, z, d, v netip.Addr
	r          netip.Addr
	progs      map[uint16]*ebpf.Collection
	pol        map[uint16]*maps.PolicyMap
}

const (
	epA, epZ, epD uint16 = 11, 12, 13

	idA, idZ, idD, idV identity.NumericIdentity = 2001, 2002, 2003, 2004
)

func newAttackBed(t *testing.T) *attackBed {
	t.Helper()
	m, dir := openMaps(t)
	b := &attackBed{
		m: m, dir: dir, events: newEventReader(t, m),
		a: netip.MustParseAddr("10.7.4.10"), z: netip.MustParseAddr("10.7.4.20"),
		d: netip.MustParseAddr("10.7.4.40"), v: netip.MustParseAddr("10.7.4.30"),
		r:     netip.MustParseAddr("10.7.9.9"),
		progs: map[uint16]*ebpf.Collection{}, pol: map[uint16]*maps.PolicyMap{},
	}
	for addr, id := range map[netip.Addr]identity.NumericIdentity{b.a: idA, b.z: idZ, b.d: idD, b.v: idV} {
		if err := m.IPCache.Update(netip.PrefixFrom(addr, 32), maps.IPCacheEntry{Identity: id}); err != nil {
			t.Fatal(err)
		}
	}
	for _, ep := range []struct {
		id   uint16
		addr netip.Addr
		sec  identity.NumericIdentity
		pol  []policy.Entry
	}{
		// A may send anything anywhere and accepts nothing.
		{epA, b.a, idA, []policy.Entry{allowAllEgress}},
		// Z: default deny both ways.
		{epZ, b.z, idZ, nil},
		// D: accepts only V, on any port; sends anything.
		{epD, b.d, idD, []policy.Entry{
			{Key: policy.NewKey(idV, policy.Ingress, policy.ProtoAny, 0, 0)}, allowAllEgress,
		}},
	} {
		pm := openPolicy(t, dir, ep.id)
		if len(ep.pol) > 0 {
			if err := pm.BatchUpdate(ep.pol); err != nil {
				t.Fatal(err)
			}
		}
		b.pol[ep.id] = pm
		b.progs[ep.id] = loadEndpoint(t, m, pm, endpointConfig{ID: ep.id, Identity: ep.sec, IfIndex: uint32(ep.id), MAC: attackMAC, IPv4: ep.addr})
	}
	return b
}

// from runs endpoint ep's cil_from_container (what the pod sends) on pkt.
func (b *attackBed) from(t *testing.T, ep uint16, pkt []byte) uint32 {
	t.Helper()
	return run(t, b.progs[ep].Programs[bpf.LxcProgCilFromContainer], pkt)
}

// to runs endpoint ep's cil_to_container (what reaches the pod) on pkt.
func (b *attackBed) to(t *testing.T, ep uint16, pkt []byte) uint32 {
	t.Helper()
	return run(t, b.progs[ep].Programs[bpf.LxcProgCilToContainer], pkt)
}

// expectDrop checks that the last call dropped with reason, from ep.
func (b *attackBed) expectDrop(t *testing.T, what string, verdict uint32, ep uint16, reason uint8) {
	t.Helper()
	evs := b.events.drain(t)
	if verdict != tcActShot {
		t.Errorf("%s: passed, want a drop with %d (%s)", what, reason, maps.DropReasonName(reason))
		return
	}
	for _, e := range evs {
		if e.Type == maps.EventDrop {
			if e.Reason != reason || e.EndpointID != ep {
				t.Errorf("%s: drop %v, want reason %d (%s) from endpoint %d", what, e, reason, maps.DropReasonName(reason), ep)
			}
			return
		}
	}
	t.Errorf("%s: dropped without a drop event (events %v)", what, evs)
}

// expectPass checks that the last call passed.
func (b *attackBed) expectPass(t *testing.T, what string, verdict uint32) {
	t.Helper()
	evs := b.events.drain(t)
	if verdict != tcActOK {
		t.Errorf("%s: dropped (events %v), want it passed", what, evs)
	}
}

// ctEntries returns every conntrack entry.
func (b *attackBed) ctEntries(t *testing.T) map[maps.CTKey]maps.CTEntry {
	t.Helper()
	out := map[maps.CTKey]maps.CTEntry{}
	if err := b.m.CT4.Iterate(func(k maps.CTKey, e maps.CTEntry) bool { out[k] = e; return true }); err != nil {
		t.Fatal(err)
	}
	return out
}

// ipv4 is an Ethernet + IPv4 packet with payload as its datagram's data,
// tot_len covering exactly it; frag is the flags/offset field.
func ipv4(src, dst netip.Addr, proto uint8, id, frag uint16, payload []byte) []byte {
	b := make([]byte, 14+20, 14+20+len(payload))
	copy(b[0:6], []byte{2, 0, 0, 0, 0, 2})
	copy(b[6:12], attackMAC)
	binary.BigEndian.PutUint16(b[12:], 0x0800)
	ip := b[14:]
	ip[0] = 0x45
	binary.BigEndian.PutUint16(ip[2:], uint16(20+len(payload)))
	binary.BigEndian.PutUint16(ip[4:], id)
	binary.BigEndian.PutUint16(ip[6:], frag)
	ip[8] = 64
	ip[9] = proto
	s, d := src.As4(), dst.As4()
	copy(ip[12:16], s[:])
	copy(ip[16:20], d[:])
	return append(b, payload...)
}

// icmp is an ICMP message of type and code with rest as its bytes 4..
func icmp(typ, code uint8, rest []byte) []byte {
	return append([]byte{typ, code, 0, 0}, rest...)
}

// icmpError is an ICMP error quoting quoted (an Ethernet frame from
// packet or ipv4): its IPv4 header and 8 bytes of its L4 header.
func icmpError(typ, code uint8, quoted []byte) []byte {
	return icmp(typ, code, append([]byte{0, 0, 0, 0}, quoted[14:14+20+8]...))
}

// TestPrivilegedAttackSpoofedSource: a pod sends with another pod's
// address (or MAC) to a server that trusts that pod. Before source
// validation the SYN passed D's ingress as V's; now it drops at the
// sender with 132 (130 for the MAC), before conntrack: no entry exists
// for the forged tuple.
func TestPrivilegedAttackSpoofedSource(t *testing.T) {
	privileged.Require(t)
	b := newAttackBed(t)

	spoofed := packet(b.v, b.d, 6, 40000, 80, tcpSYN)
	b.expectDrop(t, "SYN from A forged as V", b.from(t, epA, spoofed), epA, maps.DropInvalidSourceIP)
	b.expectDrop(t, "UDP from A forged as V", b.from(t, epA, packet(b.v, b.d, 17, 40000, 53, 0)), epA, maps.DropInvalidSourceIP)
	b.expectDrop(t, "SYN from A forged as a world address", b.from(t, epA, packet(b.r, b.d, 6, 40000, 80, tcpSYN)), epA, maps.DropInvalidSourceIP)
	if ct := b.ctEntries(t); len(ct) != 0 {
		t.Errorf("forged packets made conntrack entries: %v", ct)
	}
	// Without validation the forged SYN is what D accepts:
	b.expectPass(t, "V's own SYN at D (the control)", b.to(t, epD, spoofed))

	forgedMAC := packet(b.a, b.d, 6, 40001, 80, tcpSYN)
	copy(forgedMAC[6:12], []byte{2, 0, 0, 0, 0, 0x66})
	b.expectDrop(t, "A's own address from another MAC", b.from(t, epA, forgedMAC), epA, maps.DropInvalidSourceMAC)
	b.expectPass(t, "A's own address and MAC", b.from(t, epA, packet(b.a, b.d, 6, 40001, 80, tcpSYN)))
}

// TestPrivilegedAttackConntrackRST: the attacker opens a default-deny pod
// through conntrack. A sends a forged RST "from" Z:8080 to itself, which
// made an egress entry (Z:8080 -> A:4444); A's SYN to Z:8080 then matched
// it at Z's ingress as a reply and a connection into Z followed. Now the
// RST drops as forged, and even a planted entry of A's never admits Z's
// packets: the key carries the endpoint that made it.
func TestPrivilegedAttackConntrackRST(t *testing.T) {
	privileged.Require(t)
	b := newAttackBed(t)
	const tcpRST = 0x04

	b.expectDrop(t, "forged RST from Z", b.from(t, epA, packet(b.z, b.a, 6, 8080, 4444, tcpRST|tcpACK)), epA, maps.DropInvalidSourceIP)
	b.expectDrop(t, "forged UDP from Z", b.from(t, epA, packet(b.z, b.a, 17, 8080, 4444, 0)), epA, maps.DropInvalidSourceIP)
	syn := packet(b.a, b.z, 6, 4444, 8080, tcpSYN)
	b.expectPass(t, "A's SYN leaves A", b.from(t, epA, syn))
	b.expectDrop(t, "A's SYN at default-deny Z", b.to(t, epZ, syn), epZ, maps.DropPolicy)
	udp := packet(b.a, b.z, 17, 4444, 8080, 0)
	b.expectPass(t, "A's UDP leaves A", b.from(t, epA, udp))
	b.expectDrop(t, "A's UDP at default-deny Z", b.to(t, epZ, udp), epZ, maps.DropPolicy)

	// The entry A's hooks would have made, planted: it is A's, not Z's.
	for _, proto := range []uint8{6, 17} {
		k := maps.CTKey{Src: b.z, Dst: b.a, SrcPort: 8080, DstPort: 4444, Proto: proto, Dir: maps.CTEgress, Endpoint: epA}
		if err := b.m.CT4.Update(k, maps.CTEntry{Expires: uint64(monotonicNow(t)) + 60e9, Checked: uint64(monotonicNow(t))}); err != nil {
			t.Fatal(err)
		}
	}
	b.expectDrop(t, "A's SYN at Z beside A's entry", b.to(t, epZ, syn), epZ, maps.DropPolicy)
	b.expectDrop(t, "A's UDP at Z beside A's entry", b.to(t, epZ, udp), epZ, maps.DropPolicy)

	// From outside the node (through the stack): a packet "from Z" that
	// A's ingress refuses makes no entry, and Z's egress gains nothing.
	b.expectDrop(t, "world RST to A", b.to(t, epA, packet(b.r, b.a, 6, 8080, 4444, tcpRST)), epA, maps.DropPolicy)
	for k := range b.ctEntries(t) {
		if k.Endpoint != epA || k.Dir != maps.CTEgress {
			t.Errorf("conntrack entry %+v: want only A's egress entries (its own SYN and UDP, the planted ones)", k)
		}
	}
}

// TestPrivilegedAttackNonSYNOpensNothing: a TCP packet other than a SYN
// passes where the policy allows it but makes no entry, so the peer's
// answers to it meet the policy of their own direction; a RST or FIN
// makes none either.
func TestPrivilegedAttackNonSYNOpensNothing(t *testing.T) {
	privileged.Require(t)
	b := newAttackBed(t)
	for _, flags := range []uint8{tcpACK, 0x04, tcpFIN | tcpACK, tcpSYN | tcpACK, tcpSYN | tcpFIN} {
		b.expectPass(t, "A's non-SYN out (its egress allows all)", b.from(t, epA, packet(b.a, b.r, 6, 5555, 80, flags)))
		if ct := b.ctEntries(t); len(ct) != 0 {
			t.Fatalf("TCP flags %#x opened conntrack entries: %v", flags, ct)
		}
		b.expectDrop(t, "the answer into A", b.to(t, epA, packet(b.r, b.a, 6, 80, 5555, tcpACK)), epA, maps.DropPolicy)
	}
	b.expectPass(t, "A's SYN", b.from(t, epA, packet(b.a, b.r, 6, 5555, 80, tcpSYN)))
	b.expectPass(t, "the SYN-ACK into A", b.to(t, epA, packet(b.r, b.a, 6, 80, 5555, tcpSYN|tcpACK)))
}

// TestPrivilegedAttackICMPTypes: the policy's ICMP types are enforced.
// Before, ICMP was looked up with port 0 while the engine stores the
// type: allowing type 0 admitted 5, 8 and 13, allowing 8 dropped echoes,
// and a deny of 8 beside an L3 allow did nothing.
func TestPrivilegedAttackICMPTypes(t *testing.T) {
	privileged.Require(t)
	b := newAttackBed(t)
	echo := func(typ uint8, id uint16) []byte {
		rest := make([]byte, 4)
		binary.BigEndian.PutUint16(rest, id)
		return ipv4(b.r, b.z, 1, 0, 0, icmp(typ, 0, rest))
	}
	world := identity.NumericIdentity(identity.ReservedIdentityWorld)
	setZ := func(entries ...policy.Entry) {
		t.Helper()
		setPolicy(t, b.pol[epZ], entries...)
		clearCT(t, b.m)
	}

	setZ(policy.Entry{Key: policy.NewKey(world, policy.Ingress, policy.ProtoICMP, 0, 16)}) // type 0 only
	for _, typ := range []uint8{5, 8, 13} {
		b.expectDrop(t, "ICMP type beside an allow of type 0", b.to(t, epZ, echo(typ, 1)), epZ, maps.DropPolicy)
	}
	b.expectPass(t, "type 0, allowed", b.to(t, epZ, echo(0, 1)))

	setZ(policy.Entry{Key: policy.NewKey(world, policy.Ingress, policy.ProtoICMP, 8, 16)}) // echo only
	b.expectPass(t, "echo request, allowed", b.to(t, epZ, echo(8, 2)))
	b.expectDrop(t, "timestamp beside an allow of echo", b.to(t, epZ, echo(13, 2)), epZ, maps.DropPolicy)
	// The echo's entry passes its reply, and only it.
	reply := ipv4(b.z, b.r, 1, 0, 0, icmp(0, 0, []byte{0, 2, 0, 0}))
	copy(reply[6:12], attackMAC)
	b.expectPass(t, "Z's echo reply", b.from(t, epZ, reply))

	setZ(policy.Entry{Key: policy.NewKey(world, policy.Ingress, policy.ProtoAny, 0, 0)},
		policy.Entry{Key: policy.NewKey(world, policy.Ingress, policy.ProtoICMP, 8, 16), Deny: true})
	b.expectDrop(t, "echo denied beside an L3 allow", b.to(t, epZ, echo(8, 3)), epZ, maps.DropPolicyDenyList)
	b.expectPass(t, "timestamp under the L3 allow", b.to(t, epZ, echo(13, 3)))
}

// TestPrivilegedAttackICMPReplies: ICMP replies and errors pass only for
// a connection of the endpoint's own. Before, any non-echo ICMP "reply"
// passed once the pod had sent one ICMP message of any type, and errors
// about an allowed connection (fragmentation needed) were dropped.
func TestPrivilegedAttackICMPReplies(t *testing.T) {
	privileged.Require(t)
	b := newAttackBed(t)
	router := netip.MustParseAddr("10.7.9.1")

	// A (egress allows all, ingress nothing) asks R for a timestamp: the
	// "timestamp reply" (and any other non-echo ICMP) has no connection.
	b.expectPass(t, "A's timestamp request", b.from(t, epA, ipv4(b.a, b.r, 1, 0, 0, icmp(13, 0, make([]byte, 16)))))
	b.expectDrop(t, "R's timestamp reply into A", b.to(t, epA, ipv4(b.r, b.a, 1, 0, 0, icmp(14, 0, make([]byte, 16)))), epA, maps.DropPolicy)
	b.expectDrop(t, "R's redirect into A", b.to(t, epA, ipv4(b.r, b.a, 1, 0, 0, icmp(5, 0, make([]byte, 4)))), epA, maps.DropPolicy)
	b.expectDrop(t, "R's unsolicited echo reply into A", b.to(t, epA, ipv4(b.r, b.a, 1, 0, 0, icmp(0, 0, []byte{0, 9, 0, 0}))), epA, maps.DropPolicy)

	// A's TCP connection to R: a router's "fragmentation needed" about
	// it passes, though A's ingress allows no ICMP; one about a tuple A
	// never opened does not.
	syn := packet(b.a, b.r, 6, 41000, 443, tcpSYN)
	b.expectPass(t, "A's SYN", b.from(t, epA, syn))
	fragNeeded := ipv4(router, b.a, 1, 0, 0, icmpError(3, 4, syn))
	b.expectPass(t, "frag-needed about A's connection", b.to(t, epA, fragNeeded))
	other := packet(b.a, b.r, 6, 41001, 443, tcpSYN)
	b.expectDrop(t, "frag-needed about no connection", b.to(t, epA, ipv4(router, b.a, 1, 0, 0, icmpError(3, 4, other))), epA, maps.DropPolicy)
	// An error quoting Z's tuple into A is not A's.
	zsyn := packet(b.z, b.r, 6, 41000, 443, tcpSYN)
	b.expectDrop(t, "an error about another pod's packet", b.to(t, epA, ipv4(router, b.a, 1, 0, 0, icmpError(3, 4, zsyn))), epA, maps.DropPolicy)

	// D accepted V's UDP; D's port unreachable back to V is related.
	query := packet(b.v, b.d, 17, 5353, 9, 0)
	b.expectPass(t, "V's datagram into D", b.to(t, epD, query))
	setPolicy(t, b.pol[epD], policy.Entry{Key: policy.NewKey(idV, policy.Ingress, policy.ProtoAny, 0, 0)})
	unreach := ipv4(b.d, b.v, 1, 0, 0, icmpError(3, 3, query))
	b.expectPass(t, "D's port unreachable about V's datagram (D's egress allows nothing)", b.from(t, epD, unreach))
	b.expectDrop(t, "D's port unreachable about nothing", b.from(t, epD, ipv4(b.d, b.v, 1, 0, 0, icmpError(3, 3, packet(b.v, b.d, 17, 5354, 9, 0)))), epD, maps.DropPolicy)
	if n := len(b.ctEntries(t)); n != 2 {
		t.Errorf("conntrack holds %d entries, want 2 (A's SYN, V's datagram): errors and replies open none", n)
	}
}

// TestPrivilegedAttackFragments: a datagram's fragments after the first
// are judged on the first one's ports. Before, they were seen with port
// 0: the second fragment of an allowed UDP reply (a large DNS answer)
// dropped, and a policy on port 0 let any datagram's tail through.
func TestPrivilegedAttackFragments(t *testing.T) {
	privileged.Require(t)
	b := newAttackBed(t)
	udp := func(sport, dport uint16, n int) []byte {
		h := make([]byte, 8, 8+n)
		binary.BigEndian.PutUint16(h[0:], sport)
		binary.BigEndian.PutUint16(h[2:], dport)
		binary.BigEndian.PutUint16(h[4:], uint16(8+n))
		return append(h, make([]byte, n)...)
	}
	const mf = 0x2000
	b.expectPass(t, "A's DNS query", b.from(t, epA, packet(b.a, b.r, 17, 5300, 53, 0)))
	answer := udp(53, 5300, 1400)
	b.expectPass(t, "first fragment of the answer", b.to(t, epA, ipv4(b.r, b.a, 17, 77, mf, answer[:1200])))
	b.expectPass(t, "second fragment of the answer", b.to(t, epA, ipv4(b.r, b.a, 17, 77, 1200/8, answer[1200:])))
	b.expectDrop(t, "a fragment whose first never came", b.to(t, epA, ipv4(b.r, b.a, 17, 78, 1200/8, answer[1200:])), epA, maps.DropFragNotFound)

	// A datagram to a port A's ingress refuses: its tail drops too.
	setPolicy(t, b.pol[epA], allowAllEgress, policy.Entry{Key: policy.NewKey(0, policy.Ingress, policy.ProtoUDP, 0, 16)})
	clearCT(t, b.m)
	flood := udp(40000, 9999, 1400)
	b.expectDrop(t, "first fragment to a refused port", b.to(t, epA, ipv4(b.r, b.a, 17, 79, mf, flood[:1200])), epA, maps.DropPolicy)
	b.expectDrop(t, "its second fragment (port 0 is allowed)", b.to(t, epA, ipv4(b.r, b.a, 17, 79, 1200/8, flood[1200:])), epA, maps.DropPolicy)

	// A forged first fragment cannot name another source's datagram: it
	// drops as forged before it is recorded.
	b.expectDrop(t, "A forges R's first fragment", b.from(t, epA, ipv4(b.r, b.d, 17, 80, mf, udp(53, 80, 64))), epA, maps.DropInvalidSourceIP)
}

// TestPrivilegedAttackLengths: the headers must lie inside the datagram
// tot_len gives. Before, ports were read from the bytes after it (a
// trailer) and conntrack entries were made for tuples the packet did not
// carry.
func TestPrivilegedAttackLengths(t *testing.T) {
	privileged.Require(t)
	b := newAttackBed(t)
	trailer := packet(b.a, b.r, 17, 6000, 53, 0)
	binary.BigEndian.PutUint16(trailer[14+2:], 20) // the UDP header is a trailer
	b.expectDrop(t, "UDP header outside the datagram", b.from(t, epA, trailer), epA, maps.DropCTInvalidHeader)
	tcp := packet(b.a, b.r, 6, 6000, 80, tcpSYN)
	tcp[14+20+12] = 0x40 // data offset 4: shorter than a TCP header
	b.expectDrop(t, "TCP data offset below 5", b.from(t, epA, tcp), epA, maps.DropCTInvalidHeader)
	tcp = packet(b.a, b.r, 6, 6000, 80, tcpSYN)
	tcp[14+20+12] = 0xf0 // 60 bytes of TCP header claimed, 20 sent
	b.expectDrop(t, "TCP header past the datagram", b.from(t, epA, tcp), epA, maps.DropCTInvalidHeader)
	if ct := b.ctEntries(t); len(ct) != 0 {
		t.Errorf("malformed packets made conntrack entries: %v", ct)
	}
	padded := append(packet(b.a, b.r, 17, 6001, 53, 0), make([]byte, 10)...) // Ethernet padding after the datagram
	b.expectPass(t, "a datagram with padding after it", b.from(t, epA, padded))
}

// TestPrivilegedAttackNonIPv4: IPv6 (also carrying IPv4) and other
// EtherTypes drop both ways; ARP from the pod must claim its own address
// and MAC.
func TestPrivilegedAttackNonIPv4(t *testing.T) {
	privileged.Require(t)
	b := newAttackBed(t)
	v6 := func(next uint8) []byte {
		p := make([]byte, 14+40+20)
		copy(p[6:12], attackMAC)
		binary.BigEndian.PutUint16(p[12:], 0x86dd)
		p[14] = 0x60
		binary.BigEndian.PutUint16(p[14+4:], 20)
		p[14+6] = next
		return p
	}
	for _, c := range []struct {
		what string
		pkt  []byte
	}{{"IPv6 TCP", v6(6)}, {"IPv4 in IPv6", v6(4)}, {"IPv6 ICMPv6", v6(58)}} {
		b.expectDrop(t, c.what+" from the pod", b.from(t, epA, c.pkt), epA, maps.DropUnknownL3)
		b.expectDrop(t, c.what+" to the pod", b.to(t, epA, c.pkt), epA, maps.DropUnknownL3)
	}
	b.expectPass(t, "ARP for A's own address", b.from(t, epA, arpPacket(attackMAC, b.a)))
	b.expectDrop(t, "ARP claiming D's address", b.from(t, epA, arpPacket(attackMAC, b.d)), epA, maps.DropInvalidSourceIP)
	forged := arpPacket(attackMAC, b.a)
	copy(forged[14+8:14+14], []byte{2, 0, 0, 0, 0, 0x66})
	b.expectDrop(t, "ARP with another sender MAC", b.from(t, epA, forged), epA, maps.DropInvalidSourceMAC)
	b.expectDrop(t, "ARP from another Ethernet source", b.from(t, epA, arpPacket(net.HardwareAddr{2, 0, 0, 0, 0, 0x66}, b.a)), epA, maps.DropInvalidSourceMAC)
	rarp := arpPacket(attackMAC, b.a)
	rarp[14+2] = 0x86 // protocol IPv6: not ARP for IPv4
	b.expectDrop(t, "ARP for another protocol", b.from(t, epA, rarp), epA, maps.DropInvalid)
}

// TestPrivilegedAttackReplyAfterRevoke: once the allow that admitted a
// connection is gone, the peer cannot keep its reply side alive by
// sending. Before, every reply passed and refreshed the entry for as long
// as the peer sent. Now the first reply more than a second
// (CT_REPLY_RECHECK_NS) after the entry's last policy check re-checks the
// policy; the entries are aged here instead of sleeping.
func TestPrivilegedAttackReplyAfterRevoke(t *testing.T) {
	privileged.Require(t)
	b := newAttackBed(t)
	web := policy.Entry{Key: policy.NewKey(identity.ReservedIdentityWorld, policy.Egress, policy.ProtoTCP, 80, 16)}
	dns := policy.Entry{Key: policy.NewKey(identity.ReservedIdentityWorld, policy.Egress, policy.ProtoUDP, 53, 16)}
	setPolicy(t, b.pol[epA], web, dns)
	age := func(k maps.CTKey) {
		t.Helper()
		e, err := b.m.CT4.Lookup(k)
		if err != nil {
			t.Fatal(err)
		}
		e.Checked -= 2e9
		if err := b.m.CT4.Update(k, e); err != nil {
			t.Fatal(err)
		}
	}
	tcpKey := maps.CTKey{Src: b.a, Dst: b.r, SrcPort: 42000, DstPort: 80, Proto: 6, Dir: maps.CTEgress, Endpoint: epA}
	udpKey := maps.CTKey{Src: b.a, Dst: b.r, SrcPort: 5300, DstPort: 53, Proto: 17, Dir: maps.CTEgress, Endpoint: epA}
	b.expectPass(t, "A's SYN", b.from(t, epA, packet(b.a, b.r, 6, 42000, 80, tcpSYN)))
	b.expectPass(t, "SYN-ACK", b.to(t, epA, packet(b.r, b.a, 6, 80, 42000, tcpSYN|tcpACK)))
	b.expectPass(t, "A's query", b.from(t, epA, packet(b.a, b.r, 17, 5300, 53, 0)))
	b.expectPass(t, "answer", b.to(t, epA, packet(b.r, b.a, 17, 53, 5300, 0)))
	age(tcpKey)
	age(udpKey)
	b.expectPass(t, "a reply re-checked while the allow stands", b.to(t, epA, packet(b.r, b.a, 6, 80, 42000, tcpACK)))

	setPolicy(t, b.pol[epA])
	b.expectPass(t, "R's data within the bound", b.to(t, epA, packet(b.r, b.a, 6, 80, 42000, tcpACK)))
	age(tcpKey)
	age(udpKey)
	b.expectDrop(t, "R's data after the bound", b.to(t, epA, packet(b.r, b.a, 6, 80, 42000, tcpACK)), epA, maps.DropPolicy)
	b.expectDrop(t, "R's next data (no re-check needed)", b.to(t, epA, packet(b.r, b.a, 6, 80, 42000, tcpACK)), epA, maps.DropPolicy)
	b.expectDrop(t, "R's UDP after the bound", b.to(t, epA, packet(b.r, b.a, 17, 53, 5300, 0)), epA, maps.DropPolicy)
	b.expectDrop(t, "A's own data", b.from(t, epA, packet(b.a, b.r, 6, 42000, 80, tcpACK)), epA, maps.DropPolicy)
	if e, err := b.m.CT4.Lookup(tcpKey); err != nil || e.Flags&maps.CTFlagDenied == 0 {
		t.Errorf("the revoked connection's entry: %+v, %v; want it kept, marked denied", e, err)
	}

	// A deny rule's verdict is named as such; the allow back reopens it.
	setPolicy(t, b.pol[epA], policy.Entry{Key: web.Key, Deny: true}, dns)
	age(tcpKey)
	b.expectDrop(t, "R's data under a deny", b.to(t, epA, packet(b.r, b.a, 6, 80, 42000, tcpACK)), epA, maps.DropPolicyDenyList)
	setPolicy(t, b.pol[epA], web, dns)
	age(tcpKey)
	age(udpKey)
	b.expectPass(t, "R's data once allowed again", b.to(t, epA, packet(b.r, b.a, 6, 80, 42000, tcpACK)))
	b.expectPass(t, "R's UDP once allowed again", b.to(t, epA, packet(b.r, b.a, 17, 53, 5300, 0)))
	if _, err := b.m.CT4.Lookup(maps.CTKey{Src: b.r, Dst: b.a, SrcPort: 80, DstPort: 42000, Proto: 6, Dir: maps.CTIngress, Endpoint: epA}); !errors.Is(err, ebpf.ErrKeyNotExist) {
		t.Errorf("the peer's packets opened an entry the other way: %v", err)
	}
}

// TestPrivilegedAttackSpoofedSourceRealPackets sends the forged datagram
// for real: pod A writes, on a raw socket, a UDP datagram "from" V to D,
// whose ingress admits only V, through the veths, the node's stack and
// the attached programs. Before source validation D read it as V's; now
// it drops at A with 132 and D
// never reads it; V's own datagram, sent after the drop, is the first D
// reads.
func TestPrivilegedAttackSpoofedSourceRealPackets(t *testing.T) {
	privileged.Require(t)
	m, dir := openMaps(t)
	events := newEventReader(t, m)
	var seen []maps.Event

	node := newTestNode(t)
	a := node.addPod(t, "sa", netip.MustParseAddr("10.77.0.50"))
	v := node.addPod(t, "sv", netip.MustParseAddr("10.77.0.51"))
	d := node.addPod(t, "sd", netip.MustParseAddr("10.77.0.52"))
	const sa, sv, sd uint16 = 21, 22, 23
	for _, p := range []struct {
		pod *testPod
		ep  uint16
		id  identity.NumericIdentity
		pol []policy.Entry
	}{
		{a, sa, idA, []policy.Entry{allowAllIngress, allowAllEgress}},
		{v, sv, idV, []policy.Entry{allowAllIngress, allowAllEgress}},
		{d, sd, idD, []policy.Entry{allowAllEgress, {Key: policy.NewKey(idV, policy.Ingress, policy.ProtoAny, 0, 0)}}},
	} {
		registerPod(t, m, p.pod, p.id, p.ep)
		pm := openPolicy(t, dir, p.ep)
		if err := pm.BatchUpdate(p.pol); err != nil {
			t.Fatal(err)
		}
		coll := loadEndpoint(t, m, pm, endpointConfig{ID: p.ep, Identity: p.id, IfIndex: uint32(p.pod.res.HostIfIndex), MAC: p.pod.res.PodMAC, IPv4: p.pod.ip})
		node.attach(t, p.pod, coll)
		// No redirect slot: the datagram takes the node's stack to D's
		// cil_to_container, which knows its source only by its address
		// (the redirect hands over the sender's own identity instead).
	}

	var conn net.PacketConn
	if err := d.ns.Do(func(ns.NetNS) error {
		var err error
		conn, err = net.ListenPacket("udp4", netip.AddrPortFrom(d.ip, 9000).String())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer conn.Close()

	// The forged datagram: IPv4 header and UDP by hand (IPPROTO_RAW
	// implies IP_HDRINCL; the kernel fills the checksum and ID).
	payload := []byte("forged")
	pkt := make([]byte, 20+8+len(payload))
	pkt[0] = 0x45
	binary.BigEndian.PutUint16(pkt[2:], uint16(len(pkt)))
	pkt[8], pkt[9] = 64, 17
	vs, ds := v.ip.As4(), d.ip.As4()
	copy(pkt[12:16], vs[:])
	copy(pkt[16:20], ds[:])
	binary.BigEndian.PutUint16(pkt[20:], 7000)
	binary.BigEndian.PutUint16(pkt[22:], 9000)
	binary.BigEndian.PutUint16(pkt[24:], uint16(8+len(payload)))
	copy(pkt[28:], payload)
	if err := a.ns.Do(func(ns.NetNS) error {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_RAW, unix.IPPROTO_RAW)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		return unix.Sendto(fd, pkt, 0, &unix.SockaddrInet4{Addr: ds})
	}); err != nil {
		t.Fatalf("send the forged datagram from A: %v", err)
	}
	ev := events.waitFor(t, "drop of the forged datagram", &seen, func(e maps.Event) bool {
		return e.Type == maps.EventDrop && e.EndpointID == sa
	})
	if ev.Reason != maps.DropInvalidSourceIP || ev.Src != v.ip || ev.Dst != d.ip {
		t.Errorf("drop at A: %v, want 132 (Invalid source ip) for %s -> %s", ev, v.ip, d.ip)
	}

	if err := v.ns.Do(func(ns.NetNS) error {
		c, err := net.Dial("udp4", netip.AddrPortFrom(d.ip, 9000).String())
		if err != nil {
			return err
		}
		defer c.Close()
		_, err = c.Write([]byte("legit"))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64)
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	n, from, err := conn.ReadFrom(buf)
	if err != nil {
		t.Fatalf("D read nothing, not even V's own datagram: %v", err)
	}
	if string(buf[:n]) != "legit" {
		t.Errorf("D's first datagram: %q from %v, want V's %q (the forged one got through)", buf[:n], from, "legit")
	}
}

// TestPrivilegedAttackSCTPPorts: SCTP is decided on its ports, as the
// policy engine writes them. Before, SCTP was seen with port 0: a port
// rule allowed nothing and an SCTP port deny beside an L3 allow did
// nothing.
func TestPrivilegedAttackSCTPPorts(t *testing.T) {
	privileged.Require(t)
	b := newAttackBed(t)
	sctp := func(sport, dport uint16) []byte {
		h := make([]byte, 12+16) // common header, then a chunk's worth
		binary.BigEndian.PutUint16(h[0:], sport)
		binary.BigEndian.PutUint16(h[2:], dport)
		return ipv4(b.v, b.d, 132, 0, 0, h)
	}
	setPolicy(t, b.pol[epD], policy.Entry{Key: policy.NewKey(idV, policy.Ingress, policy.ProtoSCTP, 9000, 16)})
	b.expectPass(t, "SCTP to the allowed port", b.to(t, epD, sctp(5000, 9000)))
	b.expectDrop(t, "SCTP to another port", b.to(t, epD, sctp(5000, 9001)), epD, maps.DropPolicy)
	setPolicy(t, b.pol[epD], policy.Entry{Key: policy.NewKey(idV, policy.Ingress, policy.ProtoAny, 0, 0)},
		policy.Entry{Key: policy.NewKey(idV, policy.Ingress, policy.ProtoSCTP, 9002, 16), Deny: true})
	b.expectDrop(t, "SCTP to a denied port beside an L3 allow", b.to(t, epD, sctp(5001, 9002)), epD, maps.DropPolicyDenyList)
	b.expectPass(t, "SCTP to another port under the L3 allow", b.to(t, epD, sctp(5001, 9003)))
	short := ipv4(b.v, b.d, 132, 0, 0, make([]byte, 8))
	b.expectDrop(t, "SCTP shorter than its common header", b.to(t, epD, short), epD, maps.DropCTInvalidHeader)
}
