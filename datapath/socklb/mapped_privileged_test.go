package socklb

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/cellium/cellium/datapath/bpf"
	"github.com/cellium/cellium/datapath/maps"
	"github.com/cellium/cellium/statedb/lb"
	"github.com/cellium/cellium/test/privileged"
)

// runMappedItem runs the child items of the v4-mapped tests; it reports
// false for other kinds. Each uses a dual-stack AF_INET6 socket
// (IPV6_V6ONLY off, as Java's and most runtimes' default sockets), made
// with the system calls themselves: Go's net package would pick an
// AF_INET socket for a v4-mapped address.
//
//	tcp6=[ADDR]:port    connect, send, read the answer; print
//	                    "tcp6 <peer> <answer>" (getpeername)
//	udp6=[ADDR]:port    connected UDP: send, recvfrom; print
//	                    "udp6 <peer> <answer> <from>"
//	udp6to=[ADDR]:port  unconnected UDP: sendto, recvfrom; print
//	                    "udp6to <answer> <from>"
//
// A failed connect or sendto prints "<kind> <errno name>".
func runMappedItem(kind, arg string) (bool, error) {
	var typ int
	switch kind {
	case "tcp6":
		typ = unix.SOCK_STREAM
	case "udp6", "udp6to":
		typ = unix.SOCK_DGRAM
	default:
		return false, nil
	}
	ap, err := netip.ParseAddrPort(arg)
	if err != nil {
		return true, err
	}
	to := &unix.SockaddrInet6{Port: int(ap.Port()), Addr: ap.Addr().As16()}
	fd, err := unix.Socket(unix.AF_INET6, typ|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return true, err
	}
	defer unix.Close(fd)
	// Dual stack whatever net.ipv6.bindv6only says; 3 s for connect,
	// send and receive.
	tv := unix.Timeval{Sec: 3}
	if err := errors.Join(unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_V6ONLY, 0),
		unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_SNDTIMEO, &tv),
		unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)); err != nil {
		return true, err
	}
	var peer string
	if kind == "udp6to" {
		err = unix.Sendto(fd, []byte("?"), 0, to)
	} else {
		err = unix.Connect(fd, to)
		if err == nil {
			var sa unix.Sockaddr
			if sa, err = unix.Getpeername(fd); err == nil {
				peer = sockaddrString(sa)
				_, err = unix.Write(fd, []byte("?"))
			}
		}
	}
	var errno unix.Errno
	if errors.As(err, &errno) {
		fmt.Println(kind, unix.ErrnoName(errno))
		return true, nil
	}
	if err != nil {
		return true, err
	}
	buf := make([]byte, 64)
	if kind == "tcp6" {
		// The server answers and closes.
		n := 0
		for {
			m, err := unix.Read(fd, buf[n:])
			if err != nil {
				return true, fmt.Errorf("read: %w", err)
			}
			if m == 0 {
				break
			}
			n += m
		}
		fmt.Println(kind, peer, string(buf[:n]))
		return true, nil
	}
	// recvfrom on the connected socket too: recvmsg6 runs whenever the
	// application asks for the source.
	n, from, err := unix.Recvfrom(fd, buf, 0)
	if err != nil {
		return true, fmt.Errorf("recvfrom: %w", err)
	}
	if kind == "udp6" {
		fmt.Println(kind, peer, string(buf[:n]), sockaddrString(from))
	} else {
		fmt.Println(kind, string(buf[:n]), sockaddrString(from))
	}
	return true, nil
}

func sockaddrString(sa unix.Sockaddr) string {
	switch a := sa.(type) {
	case *unix.SockaddrInet6:
		return netip.AddrPortFrom(netip.AddrFrom16(a.Addr), uint16(a.Port)).String()
	case *unix.SockaddrInet4:
		return netip.AddrPortFrom(netip.AddrFrom4(a.Addr), uint16(a.Port)).String()
	}
	return fmt.Sprintf("%T", sa)
}

// mapped is fe's address as a dual-stack socket writes it,
// [::ffff:a.b.c.d]:port.
func mapped(fe lb.L4Addr) string {
	return netip.AddrPortFrom(netip.AddrFrom16(fe.Addr.As16()), fe.Port).String()
}

