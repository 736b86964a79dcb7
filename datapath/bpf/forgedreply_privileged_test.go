package bpf_test

import (
	"encoding/binary"
	"net"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/cellium/cellium/datapath/bpf"
	"github.com/cellium/cellium/datapath/maps"
	"github.com/cellium/cellium/statedb/lb"
	"github.com/cellium/cellium/statedb/policy"
)

// The forged-reply attacks on the kube-proxy replacement: packets made
// with a raw socket to look like a Service backend's replies, aimed at
// another client's NAT port, or at opening a pod through the NodePort
// path. Each is refused with a counted drop reason, and each test fails
// with its protection removed (Documentation/operations/
// kube-proxy-replacement-datapath.md, "Under attack").

// natOf returns the NAT entry (node 1's cellium_nodeport_ct4) of the
// connection from outsideIP:clientPort to frontend port fport.
func natOf(t *testing.T, m *maps.Maps, fport, clientPort uint16) maps.NodePortNAT {
	t.Helper()
	conns, err := m.NodePortConnections()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range conns {
		if c.Key.FrontendPort == htons(fport) && c.Key.ClientPort == htons(clientPort) {
			return c
		}
	}
	t.Fatalf("no NAT entry for client port %d to port %d", clientPort, fport)
	return maps.NodePortNAT{}
}

// addrOfBE is an address as the programs store it (network order read as
// a little-endian word).
func addrOfBE(v uint32) netip.Addr {
	var b [4]byte
	binary.LittleEndian.PutUint32(b[:], v)
	return netip.AddrFrom4(b)
}

