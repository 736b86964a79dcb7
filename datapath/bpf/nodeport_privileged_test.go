package bpf_test

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/cellium/cellium/datapath/bpf"
	"github.com/cellium/cellium/datapath/loader"
	"github.com/cellium/cellium/datapath/maps"
	"github.com/cellium/cellium/statedb/identity"
	"github.com/cellium/cellium/statedb/lb"
	"github.com/cellium/cellium/statedb/policy"
	"github.com/cellium/cellium/test/privileged"
)

// The NodePort topology: the two nodes of the overlay tests (native
// routing) and an "outside" namespace on the same wire, a client that is
// no node (10.78.0.100). Node 1 runs cil_from_netdev on its uplink eth0;
// it has backend pod l (10.78.1.20), node 2 backend pod r (10.78.2.20).
// Both pods run whoami on port 8080: TCP and UDP answer with the source
// address they see, then TCP echoes.
var (
	outsideIP = netip.MustParseAddr("10.78.0.100")
	npLocalIP = netip.MustParseAddr("10.78.1.20")
	npRemote  = netip.MustParseAddr("10.78.2.20")
)

const (
	npBackendPort        = 8080
	npIDL, npIDR         = identity.NumericIdentity(32001), identity.NumericIdentity(32002)
	npEPL, npEPR  uint16 = 41, 42

	// lb.h's flags and scopes.
	svcAffinity = 0x1
	svcNodePort = 0x2
	svcLocal    = 0x4
	svcBank1    = 0x20
	scopeExt    = 0
)

type npTopology struct {
	outside ns.NetNS
	n1, n2  *xnode
	l, r    *testPod
	lb      *maps.LBMaps
}