// TestPrivilegedSocketLBMappedV4: a client in a network namespace of its
// own (only lo up: an untranslated ClusterIP is unreachable there, so a
// reached backend proves the translation), in the test's cgroup, with
// dual-stack AF_INET6 sockets. To a frontend written as
// [::ffff:ClusterIP]:port, TCP (connect6), connected UDP (connect6) and
// unconnected UDP (the kernel runs sendmsg4 for a v4-mapped sendto) reach
// the backend on the namespace's loopback, and the application sees
// [::ffff:ClusterIP]:port as its peer (getpeername6) and as the datagrams'
// source (recvmsg6); a frontend without backends fails with EHOSTUNREACH,
// as for AF_INET. Untouched: a v4-mapped address that is
// no frontend, a real IPv6 address ([::1]), and an IPv6 address whose low
// 32 bits are the ClusterIP ([::ClusterIP], [64:ff9b::ClusterIP]: only
// ::ffff:0:0/96 is IPv4).
func TestPrivilegedSocketLBMappedV4(t *testing.T) {
	privileged.Require(t)
	e := newLBEnv(t)
	x := byte(os.Getpid()%250) + 1
	vip := netip.AddrFrom4([4]byte{198, 18, x, 30})
	empty := netip.AddrFrom4([4]byte{198, 18, x, 31})
	loop := netip.MustParseAddr("127.0.0.1")
	const port, port6 = 18081, 18084
	tcpFE := lb.L4Addr{Addr: vip, Port: 80, Proto: lb.TCP}
	udpFE := lb.L4Addr{Addr: vip, Port: 53, Proto: lb.UDP}
	e.addBackends([]uint32{1, 2}, []lb.L4Addr{{Addr: loop, Port: port, Proto: lb.TCP}, {Addr: loop, Port: port, Proto: lb.UDP}})
	e.frontend(tcpFE, false, 0, 1)
	e.frontend(udpFE, false, 0, 2)
	e.frontend(lb.L4Addr{Addr: empty, Port: 80, Proto: lb.TCP}, false, 0)
	c := e.newClient()

	tcp, udp := mapped(tcpFE), mapped(udpFE)
	beMapped := "[::ffff:127.0.0.1]:" + strconv.Itoa(port)
	one6 := "[::1]:" + strconv.Itoa(port6)
	compat := netip.AddrPortFrom(netip.AddrFrom16([16]byte{12: 198, 13: 18, 14: x, 15: 30}), 80).String()
	nat64 := netip.AddrPortFrom(netip.AddrFrom16([16]byte{0: 0, 1: 0x64, 2: 0xff, 3: 0x9b, 12: 198, 13: 18, 14: x, 15: 30}), 80).String()
	steps := []struct{ item, want string }{
		{"tcp6=" + tcp, fmt.Sprintf("tcp6 %s %d", tcp, port)},
		{"udp6=" + udp, fmt.Sprintf("udp6 %s %d %s", udp, port, udp)},
		{"udp6to=" + udp, fmt.Sprintf("udp6to %d %s", port, udp)},
		{"tcp6=" + mapped(lb.L4Addr{Addr: empty, Port: 80}), "tcp6 EHOSTUNREACH"},
		{"tcp6=" + beMapped, fmt.Sprintf("tcp6 %s %d", beMapped, port)},
		{"udp6to=" + beMapped, fmt.Sprintf("udp6to %d %s", port, beMapped)},
		{"tcp6=" + one6, fmt.Sprintf("tcp6 %s %d", one6, port6)},
		{"udp6=" + one6, fmt.Sprintf("udp6 %s %d %s", one6, port6, one6)},
		{"udp6to=" + one6, fmt.Sprintf("udp6to %d %s", port6, one6)},
		{"tcp6=" + compat, "tcp6 ENETUNREACH"},
		{"tcp6=" + nat64, "tcp6 ENETUNREACH"},
		{"udp6to=" + compat, "udp6to ENETUNREACH"},
	}
	items := []string{"netns=" + c.netns.Path(), "serve=" + strconv.Itoa(port), "serve6=" + strconv.Itoa(port6)}
	var want []string
	for _, s := range steps {
		items = append(items, s.item)
		want = append(want, s.want)
	}
	out := child(t, e.cg, strings.Join(items, ","))
	t.Logf("client:\n%s", out)
	got := strings.Split(strings.TrimSpace(out), "\n")
	for i, s := range steps {
		if i >= len(got) {
			t.Errorf("%s: no answer", s.item)
			continue
		}
		if got[i] != s.want {
			t.Errorf("%s: %q, want %q", s.item, got[i], s.want)
		}
	}
	if len(got) > len(steps) {
		t.Errorf("client printed %d lines, want %d", len(got), len(steps))
	}
	// The translation is remembered under the socket and the backend's
	// IPv4 address, as for AF_INET: the reverse entries name the frontends.
	fronts := map[lb.L4Addr]bool{}
	var rk bpf.SockLb4ReverseSkKey
	var rv bpf.SockLb4ReverseSkValue
	it := e.m.ReverseSK.Iterate()
	for it.Next(&rk, &rv) {
		// Network byte order in little-endian fields.
		var a [4]byte
		binary.LittleEndian.PutUint32(a[:], rv.Address)
		fronts[lb.L4Addr{Addr: netip.AddrFrom4(a), Port: bits.ReverseBytes16(rv.Port), Proto: rv.Proto}] = true
	}
	if err := it.Err(); err != nil {
		t.Fatal(err)
	}
	if !fronts[tcpFE] || !fronts[udpFE] {
		t.Errorf("reverse entries name %v, want %v and %v", fronts, tcpFE, udpFE)
	}
}

