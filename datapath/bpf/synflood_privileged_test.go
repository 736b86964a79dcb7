package bpf_test

import (
	"context"
	"encoding/binary"
	"math/rand/v2"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"golang.org/x/sys/unix"

	"github.com/cellium/cellium/datapath/bpf"
	"github.com/cellium/cellium/datapath/ctgc"
	"github.com/cellium/cellium/datapath/maps"
)

// synPacket is an IPv4 TCP SYN from src to dst with correct checksums,
// for a raw socket with IP_HDRINCL.
func synPacket(src, dst netip.AddrPort, seq uint32) []byte {
	return forgedPacket(src, dst, syscall.IPPROTO_TCP, 0x02, seq, nil)
}

// forgedPacket is an IPv4 TCP (with tcpFlags and seq) or UDP packet from
// src to dst carrying payload, with correct checksums, for a raw socket
// with IP_HDRINCL.
func forgedPacket(src, dst netip.AddrPort, proto, tcpFlags uint8, seq uint32, payload []byte) []byte {
	hl := 8
	if proto == syscall.IPPROTO_TCP {
		hl = 20
	}
	b := make([]byte, 20+hl+len(payload))
	b[0] = 0x45
	binary.BigEndian.PutUint16(b[2:], uint16(len(b)))
	b[8] = 64
	b[9] = proto
	s, d := src.Addr().As4(), dst.Addr().As4()
	copy(b[12:16], s[:])
	copy(b[16:20], d[:])
	binary.BigEndian.PutUint16(b[10:], inetChecksum(b[:20]))
	l4 := b[20:]
	binary.BigEndian.PutUint16(l4[0:], src.Port())
	binary.BigEndian.PutUint16(l4[2:], dst.Port())
	csum := 6
	if proto == syscall.IPPROTO_TCP {
		binary.BigEndian.PutUint32(l4[4:], seq)
		l4[12] = 5 << 4
		l4[13] = tcpFlags
		binary.BigEndian.PutUint16(l4[14:], 64240)
		csum = 16
	} else {
		binary.BigEndian.PutUint16(l4[4:], uint16(len(l4)))
	}
	copy(l4[hl:], payload)
	pseudo := make([]byte, 0, 12+len(l4))
	pseudo = append(pseudo, s[:]...)
	pseudo = append(pseudo, d[:]...)
	pseudo = append(pseudo, 0, proto, byte(len(l4)>>8), byte(len(l4)))
	pseudo = append(pseudo, l4...)
	binary.BigEndian.PutUint16(l4[csum:], inetChecksum(pseudo))
	return b
}

// rawSender is a raw IPv4 socket (IP_HDRINCL) of a namespace: what a pod
// or an outside host with CAP_NET_RAW forges packets with.
type rawSender struct{ fd int }

func newRawSender(tb testing.TB, netns ns.NetNS) *rawSender {
	tb.Helper()
	var fd int
	err := netns.Do(func(ns.NetNS) error {
		var err error
		fd, err = unix.Socket(unix.AF_INET, unix.SOCK_RAW, unix.IPPROTO_RAW)
		return err
	})
	if err != nil {
		tb.Fatalf("raw socket: %v", err)
	}
	tb.Cleanup(func() { unix.Close(fd) })
	return &rawSender{fd: fd}
}

// send sends an IPv4 packet (header included) to its destination.
func (r *rawSender) send(pkt []byte) error {
	var to unix.SockaddrInet4
	copy(to.Addr[:], pkt[16:20])
	return unix.Sendto(r.fd, pkt, 0, &to)
}

// natEntries counts the entries of the NodePort NAT maps.
func natEntries(tb testing.TB, m *maps.Maps) (fwd, rev int) {
	tb.Helper()
	ct, rv := m.NodePortCT4Expiry(), m.NodePortRev4Expiry()
	if err := ct.Iterate(func(_ bpf.NodeportNodeportCt4Key, _ uint64) bool { fwd++; return true }); err != nil {
		tb.Fatal(err)
	}
	if err := rv.Iterate(func(_ bpf.NodeportNodeportRev4Key, _ uint64) bool { rev++; return true }); err != nil {
		tb.Fatal(err)
	}
	return fwd, rev
}

// natGC is the agent's GC pass over both NAT maps with the clock moved
// by skew (the programs' clock plus skew): the entries that expire within
// skew are deleted. It returns the number deleted.
func natGC(tb testing.TB, m *maps.Maps, skew time.Duration) int {
	tb.Helper()
	clock := func() (uint64, error) {
		now, err := ctgc.Monotonic()
		return now + uint64(skew), err
	}
	ct, rev := m.NodePortCT4Expiry(), m.NodePortRev4Expiry()
	deleted := 0
	for _, g := range []*ctgc.GC{
		ctgc.NewExpiring(ct, maps.NodePortCT4MapName, ct.Capacity(), clock, nil),
		ctgc.NewExpiring(rev, maps.NodePortRev4MapName, rev.Capacity(), clock, nil),
	} {
		res, err := g.Run(context.Background())
		if err != nil {
			tb.Fatal(err)
		}
		deleted += res.Deleted
	}
	return deleted
}