// newOutside makes the client namespace: a veth on the wire's bridge with
// outsideIP/24 and no other route (it reaches the nodes' addresses only).
func newOutside(tb testing.TB, wire ns.NetNS) ns.NetNS {
	tb.Helper()
	o := newNetns(tb)
	peer := fmt.Sprintf("o-%d", time.Now().UnixNano()%100000)
	err := wire.Do(func(ns.NetNS) error {
		veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: peer}, PeerName: "eth0", PeerNamespace: netlink.NsFd(int(o.Fd()))}
		if err := netlink.LinkAdd(veth); err != nil {
			return err
		}
		br, err := netlink.LinkByName("br0")
		if err != nil {
			return err
		}
		l, err := netlink.LinkByName(peer)
		if err != nil {
			return err
		}
		if err := netlink.LinkSetMaster(l, br); err != nil {
			return err
		}
		return netlink.LinkSetUp(l)
	})
	if err != nil {
		tb.Fatalf("outside veth: %v", err)
	}
	err = o.Do(func(ns.NetNS) error {
		for _, name := range []string{"lo", "eth0"} {
			l, err := netlink.LinkByName(name)
			if err != nil {
				return err
			}
			if name == "eth0" {
				if err := netlink.AddrAdd(l, &netlink.Addr{IPNet: &net.IPNet{IP: outsideIP.AsSlice(), Mask: net.CIDRMask(24, 32)}}); err != nil {
					return err
				}
			}
			if err := netlink.LinkSetUp(l); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		tb.Fatalf("outside eth0: %v", err)
	}
	return o
}

// serveWhoami answers on port in pod p: TCP writes the peer's address and
// a newline, then echoes; UDP answers each datagram with the sender's
// address.
func (p *testPod) serveWhoami(tb testing.TB, port uint16) {
	tb.Helper()
	var tl net.Listener
	var ul net.PacketConn
	err := p.ns.Do(func(ns.NetNS) error {
		var err error
		addr := netip.AddrPortFrom(p.ip, port).String()
		if tl, err = net.Listen("tcp4", addr); err != nil {
			return err
		}
		ul, err = net.ListenPacket("udp4", addr)
		return err
	})
	if err != nil {
		tb.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	wg.Add(2)
	go func() {
		defer wg.Done()
		for {
			c, err := tl.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				peer := c.RemoteAddr().(*net.TCPAddr).IP.String()
				if _, err := io.WriteString(c, peer+"\n"); err != nil {
					return
				}
				_, _ = io.Copy(c, c)
			}()
		}
	}()
	go func() {
		defer wg.Done()
		buf := make([]byte, 1500)
		for {
			_, from, err := ul.ReadFrom(buf)
			if err != nil {
				return
			}
			_, _ = ul.WriteTo([]byte(from.(*net.UDPAddr).IP.String()), from)
		}
	}()
	tb.Cleanup(func() {
		tl.Close()
		ul.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
}

// newNPTopology builds the topology with native routing between the
// nodes, or with tunnel: cilium_vxlan and the overlay programs on both,
// the pods' ipcache entries naming their node as tunnel endpoint.
func newNPTopology(t testing.TB, tunnel bool) *npTopology {
	t.Helper()
	blackholeRange(t, overlayRange)
	wire := newWire(t)
	tp := &npTopology{outside: newOutside(t, wire)}
	tp.n1, tp.n2 = newXNode(t, wire, 1), newXNode(t, wire, 2)
	tp.n1.nodePort, tp.n2.nodePort = true, true
	tp.n1.knowNode(t, tp.n2)
	tp.n2.knowNode(t, tp.n1)
	allow := []policy.Entry{allowAllEgress, allowAllIngress}
	tp.l = tp.n1.localPod(t, "npl", npLocalIP, npIDL, npEPL, allow)
	tp.r = tp.n2.localPod(t, "npr", npRemote, npIDR, npEPR, allow)
	tp.n1.knowRemotePod(t, tp.r, npIDR, tp.n2, tunnel)
	tp.n2.knowRemotePod(t, tp.l, npIDL, tp.n1, tunnel)
	if tunnel {
		for _, x := range []*xnode{tp.n1, tp.n2} {
			for _, id := range []identity.NumericIdentity{npIDL, npIDR} {
				if err := x.m.Identities.Add(id); err != nil {
					t.Fatal(err)
				}
			}
		}
		tp.n1.addTunnel(t, tp.n2)
		tp.n2.addTunnel(t, tp.n1)
	} else {
		tp.n1.addNativeRoutes(t, tp.n2)
		tp.n2.addNativeRoutes(t, tp.n1)
	}
	tp.l.serveWhoami(t, npBackendPort)
	tp.r.serveWhoami(t, npBackendPort)

	lbm, err := maps.OpenLB(tp.n1.dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lbm.Close() })
	tp.lb = lbm
	for id, a := range map[uint32]netip.Addr{1: npLocalIP, 2: npRemote} {
		for _, proto := range []uint8{syscall.IPPROTO_TCP, syscall.IPPROTO_UDP} {
			// Backend IDs: 1/2 TCP, 11/12 UDP.
			bid := id
			if proto == syscall.IPPROTO_UDP {
				bid += 10
			}
			if err := lbm.Backends.Update([]uint32{bid}, []lb.L4Addr{{Addr: a, Port: npBackendPort, Proto: proto}}); err != nil {
				t.Fatal(err)
			}
		}
	}
	tp.attach(t)
	return tp
}

// attach attaches cil_from_netdev to node 1's eth0 the way the agent
// does: the loader's NodePort, with links pinned in node 1's bpffs and
// eth0's address as the SNAT source.
func (tp *npTopology) attach(t testing.TB) {
	t.Helper()
	np := &loader.NodePort{Layout: loader.Layout{Root: tp.n1.root}, Netns: loader.Netns{Path: tp.n1.ns.Path()}}
	if err := np.Ensure([]string{"eth0"}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := np.Remove(); err != nil {
			t.Error(err)
		}
	})
}

// service writes frontend node1:port/proto (external scope) with flags and
// the backend IDs.
func (tp *npTopology) service(t testing.TB, port uint16, proto uint8, flags uint8, backends ...uint32) {
	t.Helper()
	m := tp.n1.lbServices(t)
	// Slot 0 flagged svcBank1 (LB4_SVC_BANK1) has its slots in bank 1.
	bank := uint16(0)
	if flags&svcBank1 != 0 {
		bank = 1
	}
	key := func(slot uint16) bpf.SockLb4Key {
		b := tp.n1.ip.As4()
		k := bpf.SockLb4Key{Address: binary.LittleEndian.Uint32(b[:]), Dport: htons(port), Proto: proto, Scope: scopeExt, Slot: slot}
		if slot > 0 {
			k.Bank = bank
		}
		return k
	}
	if err := m.Put(key(0), bpf.SockLb4Service{Count: uint16(len(backends)), Flags: flags, BackendId: 60}); err != nil {
		t.Fatal(err)
	}
	for i, id := range backends {
		if err := m.Put(key(uint16(i+1)), bpf.SockLb4Service{BackendId: id}); err != nil {
			t.Fatal(err)
		}
	}
}

// lbServices opens node x's pinned cellium_lb4_services raw (the test
// writes the flags of lb.h that the control plane's helper sets).
func (x *xnode) lbServices(t testing.TB) *ebpf.Map {
	t.Helper()
	m, err := ebpf.LoadPinnedMap(x.dir+"/"+maps.LB4ServicesMapName, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// dialOutside connects from the outside namespace to dst over network
// ("tcp4" or "udp4"), from local when it is valid (port 0: any port),
// within timeout (0: none). Every test of the topology dials through it.
func (tp *npTopology) dialOutside(network string, local, dst netip.AddrPort, timeout time.Duration) (net.Conn, error) {
	d := net.Dialer{Timeout: timeout}
	if local.IsValid() {
		if network == "udp4" {
			d.LocalAddr = net.UDPAddrFromAddrPort(local)
		} else {
			d.LocalAddr = net.TCPAddrFromAddrPort(local)
		}
	}
	var c net.Conn
	err := tp.outside.Do(func(ns.NetNS) error {
		var err error
		c, err = d.Dial(network, dst.String())
		return err
	})
	return c, err
}

// nodePort is node 1's address with port.
func (tp *npTopology) nodePort(port uint16) netip.AddrPort { return netip.AddrPortFrom(tp.n1.ip, port) }

// askUDP sends msg on c until a datagram comes back (tries times, a
// second each) and returns it; a failed send ends it at once.
func askUDP(c net.Conn, msg string, tries int) (string, error) {
	buf := make([]byte, 64)
	var last error
	for range tries {
		if _, err := c.Write([]byte(msg)); err != nil {
			return "", err
		}
		_ = c.SetReadDeadline(time.Now().Add(time.Second))
		n, err := c.Read(buf)
		if err == nil {
			return string(buf[:n]), nil
		}
		last = err
	}
	return "", last
}

// dialWhoami connects from the outside namespace to node 1's port and
// returns the connection and the source address the backend saw.
func (tp *npTopology) dialWhoami(port uint16) (net.Conn, string, error) {
	c, err := tp.dialOutside("tcp4", netip.AddrPort{}, tp.nodePort(port), 3*time.Second)
	if err != nil {
		return nil, "", err
	}
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		c.Close()
		return nil, "", fmt.Errorf("read whoami: %w", err)
	}
	return c, strings.TrimSpace(line), nil
}

// udpWhoami sends datagrams from the outside to node 1's port until one
// comes back (5 tries) and returns the address the backend saw.
func (tp *npTopology) udpWhoami(port uint16) (string, error) {
	c, err := tp.dialOutside("udp4", netip.AddrPort{}, tp.nodePort(port), 0)
	if err != nil {
		return "", err
	}
	defer c.Close()
	return askUDP(c, "who", 5)
}

// TestPrivilegedNodePort: clients outside the node reach NodePort
// frontends of node 1 through cil_from_netdev on its uplink (TCP and UDP,
// real sockets): with externalTrafficPolicy Cluster a backend on the node
// and one on another node see node 1's address as the source, with Local
// the backend sees the client's; replies come back through the reverse
// translation (cil_from_container for the local pod, cil_from_netdev for
// the remote one); a frontend without backends is refused at once and
// counted as 158; many connections at once each get their own SNAT port.
// Without the program nothing listens on the NodePorts and every case
// fails. Native routing between the nodes; TestPrivilegedNodePortTunnel
// runs the same through the tunnel.
func TestPrivilegedNodePort(t *testing.T) { testNodePort(t, false) }

// TestPrivilegedNodePortTunnel is TestPrivilegedNodePort in tunnel mode:
// the request to the remote backend leaves node 1 through cilium_vxlan
// (cil_to_overlay puts the node's identity into the VNI, node 2's
// cil_from_overlay hands it to the pod's policy); the reply comes back to
// node 1's address over the wire, to cil_from_netdev.
func TestPrivilegedNodePortTunnel(t *testing.T) { testNodePort(t, true) }

func testNodePort(t *testing.T, tunnel bool) {
	tp := newNPTopology(t, tunnel)
	n1 := tp.n1.ip.String()
	tp.service(t, 30080, syscall.IPPROTO_TCP, svcNodePort, 1)
	tp.service(t, 30080, syscall.IPPROTO_UDP, svcNodePort, 11)
	// Port 30081's slots are in bank 1, as after an update by lbsync.
	tp.service(t, 30081, syscall.IPPROTO_TCP, svcNodePort|svcBank1, 2)
	tp.service(t, 30081, syscall.IPPROTO_UDP, svcNodePort|svcBank1, 12)
	tp.service(t, 30082, syscall.IPPROTO_TCP, svcNodePort|svcLocal, 1)
	tp.service(t, 30082, syscall.IPPROTO_UDP, svcNodePort|svcLocal, 11)
	tp.service(t, 30083, syscall.IPPROTO_TCP, svcNodePort)
	tp.service(t, 30084, syscall.IPPROTO_TCP, svcNodePort|svcAffinity, 1, 2)
	fe := lb.L4Addr{Addr: tp.n1.ip, Port: 30084, Proto: syscall.IPPROTO_TCP}
	if err := tp.lb.AffinityMatch.Update([]maps.AffinityMatch{{Frontend: fe, BackendID: 1}, {Frontend: fe, BackendID: 2}}); err != nil {
		t.Fatal(err)
	}

	for _, c := range []struct {
		name string
		port uint16
		want string
	}{
		{"cluster local backend", 30080, n1},
		{"cluster remote backend", 30081, n1},
		{"local keeps the client", 30082, outsideIP.String()},
	} {
		t.Run(c.name+" tcp", func(t *testing.T) {
			conn, seen, err := tp.dialWhoami(c.port)
			if err != nil {
				t.Fatalf("tcp %s:%d from outside: %v", n1, c.port, err)
			}
			defer conn.Close()
			if seen != c.want {
				t.Errorf("backend saw source %s, want %s", seen, c.want)
			}
			if err := roundTrip(conn, "through the nodeport"); err != nil {
				t.Errorf("echo: %v", err)
			}
		})
		t.Run(c.name+" udp", func(t *testing.T) {
			seen, err := tp.udpWhoami(c.port)
			if err != nil {
				t.Fatalf("udp %s:%d from outside: %v", n1, c.port, err)
			}
			if seen != c.want {
				t.Errorf("backend saw source %s, want %s", seen, c.want)
			}
		})
	}

	t.Run("no backends", func(t *testing.T) {
		before := dropCount(t, tp.n1.m, maps.DropNoService)
		start := time.Now()
		_, _, err := tp.dialWhoami(30083)
		if !errors.Is(err, syscall.ECONNREFUSED) {
			t.Errorf("dial a frontend without backends: %v, want connection refused", err)
		}
		if d := time.Since(start); d > time.Second {
			t.Errorf("refused after %v, want at once", d)
		}
		if after := dropCount(t, tp.n1.m, maps.DropNoService); after <= before {
			t.Errorf("drop counter 158 %d -> %d, want it counted", before, after)
		}
		ev := tp.n1.waitEvent(t, "no-service drop", func(e maps.Event) bool {
			return e.Type == maps.EventDrop && e.Reason == maps.DropNoService && e.DstPort == 30083
		})
		if ev.Src != outsideIP || ev.Dst != tp.n1.ip {
			t.Errorf("drop event %v: want %s -> %s", ev, outsideIP, tp.n1.ip)
		}
	})

	t.Run("session affinity", func(t *testing.T) {
		var first string
		for i := range 6 {
			conn, _, err := tp.dialWhoami(30084)
			if err != nil {
				t.Fatal(err)
			}
			backend := conn.RemoteAddr().String()
			conn.Close()
			conns, err := tp.n1.m.NodePortConnections()
			if err != nil {
				t.Fatal(err)
			}
			var be string
			for _, c := range conns {
				if ntohsT(c.Key.FrontendPort) == 30084 && c.Key.ClientPort == htons(uint16(localPortOf(conn))) {
					be = fmt.Sprint(c.Entry.BackendId)
				}
			}
			if be == "" {
				t.Fatalf("no NAT entry for connection %d (%s)", i, backend)
			}
			if i == 0 {
				first = be
			} else if be != first {
				t.Errorf("connection %d went to backend %s, the first to %s", i, be, first)
			}
		}
	})

	// Pod p admits only the world (outside clients) on its port: Local
	// keeps the client, whose identity is world, and passes; Cluster
	// translates the source to the node, whose identity is host, and its
	// ingress policy drops it, reporting host as the source.
	t.Run("policy sees the client or the node", func(t *testing.T) {
		const idP, epP = identity.NumericIdentity(32003), uint16(43)
		p := tp.n1.localPod(t, "npp", netip.MustParseAddr("10.78.1.30"), idP, epP, []policy.Entry{
			allowAllEgress,
			{Key: policy.NewKey(identity.ReservedIdentityWorld, policy.Ingress, policy.ProtoTCP, npBackendPort, 16)},
		})
		p.serveWhoami(t, npBackendPort)
		if err := tp.lb.Backends.Update([]uint32{3}, []lb.L4Addr{{Addr: p.ip, Port: npBackendPort, Proto: syscall.IPPROTO_TCP}}); err != nil {
			t.Fatal(err)
		}
		tp.service(t, 30086, syscall.IPPROTO_TCP, svcNodePort|svcLocal, 3)
		tp.service(t, 30087, syscall.IPPROTO_TCP, svcNodePort, 3)
		conn, seen, err := tp.dialWhoami(30086)
		if err != nil {
			t.Fatalf("Local to a pod admitting the world: %v", err)
		}
		conn.Close()
		if seen != outsideIP.String() {
			t.Errorf("backend saw %s, want the client %s", seen, outsideIP)
		}
		if conn, _, err := tp.dialWhoami(30087); err == nil {
			conn.Close()
			t.Error("Cluster (SNAT to the node) passed a policy that admits only the world")
		}
		ev := tp.n1.waitEvent(t, "policy drop of the SNATed connection", func(e maps.Event) bool {
			return e.Type == maps.EventDrop && e.EndpointID == epP && e.Reason == maps.DropPolicy
		})
		if ev.SrcIdentity != identity.ReservedIdentityHost || ev.Src != tp.n1.ip || ev.DstPort != npBackendPort {
			t.Errorf("drop event %v: want source %s with identity host, to port %d", ev, tp.n1.ip, npBackendPort)
		}
	})

	// Local keeps the client's tuple: after a Local connection ended, the
	// same client port reaching the pod directly has the very tuple of
	// its reverse entry; its replies must not be translated.
	t.Run("direct from the port of an ended Local connection", func(t *testing.T) {
		if err := tp.outside.Do(func(ns.NetNS) error {
			err := netlink.RouteAdd(&netlink.Route{Dst: &net.IPNet{IP: tp.n1.podCIDR.Addr().AsSlice(), Mask: net.CIDRMask(24, 32)}, Gw: tp.n1.ip.AsSlice()})
			if errors.Is(err, syscall.EEXIST) {
				return nil
			}
			return err
		}); err != nil {
			t.Fatal(err)
		}
		src := netip.AddrPortFrom(outsideIP, 40123)
		dialFrom := func(dst netip.AddrPort) (string, error) {
			c, err := tp.dialOutside("tcp4", src, dst, 3*time.Second)
			if err != nil {
				return "", err
			}
			// Reset on close: no TIME_WAIT holds the port.
			defer func() { _ = c.(*net.TCPConn).SetLinger(0); c.Close() }()
			_ = c.SetDeadline(time.Now().Add(3 * time.Second))
			line, err := bufio.NewReader(c).ReadString('\n')
			return strings.TrimSpace(line), err
		}
		if seen, err := dialFrom(netip.AddrPortFrom(tp.n1.ip, 30082)); err != nil || seen != outsideIP.String() {
			t.Fatalf("Local from port %d: %q, %v", src.Port(), seen, err)
		}
		if seen, err := dialFrom(netip.AddrPortFrom(npLocalIP, npBackendPort)); err != nil || seen != outsideIP.String() {
			t.Errorf("then straight to the pod from the same port: %q, %v", seen, err)
		}
	})

	t.Run("many connections", func(t *testing.T) {
		const n = 64
		conns := make([]net.Conn, 0, n)
		defer func() {
			for _, c := range conns {
				c.Close()
			}
		}()
		for i := range n {
			c, seen, err := tp.dialWhoami(30081)
			if err != nil {
				t.Fatalf("connection %d: %v", i, err)
			}
			conns = append(conns, c)
			if seen != n1 {
				t.Fatalf("connection %d: backend saw %s", i, seen)
			}
		}
		for i, c := range conns {
			if err := roundTrip(c, fmt.Sprintf("conn %d", i)); err != nil {
				t.Fatalf("echo on connection %d: %v", i, err)
			}
		}
		entries, err := tp.n1.m.NodePortConnections()
		if err != nil {
			t.Fatal(err)
		}
		ports := map[uint16]bool{}
		open := map[uint16]bool{}
		for _, c := range conns {
			open[htons(uint16(localPortOf(c)))] = true
		}
		for _, e := range entries {
			if ntohsT(e.Key.FrontendPort) != 30081 || e.Key.Proto != syscall.IPPROTO_TCP || !open[e.Key.ClientPort] {
				continue
			}
			p := ntohsT(e.Entry.NatPort)
			if p < 32768 {
				t.Errorf("SNAT port %d below the NAT range", p)
			}
			ports[p] = true
		}
		if len(ports) != n {
			t.Errorf("%d distinct SNAT ports for %d connections", len(ports), n)
		}
	})
}

func ntohsT(v uint16) uint16 { return htons(v) }

func localPortOf(c net.Conn) int { return c.LocalAddr().(*net.TCPAddr).Port }

// dropCount is the packets counted with reason in the ingress direction.
func dropCount(t *testing.T, m *maps.Maps, reason uint8) uint64 {
	t.Helper()
	var total uint64
	all, err := m.Metrics.Read()
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range all {
		if k.Reason == reason {
			total += v.Packets
		}
	}
	return total
}

// BenchmarkPrivilegedNodePortRR measures a client outside the node
// talking to a pod on the node, side by side: through cil_from_netdev
// with externalTrafficPolicy Cluster (DNAT and SNAT) and Local (DNAT),
// through an nftables DNAT rule in the node's prerouting (what kube-proxy's
// nftables mode does for a NodePort with Local), and straight to the pod
// address without a Service. "rr" is one 64-byte request and its echo on
// an open connection, "connect" a new connection with one round trip.
func BenchmarkPrivilegedNodePortRR(b *testing.B) {
	privileged.Require(b)
	tp := newNPTopology(b, false)
	tp.service(b, 30080, syscall.IPPROTO_TCP, svcNodePort, 1)
	tp.service(b, 30082, syscall.IPPROTO_TCP, svcNodePort|svcLocal, 1)
	privileged.DNAT(b, tp.n1.ns.Path(), "cellium-bench-nodeport", netip.AddrPortFrom(tp.n1.ip, 31080),
		netip.AddrPortFrom(npLocalIP, npBackendPort))
	if err := tp.outside.Do(func(ns.NetNS) error {
		return netlink.RouteAdd(&netlink.Route{Dst: &net.IPNet{IP: tp.n1.podCIDR.Addr().AsSlice(), Mask: net.CIDRMask(24, 32)}, Gw: tp.n1.ip.AsSlice()})
	}); err != nil {
		b.Fatal(err)
	}
	dial := func(dst netip.AddrPort) (net.Conn, error) {
		c, err := tp.dialOutside("tcp4", netip.AddrPort{}, dst, 3*time.Second)
		if err != nil {
			return nil, err
		}
		if _, err := bufio.NewReader(io.LimitReader(c, 32)).ReadString('\n'); err != nil {
			c.Close()
			return nil, err
		}
		return c, nil
	}
	msg := strings.Repeat("x", 64)
	for _, c := range []struct {
		name string
		dst  netip.AddrPort
	}{
		{"bpf-cluster", netip.AddrPortFrom(tp.n1.ip, 30080)},
		{"bpf-local", netip.AddrPortFrom(tp.n1.ip, 30082)},
		{"nftables-dnat", netip.AddrPortFrom(tp.n1.ip, 31080)},
		{"direct", netip.AddrPortFrom(npLocalIP, npBackendPort)},
	} {
		b.Run(c.name+"/rr", func(b *testing.B) {
			conn, err := dial(c.dst)
			if err != nil {
				b.Fatal(err)
			}
			defer conn.Close()
			b.ResetTimer()
			for range b.N {
				if err := roundTrip(conn, msg); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(c.name+"/connect", func(b *testing.B) {
			for range b.N {
				conn, err := dial(c.dst)
				if err != nil {
					b.Fatal(err)
				}
				if err := roundTrip(conn, msg); err != nil {
					b.Fatal(err)
				}
				conn.Close()
			}
		})
	}
}