// TestPrivilegedSocketLBMappedV4Affinity: with session affinity, a client's
// connections to [::ffff:ClusterIP]:port and to ClusterIP:port are one
// client of one frontend: the affinity entry is keyed by the network
// namespace's cookie and the IPv4 frontend whatever the socket's family.
// 20 AF_INET6 TCP connections (and 20 unconnected datagrams) reach one
// backend and the entry names it; AF_INET connections then reach that
// backend too; an entry set by hand to another backend is followed by
// AF_INET6 connections.
func TestPrivilegedSocketLBMappedV4Affinity(t *testing.T) {
	privileged.Require(t)
	e := newLBEnv(t)
	x := byte(os.Getpid()%250) + 1
	vip := netip.AddrFrom4([4]byte{198, 18, x, 40})
	tcpFE := lb.L4Addr{Addr: vip, Port: 80, Proto: lb.TCP}
	udpFE := lb.L4Addr{Addr: vip, Port: 53, Proto: lb.UDP}
	loop := netip.MustParseAddr("127.0.0.1")
	var tcpIDs, udpIDs []uint32
	var addrs []lb.L4Addr
	portID := map[uint16]uint32{} // TCP backend ID by port (UDP: +10)
	for i, p := range backendPorts {
		tcpIDs, udpIDs = append(tcpIDs, uint32(i+1)), append(udpIDs, uint32(i+11))
		addrs = append(addrs, lb.L4Addr{Addr: loop, Port: p, Proto: lb.TCP})
		portID[p] = uint32(i + 1)
	}
	for _, p := range backendPorts {
		addrs = append(addrs, lb.L4Addr{Addr: loop, Port: p, Proto: lb.UDP})
	}
	e.addBackends(append(tcpIDs, udpIDs...), addrs)
	const timeout = 60
	e.frontend(tcpFE, true, timeout, tcpIDs...)
	e.frontend(udpFE, true, timeout, udpIDs...)
	c := e.newClient()
	serve := make([]string, len(backendPorts))
	for i, p := range backendPorts {
		serve[i] = strconv.Itoa(int(p))
	}
	// ask6 runs n exchanges of kind (tcp6 or udp6to) to fe written
	// v4-mapped and returns the ports that answered.
	ask6 := func(kind string, fe lb.L4Addr, n int) []uint16 {
		t.Helper()
		items := []string{"netns=" + c.netns.Path(), "serve=" + strings.Join(serve, "/")}
		for range n {
			items = append(items, kind+"="+mapped(fe))
		}
		out := child(t, e.cg, strings.Join(items, ","))
		var ports []uint16
		for line := range strings.SplitSeq(strings.TrimSpace(out), "\n") {
			f := strings.Fields(line)
			// tcp6 <peer> <answer>; udp6to <answer> <from>.
			if len(f) != 3 || f[0] != kind || (kind == "tcp6" && f[1] != mapped(fe)) || (kind == "udp6to" && f[2] != mapped(fe)) {
				t.Fatalf("client: unexpected line %q in\n%s", line, out)
			}
			answer := f[2]
			if kind == "udp6to" {
				answer = f[1]
			}
			p, err := strconv.Atoi(answer)
			if err != nil {
				t.Fatalf("client: %q: %v", line, err)
			}
			ports = append(ports, uint16(p))
		}
		if len(ports) != n {
			t.Fatalf("client: %d answers, want %d:\n%s", len(ports), n, out)
		}
		return ports
	}

	const n = 20
	got := distinct(ask6("tcp6", tcpFE, n))
	if len(got) != 1 {
		t.Fatalf("%d AF_INET6 connections reached %v, want one backend", n, got)
	}
	v, ok := e.entry(c, tcpFE)
	if !ok || v.BackendID != portID[got[0]] {
		t.Fatalf("affinity entry of (netns %d, %v): %+v (found %v), want backend %d", c.cookie, tcpFE, v, ok, portID[got[0]])
	}
	if v4 := distinct(e.ask(c, "tcpwho", tcpFE, n)); len(v4) != 1 || v4[0] != got[0] {
		t.Errorf("AF_INET connections of the same namespace reached %v, want %d", v4, got[0])
	}
	gotUDP := distinct(ask6("udp6to", udpFE, n))
	if len(gotUDP) != 1 {
		t.Errorf("%d AF_INET6 datagrams answered by %v, want one backend", n, gotUDP)
	}
	if v, ok := e.entry(c, udpFE); !ok || v.BackendID != portID[gotUDP[0]]+10 {
		t.Errorf("affinity entry of (netns %d, %v): %+v (found %v), want backend %d", c.cookie, udpFE, v, ok, portID[gotUDP[0]]+10)
	}
	// An entry set through the IPv4 key is followed by AF_INET6 sockets.
	var other uint16
	for _, p := range backendPorts {
		if p != got[0] {
			other = p
			break
		}
	}
	if err := e.m.Affinity.Update(maps.AffinityKey{NetnsCookie: c.cookie, Frontend: tcpFE},
		maps.AffinityValue{BackendID: portID[other], LastUsed: monoNow(t) - timeout*uint64(time.Second)/2}); err != nil {
		t.Fatal(err)
	}
	if again := distinct(ask6("tcp6", tcpFE, 5)); len(again) != 1 || again[0] != other {
		t.Errorf("entry set to %d: AF_INET6 connections reached %v", other, again)
	}
	t.Logf("AF_INET6 and AF_INET connections of one namespace on backend %d; after the entry was set to %d, on %d", got[0], other, other)
}

