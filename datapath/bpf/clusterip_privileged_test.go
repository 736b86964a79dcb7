package bpf_test

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"os"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"golang.org/x/sys/unix"

	"github.com/cellium/cellium/datapath/maps"
	"github.com/cellium/cellium/statedb/identity"
	"github.com/cellium/cellium/statedb/policy"
	"github.com/cellium/cellium/test/privileged"
)

// TestPrivilegedAttackClusterIPUntranslated: a pod with NET_RAW sends to a
// ClusterIP from a raw socket (or a ping socket, or a tun device's
// stack), which the socket load balancer's cgroup hooks never see. Before
// the guard the packet passed as traffic to world, and kube-proxy, had it
// been there, would have taken it to a backend the pod's egress policy
// may forbid. With the address flagged as a Service frontend in the
// ipcache (what the agent does while the socket LB is on), it drops with
// 174 before conntrack and policy, counted and reported; an unflagged
// world address still meets the policy, and replies are not affected.
func TestPrivilegedAttackClusterIPUntranslated(t *testing.T) {
	privileged.Require(t)
	b := newAttackBed(t)
	vip := netip.MustParseAddr("10.96.0.10")
	if err := b.m.IPCache.Update(netip.PrefixFrom(vip, 32),
		maps.IPCacheEntry{Identity: identity.ReservedIdentityWorld, Flags: maps.IPCacheFlagService}); err != nil {
		t.Fatal(err)
	}
	before := b.metric(t, maps.DropIsClusterIP)

	// A's egress allows anything: only the guard stops these.
	b.expectDrop(t, "A's raw ICMP echo to the ClusterIP", b.from(t, epA, packet(b.a, vip, 1, 7, 0, 0)), epA, maps.DropIsClusterIP)
	b.expectDrop(t, "A's raw UDP to the ClusterIP", b.from(t, epA, packet(b.a, vip, 17, 40000, 53, 0)), epA, maps.DropIsClusterIP)
	b.expectDrop(t, "A's TCP SYN to the ClusterIP", b.from(t, epA, packet(b.a, vip, 6, 40001, 80, tcpSYN)), epA, maps.DropIsClusterIP)
	b.expectDrop(t, "A's TCP SYN to a port the Service does not have", b.from(t, epA, packet(b.a, vip, 6, 40002, 9, tcpSYN)), epA, maps.DropIsClusterIP)
	b.expectDrop(t, "A's raw IP (protocol 253) to the ClusterIP", b.from(t, epA, packet(b.a, vip, 253, 0, 0, 0)), epA, maps.DropIsClusterIP)
	// Z's egress denies everything: the guard's reason comes first.
	b.expectDrop(t, "Z's SYN to the ClusterIP", b.from(t, epZ, packet(b.z, vip, 6, 40003, 80, tcpSYN)), epZ, maps.DropIsClusterIP)
	if got := b.metric(t, maps.DropIsClusterIP) - before; got != 6 {
		t.Errorf("cellium_metrics counts %d drops with 174 in egress, want 6", got)
	}
	for k := range b.ctEntries(t) {
		if k.Dst == vip {
			t.Errorf("a dropped packet made conntrack entry %+v", k)
		}
	}

	// The same to an unflagged world address: per policy, as before.
	b.expectPass(t, "A's raw ICMP echo to R", b.from(t, epA, packet(b.a, b.r, 1, 7, 0, 0)))
	b.expectPass(t, "A's raw UDP to R", b.from(t, epA, packet(b.a, b.r, 17, 40000, 53, 0)))
	b.expectPass(t, "A's TCP SYN to R", b.from(t, epA, packet(b.a, b.r, 6, 40001, 80, tcpSYN)))
	b.expectDrop(t, "Z's SYN to R", b.from(t, epZ, packet(b.z, b.r, 6, 40003, 80, tcpSYN)), epZ, maps.DropPolicy)

	// A packet from the address into a pod is the ingress policy's, and
	// the pod's reply to it passes as a reply: the guard is on what the
	// pod opens, after the reply fast path.
	setPolicy(t, b.pol[epA], allowAllEgress,
		policy.Entry{Key: policy.NewKey(identity.ReservedIdentityWorld, policy.Ingress, policy.ProtoTCP, 8080, 16)})
	b.expectPass(t, "a SYN from the ClusterIP's address into A", b.to(t, epA, packet(vip, b.a, 6, 33000, 8080, tcpSYN)))
	b.expectPass(t, "A's SYN-ACK to it (a reply)", b.from(t, epA, packet(b.a, vip, 6, 8080, 33000, tcpSYN|tcpACK)))
	b.expectDrop(t, "Z's SYN from the ClusterIP's address (Z accepts nothing)", b.to(t, epZ, packet(vip, b.z, 6, 33000, 8080, tcpSYN)), epZ, maps.DropPolicy)

	// Unflagged (the socket LB off), the address is world again.
	if err := b.m.IPCache.Update(netip.PrefixFrom(vip, 32), maps.IPCacheEntry{Identity: identity.ReservedIdentityWorld}); err != nil {
		t.Fatal(err)
	}
	b.expectPass(t, "A's raw UDP to the address unflagged", b.from(t, epA, packet(b.a, vip, 17, 40004, 53, 0)))
}