// TestPrivilegedNodePortSYNFlood: an outside host with a raw socket sends
// SYNs from random spoofed addresses and ports (198.18.0.0/15) to an
// externalTrafficPolicy Local NodePort until cellium_nodeport_ct4 and
// cellium_nodeport_rev4 (65536 entries each) are full. Then:
//
//   - a connection established before the flood (another NodePort,
//     Cluster) still echoes: a full map evicts nothing;
//   - a new connection fails cleanly and is counted: 167 "No mapping for
//     NAT masquerade" on the Cluster frontend (no SNAT port can be
//     reserved), 155 "CT: Map insertion failed" on the Local one;
//   - every flood entry expires within CT_LIFETIME_SYN (60 s) of its last
//     packet; the agent's GC pass as 125 s later (its clock moved, not the
//     test's; the backend retransmits its SYN-ACKs for 63 s) deletes them
//     all and keeps the established connection's, and new connections
//     work again.
//
// With the maps LRU (as before) the new connections during the flood get
// through by evicting entries and the test fails; with the flood's entries
// living CT_LIFETIME_TCP (6 h, as before) the GC frees nothing and the
// connections after it fail.
func TestPrivilegedNodePortSYNFlood(t *testing.T) {
	tp := newNPTopology(t, false)
	const cluster, local = 30110, 30111
	tp.service(t, cluster, syscall.IPPROTO_TCP, svcNodePort, 1)
	tp.service(t, local, syscall.IPPROTO_TCP, svcNodePort|svcLocal, 1)

	est, _, err := tp.dialConn(outsideIP, cluster, 3*time.Second)
	if err != nil {
		t.Fatalf("connection before the flood: %v", err)
	}
	defer est.Close()
	if err := roundTrip(est, "before"); err != nil {
		t.Fatalf("echo before the flood: %v", err)
	}

	capacity := int(tp.n1.m.NodePortCT4.MaxEntries())
	raw := newRawSender(t, tp.outside)
	dst := netip.AddrPortFrom(tp.n1.ip, local)
	// Distinct spoofed sources: a random permutation of 131072 addresses,
	// each with a random port.
	perm := rand.Perm(1 << 17)
	sent, start := 0, time.Now()
	for fwd := 0; fwd < capacity; {
		for range 8192 {
			if sent == len(perm) {
				t.Fatalf("%d SYNs sent, the map holds %d of %d", sent, fwd, capacity)
			}
			a := [4]byte{198, 18, 0, 0}
			binary.BigEndian.PutUint32(a[:], binary.BigEndian.Uint32(a[:])+uint32(perm[sent]))
			src := netip.AddrPortFrom(netip.AddrFrom4(a), uint16(1024+rand.IntN(60000)))
			if err := raw.send(synPacket(src, dst, rand.Uint32())); err != nil {
				t.Fatalf("send SYN %d: %v", sent, err)
			}
			sent++
		}
		fwd, _ = natEntries(t, tp.n1.m)
	}
	fwd, rev := natEntries(t, tp.n1.m)
	t.Logf("flood: %d SYNs in %v filled the NAT maps (%d/%d forward, %d reverse)", sent, time.Since(start).Round(time.Millisecond), fwd, capacity, rev)
	if rev != capacity {
		t.Errorf("cellium_nodeport_rev4 holds %d, want it full (%d)", rev, capacity)
	}

	if err := roundTrip(est, "during"); err != nil {
		t.Errorf("the connection established before the flood: %v", err)
	}
	for _, c := range []struct {
		port   uint16
		reason uint8
	}{{cluster, maps.DropNATNoMapping}, {local, maps.DropCTCreateFailed}} {
		before := dropCount(t, tp.n1.m, c.reason)
		if _, err := tp.dialFrom(outsideIP, c.port, time.Second); err == nil {
			t.Errorf("a new connection to port %d got through a full NAT map", c.port)
		}
		if after := dropCount(t, tp.n1.m, c.reason); after <= before {
			t.Errorf("port %d: drop counter %d %d -> %d, want the SYNs counted", c.port, c.reason, before, after)
		}
	}

	// The documented timeout: nothing of the flood lives longer than
	// CT_LIFETIME_SYN after its last packet (the backend's SYN-ACK
	// retransmissions count), only the established connection's entries
	// (one each way) do.
	now := uint64(monotonicNow(t))
	long := 0
	for _, it := range []func(func(uint64) bool) error{
		func(f func(uint64) bool) error {
			return tp.n1.m.NodePortCT4Expiry().Iterate(func(_ bpf.NodeportNodeportCt4Key, e uint64) bool { return f(e) })
		},
		func(f func(uint64) bool) error {
			return tp.n1.m.NodePortRev4Expiry().Iterate(func(_ bpf.NodeportNodeportRev4Key, e uint64) bool { return f(e) })
		},
	} {
		if err := it(func(e uint64) bool {
			if e > now+uint64(61*time.Second) {
				long++
			}
			return true
		}); err != nil {
			t.Fatal(err)
		}
	}
	if long > 2 {
		t.Errorf("%d NAT entries live longer than CT_LIFETIME_SYN, want only the established connection's 2", long)
	}
	// The GC 125 s later: 60 s after the last SYN-ACK the backend may
	// still retransmit (63 s after its SYN with Linux's 5 retries).
	deleted := natGC(t, tp.n1.m, 125*time.Second)
	fwd, rev = natEntries(t, tp.n1.m)
	t.Logf("GC as 125 s later: %d entries deleted, %d forward and %d reverse left", deleted, fwd, rev)
	if fwd > 1 || rev > 1 {
		t.Errorf("after the GC %d forward and %d reverse entries are left, want only the established connection's", fwd, rev)
	}
	if err := roundTrip(est, "after"); err != nil {
		t.Errorf("the established connection after the GC: %v", err)
	}
	for _, port := range []uint16{cluster, local} {
		if _, err := tp.dialFrom(outsideIP, port, 3*time.Second); err != nil {
			t.Errorf("a new connection to port %d after the GC: %v", port, err)
		}
	}
}