// TestPrivilegedSocketLBUpgrade: an agent restarted over the pins of one
// with the AF_INET programs only (this package's Programs cut to them)
// updates those four links in place (same link IDs) and attaches the
// AF_INET6 ones: a dual-stack socket's connection to [::ffff:ClusterIP]
// fails (ENETUNREACH: untranslated) before and reaches the backend after.
func TestPrivilegedSocketLBUpgrade(t *testing.T) {
	privileged.Require(t)
	e := newLBEnv(t)
	all := Programs
	t.Cleanup(func() { Programs = all })
	var v4 []Program
	for _, p := range all {
		if strings.HasPrefix(p.Name, "cil_sock4_") {
			v4 = append(v4, p)
		}
	}
	if len(v4) != 4 || len(all) <= len(v4) {
		t.Fatalf("programs %v", all)
	}
	if err := Detach(e.linkDir); err != nil {
		t.Fatal(err)
	}
	Programs = v4
	if err := Attach(e.m, e.cg, e.linkDir); err != nil {
		t.Fatal(err)
	}
	ids := map[string]link.ID{}
	for _, p := range v4 {
		ids[p.Name] = pinnedLinkID(t, filepath.Join(e.linkDir, p.Name))
	}
	x := byte(os.Getpid()%250) + 1
	fe := lb.L4Addr{Addr: netip.AddrFrom4([4]byte{198, 18, x, 60}), Port: 80, Proto: lb.TCP}
	const port = 18081
	e.addBackends([]uint32{1}, []lb.L4Addr{{Addr: netip.MustParseAddr("127.0.0.1"), Port: port, Proto: lb.TCP}})
	e.frontend(fe, false, 0, 1)
	c := e.newClient()
	dial := func() string {
		return strings.TrimSpace(child(t, e.cg, fmt.Sprintf("netns=%s,serve=%d,tcp6=%s", c.netns.Path(), port, mapped(fe))))
	}
	if got := dial(); got != "tcp6 ENETUNREACH" {
		t.Fatalf("AF_INET programs only: %q, want tcp6 ENETUNREACH", got)
	}

	Programs = all
	if err := Attach(e.m, e.cg, e.linkDir); err != nil {
		t.Fatal(err)
	}
	names, err := Attached(e.linkDir)
	if err != nil || len(names) != len(all) {
		t.Fatalf("after the upgrade: pinned %v (%v), want %d", names, err, len(all))
	}
	for name, id := range ids {
		if got := pinnedLinkID(t, filepath.Join(e.linkDir, name)); got != id {
			t.Errorf("%s: link %d after the upgrade, was %d (want it updated in place)", name, got, id)
		}
	}
	if got, want := dial(), fmt.Sprintf("tcp6 %s %d", mapped(fe), port); got != want {
		t.Errorf("after the upgrade: %q, want %q", got, want)
	}
}

func pinnedLinkID(t *testing.T, pin string) link.ID {
	t.Helper()
	l, err := link.LoadPinnedLink(pin, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	info, err := l.Info()
	if err != nil {
		t.Fatal(err)
	}
	return info.ID
}