// victimUDP is a UDP socket of the outside namespace connected to node 1's
// port, which has had one answer (its NAT entry exists).
func (tp *npTopology) victimUDP(t *testing.T, port uint16) *net.UDPConn {
	t.Helper()
	c, err := tp.dialOutside("udp4", netip.AddrPort{}, tp.nodePort(port), 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if _, err := askUDP(c, "who", 5); err != nil {
		t.Fatalf("the victim's UDP flow to port %d gets no answer: %v", port, err)
	}
	return c.(*net.UDPConn)
}

// readForged reads what c gets within d and reports whether any datagram
// carried "forged".
func readForged(c *net.UDPConn, d time.Duration) bool {
	buf := make([]byte, 64)
	deadline := time.Now().Add(d)
	for {
		_ = c.SetReadDeadline(deadline)
		n, err := c.Read(buf)
		if err != nil {
			return false
		}
		if string(buf[:n]) == "forged" {
			return true
		}
	}
}

// TestPrivilegedNodePortForgedReplyUplink: a host on the uplink's wire
// (the outside namespace, raw socket) forges replies of the remote
// backend (source 10.78.2.20:8080, the pod of node 2) to node 1's NAT
// port of another client's connection:
//
//   - UDP with a payload, to be translated into the victim's flow: it
//     does not reach the victim, and is dropped with 132 "Invalid source
//     ip" (it did not come from node 2, the backend's next hop);
//   - TCP RST with a random sequence number, to close the victim's NAT
//     entry (np_track would close it without looking at the sequence): the
//     entry stays open, the connection echoes.
//
// The backend's real replies still pass. Without np_from_next_hop in
// nodeport_rev_nat_uplink the forged datagram reaches the victim and the
// RST closes the entry, and the test fails.
func TestPrivilegedNodePortForgedReplyUplink(t *testing.T) {
	tp := newNPTopology(t, false)
	const udpPort, tcpPort = 30120, 30121
	tp.service(t, udpPort, syscall.IPPROTO_UDP, svcNodePort, 12)
	tp.service(t, tcpPort, syscall.IPPROTO_TCP, svcNodePort, 2)
	raw := newRawSender(t, tp.outside)

	victim := tp.victimUDP(t, udpPort)
	nat := natOf(t, tp.n1.m, udpPort, uint16(victim.LocalAddr().(*net.UDPAddr).Port))
	if addrOfBE(nat.Entry.Backend) != npRemote {
		t.Fatalf("UDP flow went to %s, want the remote backend", addrOfBE(nat.Entry.Backend))
	}
	backend := netip.AddrPortFrom(npRemote, npBackendPort)
	natDst := netip.AddrPortFrom(addrOfBE(nat.Entry.NatAddr), htons(nat.Entry.NatPort))
	before := dropCount(t, tp.n1.m, maps.DropInvalidSourceIP)
	for range 3 {
		if err := raw.send(forgedPacket(backend, natDst, syscall.IPPROTO_UDP, 0, 0, []byte("forged"))); err != nil {
			t.Fatal(err)
		}
	}
	if readForged(victim, time.Second) {
		t.Error("a forged reply of the backend was translated into the victim's UDP flow")
	}
	if after := dropCount(t, tp.n1.m, maps.DropInvalidSourceIP); after < before+3 {
		t.Errorf("drop counter 132 %d -> %d, want the 3 forged replies counted", before, after)
	}
	// The real backend still answers the victim.
	if _, err := victim.Write([]byte("who")); err != nil {
		t.Fatal(err)
	}
	_ = victim.SetReadDeadline(time.Now().Add(2 * time.Second))
	if _, err := victim.Read(make([]byte, 64)); err != nil {
		t.Errorf("the backend's real reply after the attack: %v", err)
	}

	conn, _, err := tp.dialConn(outsideIP, tcpPort, 3*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	tnat := natOf(t, tp.n1.m, tcpPort, uint16(localPortOf(conn)))
	tdst := netip.AddrPortFrom(addrOfBE(tnat.Entry.NatAddr), htons(tnat.Entry.NatPort))
	if err := raw.send(forgedPacket(backend, tdst, syscall.IPPROTO_TCP, 0x04, 12345, nil)); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	if e := natOf(t, tp.n1.m, tcpPort, uint16(localPortOf(conn))); e.Entry.Flags&0x4 != 0 {
		t.Errorf("a forged RST closed the victim's NAT entry (flags %#x)", e.Entry.Flags)
	}
	if err := roundTrip(conn, "still"); err != nil {
		t.Errorf("the victim's TCP connection after a forged RST: %v", err)
	}
}

// TestPrivilegedNodePortForgedReplyFromPod: a pod on node 1 with
// CAP_NET_RAW (raw socket in its namespace) forges, toward another
// client's connection through the local backend l:
//
//   - a reply of l (source 10.78.1.20:8080) to node 1's NAT port;
//   - a reply of the Service frontend (node 1:port) straight to the
//     client's port.
//
// Both are dropped by the pod's own source validation in
// cil_from_container, before the reverse translation, with 132 "Invalid
// source ip", and the victim gets neither. With the source check of
// lxc.c disabled the forged reply reaches the victim and the test fails.
func TestPrivilegedNodePortForgedReplyFromPod(t *testing.T) {
	tp := newNPTopology(t, false)
	const udpPort = 30122
	tp.service(t, udpPort, syscall.IPPROTO_UDP, svcNodePort, 11)
	attacker := tp.n1.localPod(t, "npa", netip.MustParseAddr("10.78.1.66"), npIDL+10, 43, []policy.Entry{allowAllEgress, allowAllIngress})
	raw := newRawSender(t, attacker.ns)

	victim := tp.victimUDP(t, udpPort)
	vport := uint16(victim.LocalAddr().(*net.UDPAddr).Port)
	nat := natOf(t, tp.n1.m, udpPort, vport)
	if addrOfBE(nat.Entry.Backend) != npLocalIP {
		t.Fatalf("UDP flow went to %s, want the local backend", addrOfBE(nat.Entry.Backend))
	}
	before := dropCount(t, tp.n1.m, maps.DropInvalidSourceIP)
	for _, pkt := range [][]byte{
		forgedPacket(netip.AddrPortFrom(npLocalIP, npBackendPort),
			netip.AddrPortFrom(addrOfBE(nat.Entry.NatAddr), htons(nat.Entry.NatPort)), syscall.IPPROTO_UDP, 0, 0, []byte("forged")),
		forgedPacket(netip.AddrPortFrom(tp.n1.ip, udpPort), netip.AddrPortFrom(outsideIP, vport), syscall.IPPROTO_UDP, 0, 0, []byte("forged")),
	} {
		if err := raw.send(pkt); err != nil {
			t.Fatal(err)
		}
	}
	if readForged(victim, time.Second) {
		t.Error("a reply forged by a pod reached the victim")
	}
	if after := dropCount(t, tp.n1.m, maps.DropInvalidSourceIP); after < before+2 {
		t.Errorf("drop counter 132 %d -> %d, want both forged replies counted", before, after)
	}
}

// TestPrivilegedNodePortSpoofedLocalClient: a host on the wire sends a
// SYN to a NodePort from the address of a default-deny pod of node 1 (Z,
// 10.78.1.30), so that the backend's replies would be translated and
// sent, from the frontend, into Z. The SYN is dropped with 132 before any
// NAT entry is made (a pod's packets never arrive on an uplink); behind
// that, Z's ingress policy would still drop the replies with 133. Without
// the check in cil_from_netdev the entry is made and the test fails.
func TestPrivilegedNodePortSpoofedLocalClient(t *testing.T) {
	tp := newNPTopology(t, false)
	const port = 30123
	tp.service(t, port, syscall.IPPROTO_TCP, svcNodePort, 1)
	z := netip.MustParseAddr("10.78.1.30")
	tp.n1.localPod(t, "npz", z, npIDL+11, 44, nil)
	raw := newRawSender(t, tp.outside)
	before := dropCount(t, tp.n1.m, maps.DropInvalidSourceIP)
	for i := range 3 {
		if err := raw.send(synPacket(netip.AddrPortFrom(z, uint16(40000+i)), netip.AddrPortFrom(tp.n1.ip, port), 1)); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(300 * time.Millisecond)
	conns, err := tp.n1.m.NodePortConnections()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range conns {
		if addrOfBE(c.Key.Client) == z {
			t.Errorf("a NodePort connection from the local pod's address was opened: %+v", c)
		}
	}
	if after := dropCount(t, tp.n1.m, maps.DropInvalidSourceIP); after < before+3 {
		t.Errorf("drop counter 132 %d -> %d, want the 3 SYNs counted", before, after)
	}
	// A real client still connects.
	if _, err := tp.dialFrom(outsideIP, port, 3*time.Second); err != nil {
		t.Errorf("a real client: %v", err)
	}
}

// TestPrivilegedNodePortOneWayUDP: a UDP flow whose backend never answers
// (a port nothing listens on at the remote backend: its ICMP errors are
// not translated) keeps its reverse entry, and so its SNAT port, alive
// while the client sends: the client's datagrams refresh both entries.
// The reverse entry is aged to expire in 2 s, the client sends once more,
// and the entry lives CT_LIFETIME_NONTCP again. Before, only the client's
// entry was refreshed: 60 s after the flow began its port was free for
// another client of the same backend, which then got this client's
// answers.
func TestPrivilegedNodePortOneWayUDP(t *testing.T) {
	tp := newNPTopology(t, false)
	const port, silentID = 30124, 20
	if err := tp.lb.Backends.Update([]uint32{silentID}, []lb.L4Addr{{Addr: npRemote, Port: 9999, Proto: syscall.IPPROTO_UDP}}); err != nil {
		t.Fatal(err)
	}
	tp.service(t, port, syscall.IPPROTO_UDP, svcNodePort, silentID)
	c, err := tp.dialOutside("udp4", netip.AddrPort{}, tp.nodePort(port), 0)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write([]byte("one-way")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	nat := natOf(t, tp.n1.m, port, uint16(c.LocalAddr().(*net.UDPAddr).Port))
	rk := bpf.NodeportNodeportRev4Key{Backend: nat.Entry.Backend, NatAddr: nat.Entry.NatAddr, BackendPort: nat.Entry.BackendPort,
		NatPort: nat.Entry.NatPort, Proto: syscall.IPPROTO_UDP}
	var rev bpf.NodeportNodeportRev4Entry
	if err := tp.n1.m.NodePortRev4.Lookup(&rk, &rev); err != nil {
		t.Fatal(err)
	}
	now := uint64(monotonicNow(t))
	rev.Expires = now + 2e9
	if err := tp.n1.m.NodePortRev4.Update(&rk, &rev, ebpf.UpdateExist); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Write([]byte("one-way")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	if err := tp.n1.m.NodePortRev4.Lookup(&rk, &rev); err != nil {
		t.Fatal(err)
	}
	if rev.Expires <= now+50e9 {
		t.Errorf("the reverse entry expires %v after the client's datagram, want about 60 s", time.Duration(rev.Expires-now))
	}
}