// metric returns the packets counted in egress with reason.
func (b *attackBed) metric(t *testing.T, reason uint8) uint64 {
	t.Helper()
	all, err := b.m.Metrics.Read()
	if err != nil {
		t.Fatal(err)
	}
	return all[maps.MetricsKey{Reason: reason, Dir: maps.DirEgress}].Packets
}

// TestPrivilegedProgramClusterIPGuard: the bypass and its guard with real
// sockets in a pod namespace and the programs attached to its veth. Pod
// a's egress policy denies pod b; an nftables DNAT in the node namespace
// (kube-proxy's rule for a ClusterIP, which the socket load balancer
// would translate at connect() had it seen the socket) takes the
// ClusterIP to b. Unflagged (the socket LB off), a's UDP and TCP to the
// ClusterIP reach b: the egress policy saw world. Flagged, they drop
// with 174 at a's cil_from_container, and so do a raw ICMP socket's echo
// and a dual-stack AF_INET6 socket's datagram to [::ffff:ClusterIP].
func TestPrivilegedProgramClusterIPGuard(t *testing.T) {
	privileged.Require(t)
	m, dir := openMaps(t)
	events := newEventReader(t, m)
	var seen []maps.Event

	node := newTestNode(t)
	a := node.addPod(t, "ga", netip.MustParseAddr("10.77.0.60"))
	b := node.addPod(t, "gb", netip.MustParseAddr("10.77.0.61"))
	const idA, idB identity.NumericIdentity = 1301, 1302
	const epA, epB uint16 = 31, 32
	registerPod(t, m, a, idA, epA)
	registerPod(t, m, b, idB, epB)
	polA, polB := openPolicy(t, dir, epA), openPolicy(t, dir, epB)
	// a: egressDeny toEndpoints b, anything else allowed.
	denyB := policy.Entry{Key: policy.NewKey(idB, policy.Egress, policy.ProtoAny, 0, 0), Deny: true}
	if err := polA.BatchUpdate([]policy.Entry{allowAllEgress, denyB}); err != nil {
		t.Fatal(err)
	}
	if err := polB.BatchUpdate([]policy.Entry{allowAllIngress, allowAllEgress}); err != nil {
		t.Fatal(err)
	}
	node.attach(t, a, loadEndpoint(t, m, polA, endpointConfig{ID: epA, Identity: idA, IfIndex: uint32(a.res.HostIfIndex), MAC: a.res.PodMAC, IPv4: a.ip}))
	node.attach(t, b, loadEndpoint(t, m, polB, endpointConfig{ID: epB, Identity: idB, IfIndex: uint32(b.res.HostIfIndex), MAC: b.res.PodMAC, IPv4: b.ip}))
	b.serveEcho(t, 8080)
	vip := netip.AddrPortFrom(netip.MustParseAddr("10.77.9.10"), 80)
	privileged.DNAT(t, node.ns.Path(), fmt.Sprintf("cellium-test-clusterip-%d", os.Getpid()), vip, netip.AddrPortFrom(b.ip, 8080))

	// Unflagged: the egress policy sees world, the DNAT takes it to b.
	if err := a.udpEcho(vip); err != nil {
		t.Fatalf("unflagged, udp a->%s: %v; want it through the DNAT (the bypass the guard closes)", vip, err)
	}
	if err := a.tcpEcho(vip); err != nil {
		t.Fatalf("unflagged, tcp a->%s: %v", vip, err)
	}

	if err := m.IPCache.Update(netip.PrefixFrom(vip.Addr(), 32),
		maps.IPCacheEntry{Identity: identity.ReservedIdentityWorld, Flags: maps.IPCacheFlagService}); err != nil {
		t.Fatal(err)
	}
	expect174 := func(what string, proto uint8, send func() error) {
		t.Helper()
		errc := make(chan error, 1)
		go func() { errc <- send() }()
		ev := events.waitFor(t, "drop of "+what, &seen, func(e maps.Event) bool {
			return e.Type == maps.EventDrop && e.Proto == proto && e.Dst == vip.Addr()
		})
		if ev.Reason != maps.DropIsClusterIP || ev.EndpointID != epA || ev.Dir != maps.DirEgress || ev.Src != a.ip {
			t.Errorf("%s: drop event %v, want 174 (Is a ClusterIP) from endpoint %d, egress", what, ev, epA)
		}
		if err := <-errc; err == nil {
			t.Errorf("%s: got an answer through the DNAT", what)
		}
	}
	expect174("UDP", 17, func() error { return a.udpEcho(vip) })
	expect174("TCP", 6, func() error { return a.tcpEcho(vip) })
	expect174("raw ICMP echo", 1, func() error { return a.rawPing(vip.Addr()) })
	expect174("dual-stack UDP to [::ffff:ClusterIP]", 17, func() error { return a.mappedUDP(vip) })
}

