package socklb

import (
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cilium/statedb"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/containernetworking/plugins/pkg/testutils"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/cellium/cellium/datapath/lbsync"
	"github.com/cellium/cellium/datapath/maps"
	"github.com/cellium/cellium/statedb/lb"
	"github.com/cellium/cellium/statedb/reconciler"
	"github.com/cellium/cellium/test/privileged"
)

// runAffinityItem runs the child items of the session affinity test
// (see runChild); it reports false for other kinds.
func runAffinityItem(kind, arg string) (bool, error) {
	switch kind {
	case "netns":
		// Sockets belong to the namespace of the thread that creates
		// them: this goroutine creates them all, on this thread.
		runtime.LockOSThread()
		f, err := os.Open(arg)
		if err != nil {
			return true, err
		}
		defer f.Close()
		return true, unix.Setns(int(f.Fd()), unix.CLONE_NEWNET)
	case "serve", "serve6":
		host := "127.0.0.1"
		if kind == "serve6" {
			host = "::1"
		}
		for p := range strings.SplitSeq(arg, "/") {
			if err := serveOwnPort(net.JoinHostPort(host, p)); err != nil {
				return true, err
			}
		}
		return true, nil
	case "tcpwho", "udpwho":
		addr, count, _ := strings.Cut(arg, "*")
		n, err := strconv.Atoi(count)
		if err != nil {
			return true, err
		}
		buf := make([]byte, 64)
		deadline := time.Now().Add(3 * time.Second)
		if kind == "tcpwho" {
			for range n {
				c, err := net.DialTimeout("tcp4", addr, 3*time.Second)
				if err != nil {
					return true, err
				}
				_ = c.SetDeadline(deadline)
				if _, err := c.Write([]byte("?")); err != nil {
					return true, err
				}
				got, err := io.ReadAll(c)
				c.Close()
				if err != nil {
					return true, err
				}
				fmt.Println(kind, string(got))
			}
			return true, nil
		}
		pc, err := net.ListenPacket("udp4", "127.0.0.1:0")
		if err != nil {
			return true, err
		}
		defer pc.Close()
		_ = pc.SetDeadline(deadline)
		ua, err := net.ResolveUDPAddr("udp4", addr)
		if err != nil {
			return true, err
		}
		for range n {
			if _, err := pc.WriteTo([]byte("?"), ua); err != nil {
				return true, err
			}
			m, from, err := pc.ReadFrom(buf)
			if err != nil {
				return true, err
			}
			fmt.Println(kind, string(buf[:m]), from)
		}
		return true, nil
	}
	return false, nil
}

// serveOwnPort answers every TCP connection and UDP datagram to addr
// (IPv4 or IPv6) with addr's port, until the process ends.
func serveOwnPort(addr string) error {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	pc, err := net.ListenPacket("udp", addr)
	if err != nil {
		return err
	}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_ = c.SetDeadline(time.Now().Add(3 * time.Second))
				b := make([]byte, 1)
				if _, err := c.Read(b); err == nil {
					_, _ = c.Write([]byte(port))
				}
			}()
		}
	}()
	go func() {
		b := make([]byte, 64)
		for {
			_, from, err := pc.ReadFrom(b)
			if err != nil {
				return
			}
			_, _ = pc.WriteTo([]byte(port), from)
		}
	}()
	return nil
}

// lbEnv is the set-up of the tests whose clients live in network
// namespaces of their own (session affinity, v4-mapped IPv6): the programs
// on a cgroup of the test's own, the maps in a bpffs of its own, and the
// frontend reconciler's operations on the real maps.
type lbEnv struct {
	t        testing.TB
	cg       string
	linkDir  string
	m        *maps.LBMaps
	db       *statedb.DB
	backends statedb.RWTable[*lb.Backend]
	ops      *lbsync.FrontendOps
}

func newLBEnv(t testing.TB) *lbEnv {
	cg := filepath.Join(cgroup2Mount(t), "cellium-socklb-aff-"+strings.ToLower(rand.Text()[:8]))
	if err := os.Mkdir(cg, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := os.Remove(cg); err != nil {
			t.Errorf("remove cgroup %s: %v", cg, err)
		}
	})
	bpffs := t.TempDir()
	if err := maps.EnsureBPFFS(bpffs); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(bpffs, 0); err != nil {
			t.Errorf("unmount %s: %v", bpffs, err)
		}
	})
	m, err := maps.OpenLB(bpffs)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close() })
	linkDir := filepath.Join(bpffs, "socklb")
	if err := Attach(m, cg, linkDir); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = Detach(linkDir) })
	db := statedb.New()
	backends, err := lb.NewBackendsTable(db)
	if err != nil {
		t.Fatal(err)
	}
	return &lbEnv{t: t, cg: cg, linkDir: linkDir, m: m, db: db, backends: backends,
		ops: lbsync.NewFrontendOps(lbsync.PinnedServices{M: m.Services}, lbsync.PinnedAffinityMatch{M: m.AffinityMatch}, backends)}
}

// addBackends writes backends (IDs and addresses) into the backends map
// and, as Done, into the table.
func (e *lbEnv) addBackends(ids []uint32, addrs []lb.L4Addr) {
	if err := e.m.Backends.Update(ids, addrs); err != nil {
		e.t.Fatal(err)
	}
	wtxn := e.db.WriteTxn(e.backends)
	for i, id := range ids {
		if _, _, err := e.backends.Insert(wtxn, &lb.Backend{Address: addrs[i], ID: id, Status: reconciler.Done()}); err != nil {
			e.t.Fatal(err)
		}
	}
	wtxn.Commit()
}

// frontend reconciles frontend fe with backends ids into the maps.
func (e *lbEnv) frontend(fe lb.L4Addr, affinity bool, timeout uint32, ids ...uint32) {
	e.t.Helper()
	row := &lb.Frontend{Address: fe, Service: "test/svc", SessionAffinity: affinity, AffinityTimeout: timeout}
	txn := e.db.ReadTxn()
	for _, id := range ids {
		b, _, ok := e.backends.Get(txn, lb.BackendIDIndex.Query(id))
		if !ok {
			e.t.Fatalf("no backend %d", id)
		}
		row.Backends = append(row.Backends, b.Address)
		row.BackendIDs = append(row.BackendIDs, id)
	}
	if err := e.ops.Update(context.Background(), txn, row); err != nil {
		e.t.Fatal(err)
	}
}

// client is one network namespace with lo up: the client of the
// affinity, with the echo servers it reaches on its own loopback.
type client struct {
	netns  ns.NetNS
	cookie uint64
}

func (e *lbEnv) newClient() *client {
	e.t.Helper()
	n, err := testutils.NewNS()
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() {
		_ = n.Close()
		if err := testutils.UnmountNS(n); err != nil {
			e.t.Errorf("remove netns %s: %v", n.Path(), err)
		}
	})
	c := &client{netns: n}
	if err := n.Do(func(ns.NetNS) error {
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		if err := netlink.LinkSetUp(lo); err != nil {
			return err
		}
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		c.cookie, err = unix.GetsockoptUint64(fd, unix.SOL_SOCKET, unix.SO_NETNS_COOKIE)
		return err
	}); err != nil {
		e.t.Fatal(err)
	}
	return c
}

// backendPorts are the ports of the three backends, on each client's
// loopback.
var backendPorts = []uint16{18081, 18082, 18083}

// ask runs n exchanges of kind ("tcpwho" or "udpwho") from c to fe in a
// process in the test's cgroup and returns the ports that answered.
func (e *lbEnv) ask(c *client, kind string, fe lb.L4Addr, n int) []uint16 {
	e.t.Helper()
	serve := make([]string, len(backendPorts))
	for i, p := range backendPorts {
		serve[i] = strconv.Itoa(int(p))
	}
	out := child(e.t, e.cg, fmt.Sprintf("netns=%s,serve=%s,%s=%s*%d", c.netns.Path(), strings.Join(serve, "/"), kind,
		netip.AddrPortFrom(fe.Addr, fe.Port), n))
	var got []uint16
	for line := range strings.SplitSeq(strings.TrimSpace(out), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 || f[0] != kind {
			e.t.Fatalf("client: unexpected line %q in\n%s", line, out)
		}
		if kind == "udpwho" && (len(f) != 3 || f[2] != netip.AddrPortFrom(fe.Addr, fe.Port).String()) {
			e.t.Fatalf("client: datagram not from the frontend: %q", line)
		}
		p, err := strconv.Atoi(f[1])
		if err != nil {
			e.t.Fatalf("client: %q: %v", line, err)
		}
		got = append(got, uint16(p))
	}
	if len(got) != n {
		e.t.Fatalf("client: %d answers, want %d:\n%s", len(got), n, out)
	}
	return got
}

// distinct returns the distinct values of ps in order of appearance.
func distinct(ps []uint16) []uint16 {
	var out []uint16
	for _, p := range ps {
		if !containsPort(out, p) {
			out = append(out, p)
		}
	}
	return out
}

func containsPort(ps []uint16, p uint16) bool {
	for _, q := range ps {
		if q == p {
			return true
		}
	}
	return false
}