// rawPing sends one ICMP echo request from a SOCK_RAW socket (what ping
// with NET_RAW does) and waits 1 s for the echo reply.
func (p *testPod) rawPing(dst netip.Addr) error {
	return p.ns.Do(func(ns.NetNS) error {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_RAW, unix.IPPROTO_ICMP)
		if err != nil {
			return fmt.Errorf("raw socket: %w", err)
		}
		defer unix.Close(fd)
		msg := []byte{8, 0, 0, 0, 0x12, 0x34, 0, 1, 'c', 'e', 'l', 'l'}
		binary.BigEndian.PutUint16(msg[2:], inetChecksum(msg))
		if err := unix.Sendto(fd, msg, 0, &unix.SockaddrInet4{Addr: dst.As4()}); err != nil {
			return fmt.Errorf("sendto %s: %w", dst, err)
		}
		tv := unix.NsecToTimeval(1e9)
		if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
			return err
		}
		buf := make([]byte, 128)
		for {
			n, _, err := unix.Recvfrom(fd, buf, 0)
			if err != nil {
				return fmt.Errorf("no echo reply: %w", err)
			}
			// The IPv4 header, then ICMP: type 0 is the reply.
			if ihl := int(buf[0]&0x0f) * 4; n > ihl && buf[ihl] == 0 {
				return nil
			}
		}
	})
}

// mappedUDP sends a datagram to dst from a dual-stack AF_INET6 socket
// (IPV6_V6ONLY off) as [::ffff:a.b.c.d]:port and waits 1 s for an answer.
func (p *testPod) mappedUDP(dst netip.AddrPort) error {
	return p.ns.Do(func(ns.NetNS) error {
		fd, err := unix.Socket(unix.AF_INET6, unix.SOCK_DGRAM, 0)
		if err != nil {
			return fmt.Errorf("AF_INET6 socket: %w", err)
		}
		defer unix.Close(fd)
		if err := unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_V6ONLY, 0); err != nil {
			return err
		}
		sa := &unix.SockaddrInet6{Port: int(dst.Port()), Addr: dst.Addr().As16()} // ::ffff:a.b.c.d
		if err := unix.Sendto(fd, []byte("cellium-udp"), 0, sa); err != nil {
			return fmt.Errorf("sendto [::ffff:%s]: %w", dst, err)
		}
		tv := unix.NsecToTimeval(1e9)
		if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
			return err
		}
		buf := make([]byte, 64)
		if _, _, err := unix.Recvfrom(fd, buf, 0); err != nil {
			return fmt.Errorf("no answer: %w", err)
		}
		return nil
	})
}

// inetChecksum is the Internet checksum of b (RFC 1071).
func inetChecksum(b []byte) uint16 {
	var sum uint32
	for i := 0; i+1 < len(b); i += 2 {
		sum += uint32(binary.BigEndian.Uint16(b[i:]))
	}
	if len(b)%2 == 1 {
		sum += uint32(b[len(b)-1]) << 8
	}
	for sum>>16 != 0 {
		sum = sum&0xffff + sum>>16
	}
	return ^uint16(sum)
}