// entry returns c's affinity entry for fe.
func (e *lbEnv) entry(c *client, fe lb.L4Addr) (maps.AffinityValue, bool) {
	e.t.Helper()
	var v maps.AffinityValue
	found := false
	if err := e.m.Affinity.Iterate(func(k maps.AffinityKey, val maps.AffinityValue) bool {
		if k.NetnsCookie == c.cookie && k.Frontend == fe {
			v, found = val, true
			return false
		}
		return true
	}); err != nil {
		e.t.Fatal(err)
	}
	return v, found
}

// monoNow is bpf_ktime_get_ns's clock.
func monoNow(t *testing.T) uint64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		t.Fatal(err)
	}
	return uint64(ts.Nano())
}

// TestPrivilegedSocketLBSessionAffinity: frontends with session affinity
// (timeout 60 s: long enough that a loaded machine never lets an entry
// expire between two connections of one check), written by the frontend reconciler's operations into the
// real maps, and clients in network namespaces of their own, each a
// process in the test's cgroup reaching three backends on its own
// loopback through the programs (connect4 for TCP, sendmsg4 for
// unconnected UDP):
//
//   - every connection (datagram) from one namespace reaches one backend,
//     and its affinity entry names it; other namespaces stick too, and
//     not all to the same backend;
//   - an entry younger than the timeout is followed (set by hand to
//     another backend), an older one is not: the program chooses anew
//     and refreshes it (checked by ageing the entry, not by sleeping);
//   - a backend removed from the frontend, though still in the backends
//     map, is never chosen again from a fresh entry naming it;
//   - with affinity off, connections from one namespace spread again.
func TestPrivilegedSocketLBSessionAffinity(t *testing.T) {
	privileged.Require(t)
	e := newLBEnv(t)
	// Frontends in 198.18.x.0/24 (x from the PID, like
	// TestPrivilegedSocketLB), .20; clients' namespaces have only lo,
	// so an untranslated connection cannot leave them.
	x := byte(os.Getpid()%250) + 1
	vip := netip.AddrFrom4([4]byte{198, 18, x, 20})
	tcpFE := lb.L4Addr{Addr: vip, Port: 80, Proto: lb.TCP}
	udpFE := lb.L4Addr{Addr: vip, Port: 53, Proto: lb.UDP}
	loop := netip.MustParseAddr("127.0.0.1")
	var tcpIDs, udpIDs []uint32
	var tcpAddrs, udpAddrs []lb.L4Addr
	portID := map[uint16]uint32{} // TCP backend ID by port (UDP: +10)
	for i, p := range backendPorts {
		tcpIDs, udpIDs = append(tcpIDs, uint32(i+1)), append(udpIDs, uint32(i+11))
		tcpAddrs = append(tcpAddrs, lb.L4Addr{Addr: loop, Port: p, Proto: lb.TCP})
		udpAddrs = append(udpAddrs, lb.L4Addr{Addr: loop, Port: p, Proto: lb.UDP})
		portID[p] = uint32(i + 1)
	}
	e.addBackends(append(tcpIDs, udpIDs...), append(tcpAddrs, udpAddrs...))
	const timeout = 60
	e.frontend(tcpFE, true, timeout, tcpIDs...)
	e.frontend(udpFE, true, timeout, udpIDs...)
	if v, err := e.m.Services.Lookup(maps.ServiceSlot{Frontend: tcpFE}); err != nil || !v.Affinity || v.AffinityTimeout != timeout || v.Count != 3 {
		t.Fatalf("slot 0 of %v: %+v (%v)", tcpFE, v, err)
	}

	const n = 20
	// Affinity on: each namespace sticks to one backend.
	clients := make([]*client, 10)
	chosen := map[uint16]int{}
	for i := range clients {
		clients[i] = e.newClient()
		got := distinct(e.ask(clients[i], "tcpwho", tcpFE, n))
		if len(got) != 1 {
			t.Fatalf("client %d: %d TCP connections reached %v, want one backend", i, n, got)
		}
		chosen[got[0]]++
		v, ok := e.entry(clients[i], tcpFE)
		if !ok || v.BackendID != portID[got[0]] {
			t.Errorf("client %d: affinity entry %+v (found %v), want backend %d", i, v, ok, portID[got[0]])
		}
		gotUDP := distinct(e.ask(clients[i], "udpwho", udpFE, n))
		if len(gotUDP) != 1 {
			t.Fatalf("client %d: %d datagrams answered by %v, want one backend", i, n, gotUDP)
		}
		// Sticky across processes of the same namespace.
		if again := distinct(e.ask(clients[i], "tcpwho", tcpFE, 3)); len(again) != 1 || again[0] != got[0] {
			t.Errorf("client %d: a second process reached %v, want %d", i, again, got[0])
		}
	}
	t.Logf("affinity on: %d namespaces x %d TCP connections and %d datagrams, each namespace on one backend; namespaces per backend port %v",
		len(clients), n, n, chosen)
	if len(chosen) < 2 {
		t.Errorf("all %d namespaces on one backend %v: the client key is not the namespace", len(clients), chosen)
	}

	// The timeout, by the entry's age.
	a := clients[0]
	cur, _ := e.entry(a, tcpFE)
	var other uint16
	for _, p := range backendPorts {
		if portID[p] != cur.BackendID {
			other = p
			break
		}
	}
	// Younger than the timeout (half of it): followed, even to another backend.
	if err := e.m.Affinity.Update(maps.AffinityKey{NetnsCookie: a.cookie, Frontend: tcpFE},
		maps.AffinityValue{BackendID: portID[other], LastUsed: monoNow(t) - timeout*uint64(time.Second)/2}); err != nil {
		t.Fatal(err)
	}
	if got := distinct(e.ask(a, "tcpwho", tcpFE, 5)); len(got) != 1 || got[0] != other {
		t.Errorf("fresh entry naming %d: reached %v", other, got)
	}
	// Older than the timeout: the program chooses anew; within 30 tries
	// it leaves the entry's backend at least once (1/3 chance to stay).
	left := false
	for try := 0; try < 30 && !left; try++ {
		aged := monoNow(t) - (timeout*uint64(time.Second) + 100*uint64(time.Millisecond))
		if err := e.m.Affinity.Update(maps.AffinityKey{NetnsCookie: a.cookie, Frontend: tcpFE},
			maps.AffinityValue{BackendID: portID[other], LastUsed: aged}); err != nil {
			t.Fatal(err)
		}
		got := e.ask(a, "tcpwho", tcpFE, 1)[0]
		v, ok := e.entry(a, tcpFE)
		if !ok || v.LastUsed <= aged || v.BackendID != portID[got] {
			t.Fatalf("expired entry: after a connection to %d the entry is %+v (found %v), want it renewed for %d", got, v, ok, portID[got])
		}
		left = got != other
	}
	if !left {
		t.Errorf("expired entries naming %d: 30 connections all went to %d", other, other)
	}

	// A backend removed from the frontend (still in the backends map, as
	// a backend of another Service would be): a fresh entry naming it is
	// not followed.
	if err := e.m.Affinity.Update(maps.AffinityKey{NetnsCookie: a.cookie, Frontend: tcpFE},
		maps.AffinityValue{BackendID: portID[backendPorts[0]], LastUsed: monoNow(t)}); err != nil {
		t.Fatal(err)
	}
	if got := distinct(e.ask(a, "tcpwho", tcpFE, 3)); len(got) != 1 || got[0] != backendPorts[0] {
		t.Fatalf("entry naming %d: reached %v", backendPorts[0], got)
	}
	e.frontend(tcpFE, true, timeout, tcpIDs[1:]...)
	got := distinct(e.ask(a, "tcpwho", tcpFE, n))
	if len(got) != 1 || got[0] == backendPorts[0] {
		t.Errorf("after %d left the frontend: %d connections reached %v, want one backend other than it", backendPorts[0], n, got)
	}
	if v, _ := e.entry(a, tcpFE); v.BackendID == portID[backendPorts[0]] {
		t.Errorf("the affinity entry still names the removed backend: %+v", v)
	}
	e.frontend(tcpFE, true, timeout, tcpIDs...)

	// Affinity off: connections from one namespace spread again (all of
	// 60 to one of 3 backends: 3^-59).
	e.frontend(tcpFE, false, 0, tcpIDs...)
	e.frontend(udpFE, false, 0, udpIDs...)
	tcpSpread := distinct(e.ask(a, "tcpwho", tcpFE, 60))
	udpSpread := distinct(e.ask(a, "udpwho", udpFE, 60))
	t.Logf("affinity off: 60 TCP connections reached %v, 60 datagrams %v", tcpSpread, udpSpread)
	if len(tcpSpread) < 2 || len(udpSpread) < 2 {
		t.Errorf("affinity off: TCP reached %v, UDP %v; want several backends each", tcpSpread, udpSpread)
	}
	// And on again: sticky again.
	e.frontend(tcpFE, true, timeout, tcpIDs...)
	if got := distinct(e.ask(clients[1], "tcpwho", tcpFE, n)); len(got) != 1 {
		t.Errorf("affinity on again: %d connections reached %v", n, got)
	}
}
