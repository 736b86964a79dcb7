package bpf_test

import (
	"bytes"
	"encoding/binary"
	"net"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/cellium/cellium/statedb/lb"

	"github.com/cellium/cellium/datapath/bpf"
	"github.com/cellium/cellium/datapath/loader"
	"github.com/cellium/cellium/statedb/identity"
	"github.com/cellium/cellium/statedb/policy"
)

// nodeport.h's NODEPORT_F_SNAT and NODEPORT_F_DSR.
const (
	npFlagSNAT = 0x1
	npFlagDSR  = 0x10
)

// attachNodePort attaches cil_from_netdev to node x's eth0 with lb mode
// (bpf.LBModeSNAT, DSR or Hybrid), replacing the program a pin there
// holds; removed when t ends.
func attachNodePort(t testing.TB, x *xnode, mode uint8) {
	t.Helper()
	np := &loader.NodePort{Layout: loader.Layout{Root: x.root}, Netns: loader.Netns{Path: x.ns.Path()}, LBMode: mode}
	if err := np.Ensure([]string{"eth0"}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := np.Remove(); err != nil {
			t.Error(err)
		}
	})
}

func be32(a netip.Addr) uint32 {
	b := a.As4()
	return binary.LittleEndian.Uint32(b[:])
}

// revEntries returns node x's cellium_nodeport_rev4 entries whose backend
// is backend, for proto.
func revEntries(t testing.TB, x *xnode, backend netip.Addr, proto uint8) []bpf.NodeportNodeportRev4Entry {
	t.Helper()
	var out []bpf.NodeportNodeportRev4Entry
	var k bpf.NodeportNodeportRev4Key
	var v bpf.NodeportNodeportRev4Entry
	it := x.m.NodePortRev4.Iterate()
	for it.Next(&k, &v) {
		if k.Backend == be32(backend) && k.Proto == proto {
			out = append(out, v)
		}
	}
	if err := it.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// fwdEntries returns node x's cellium_nodeport_ct4 entries of proto to
// backend.
func fwdEntries(t testing.TB, x *xnode, backend netip.Addr, proto uint8) []bpf.NodeportNodeportCt4Entry {
	t.Helper()
	var out []bpf.NodeportNodeportCt4Entry
	var k bpf.NodeportNodeportCt4Key
	var v bpf.NodeportNodeportCt4Entry
	it := x.m.NodePortCT4.Iterate()
	for it.Next(&k, &v) {
		if v.Backend == be32(backend) && k.Proto == proto {
			out = append(out, v)
		}
	}
	if err := it.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestPrivilegedNodePortDSR: with --bpf-lb-mode=dsr on both nodes (native
// routing), a client outside the cluster reaches node 1's NodePort whose
// only backend is pod r on node 2. Node 1 translates the destination only
// and adds the DSR option (TCP: the SYN; UDP: every datagram); node 2
// records the frontend from the option; r sees the client's own address
// (TCP and UDP) and its replies leave node 2 straight to the client with
// node 1's NodePort as source: node 1 has a forward entry flagged DSR and
// no reverse entry (no reply came back through it: it could not have
// translated one), node 2 the reverse entry naming node 1's frontend.
// r's ingress policy allows world only on the port, so the connections
// pass only when the backend sees the client (world), not node 1
// (remote-node) as SNAT would show it. Then --bpf-lb-mode=hybrid: TCP
// still by DSR, UDP by SNAT through node 1 (r sees node 1's address,
// node 1 has the reverse entry). With the DSR code removed the backend
// sees node 1 (or nothing) and the test fails.
func TestPrivilegedNodePortDSR(t *testing.T) {
	tp := newNPTopology(t, false)
	// r admits world only on the whoami port: the client, not a node.
	pm := openPolicy(t, tp.n2.dir, npEPR)
	if err := pm.Delete(allowAllIngress.Key); err != nil {
		t.Fatal(err)
	}
	world := []policy.Entry{
		{Key: policy.NewKey(identity.ReservedIdentityWorld, policy.Ingress, policy.ProtoTCP, npBackendPort, 16)},
		{Key: policy.NewKey(identity.ReservedIdentityWorld, policy.Ingress, policy.ProtoUDP, npBackendPort, 16)},
	}
	if err := pm.BatchUpdate(world); err != nil {
		t.Fatal(err)
	}
	attachNodePort(t, tp.n1, bpf.LBModeDSR)
	attachNodePort(t, tp.n2, bpf.LBModeDSR)

	const tcpPort, udpPort = 30200, 30201
	tp.service(t, tcpPort, syscall.IPPROTO_TCP, svcNodePort, 2)
	tp.service(t, udpPort, syscall.IPPROTO_UDP, svcNodePort, 12)

	c, seen, err := tp.dialWhoami(tcpPort)
	if err != nil {
		t.Fatalf("TCP to node 1's NodePort, DSR to node 2: %v", err)
	}
	if seen != outsideIP.String() {
		t.Errorf("TCP: backend saw %q, want the client %s", seen, outsideIP)
	}
	if err := roundTrip(c, "dsr echo"); err != nil {
		t.Errorf("TCP echo: %v", err)
	}
	c.Close()
	if rev := revEntries(t, tp.n1, npRemote, syscall.IPPROTO_TCP); len(rev) != 0 {
		t.Errorf("node 1 has reverse entries %+v for the DSR connection, want none", rev)
	}
	fwd := fwdEntries(t, tp.n1, npRemote, syscall.IPPROTO_TCP)
	if len(fwd) != 1 || fwd[0].Flags&npFlagDSR == 0 || fwd[0].NatAddr != be32(outsideIP) {
		t.Errorf("node 1's forward entries %+v, want one flagged DSR keeping the client's address", fwd)
	}
	rev := revEntries(t, tp.n2, npRemote, syscall.IPPROTO_TCP)
	if len(rev) != 1 || rev[0].Flags&npFlagDSR == 0 || rev[0].Frontend != be32(tp.n1.ip) ||
		rev[0].FrontendPort != htons(tcpPort) || rev[0].Client != be32(outsideIP) {
		t.Errorf("node 2's reverse entries %+v, want one flagged DSR naming %s:%d for client %s", rev, tp.n1.ip, tcpPort, outsideIP)
	}

	seen, err = tp.udpWhoami(udpPort)
	if err != nil {
		t.Fatalf("UDP to node 1's NodePort, DSR to node 2: %v", err)
	}
	if seen != outsideIP.String() {
		t.Errorf("UDP: backend saw %q, want the client %s", seen, outsideIP)
	}
	if rev := revEntries(t, tp.n1, npRemote, syscall.IPPROTO_UDP); len(rev) != 0 {
		t.Errorf("node 1 has UDP reverse entries %+v, want none", rev)
	}
	if rev := revEntries(t, tp.n2, npRemote, syscall.IPPROTO_UDP); len(rev) != 1 || rev[0].Flags&npFlagDSR == 0 ||
		rev[0].FrontendPort != htons(udpPort) {
		t.Errorf("node 2's UDP reverse entries %+v, want one flagged DSR for port %d", rev, udpPort)
	}

	// The option on the wire is Cilium's: r reads the IP options of a
	// datagram (IP_RECVOPTS).
	if got, want := dsrOptionSeen(t, tp, udpPort+3), []byte{0x9a, 8, 0xfc, 0x75, 1, 0, 78, 10}; !bytes.Equal(got, want) {
		t.Errorf("IP options at the backend % x, want % x (type 0x9a, length 8, port %d and %s byte-reversed)", got, want, udpPort+3, tp.n1.ip)
	}

	// A backend on node 1 itself: no SNAT either (the client's address,
	// replies through cil_from_container's reverse translation).
	tp.service(t, tcpPort+1, syscall.IPPROTO_TCP, svcNodePort, 1)
	c, seen, err = tp.dialWhoami(tcpPort + 1)
	if err != nil {
		t.Fatalf("TCP to node 1's NodePort, local backend: %v", err)
	}
	if err := roundTrip(c, "local echo"); err != nil {
		t.Errorf("local backend echo: %v", err)
	}
	c.Close()
	if seen != outsideIP.String() {
		t.Errorf("local backend saw %q, want the client %s", seen, outsideIP)
	}
	if rev := revEntries(t, tp.n1, npLocalIP, syscall.IPPROTO_TCP); len(rev) != 1 || rev[0].Flags&(npFlagSNAT|npFlagDSR) != 0 {
		t.Errorf("local backend: node 1's reverse entries %+v, want one without SNAT", rev)
	}

	// Hybrid: TCP by DSR, UDP by SNAT. r now also admits node 1
	// (remote-node), which SNAT shows it.
	if err := pm.Update(policy.Entry{Key: policy.NewKey(identity.ReservedIdentityRemoteNode, policy.Ingress, policy.ProtoUDP, npBackendPort, 16)}); err != nil {
		t.Fatal(err)
	}
	attachNodePort(t, tp.n1, bpf.LBModeHybrid)
	attachNodePort(t, tp.n2, bpf.LBModeHybrid)
	tp.service(t, udpPort+2, syscall.IPPROTO_UDP, svcNodePort, 12)
	seen, err = tp.udpWhoami(udpPort + 2)
	if err != nil {
		t.Fatalf("hybrid UDP: %v", err)
	}
	if seen != tp.n1.ip.String() {
		t.Errorf("hybrid UDP: backend saw %q, want node 1 %s (SNAT)", seen, tp.n1.ip)
	}
	if rev := revEntries(t, tp.n1, npRemote, syscall.IPPROTO_UDP); len(rev) != 1 || rev[0].Flags&npFlagSNAT == 0 {
		t.Errorf("hybrid UDP: node 1's reverse entries %+v, want one SNAT entry", rev)
	}
	tp.service(t, tcpPort+2, syscall.IPPROTO_TCP, svcNodePort, 2)
	c, seen, err = tp.dialWhoami(tcpPort + 2)
	if err != nil {
		t.Fatalf("hybrid TCP: %v", err)
	}
	c.Close()
	if seen != outsideIP.String() {
		t.Errorf("hybrid TCP: backend saw %q, want the client %s", seen, outsideIP)
	}
	if rev := revEntries(t, tp.n1, npRemote, syscall.IPPROTO_TCP); len(rev) != 0 {
		t.Errorf("hybrid TCP: node 1 has reverse entries %+v, want none", rev)
	}
}

// dsrOptionSeen sends a datagram from the outside to node 1's port, a
// NodePort whose backend is a UDP socket of pod r on port 8081 with
// IP_RECVOPTS, and returns the IP options r's socket got with it.
func dsrOptionSeen(t *testing.T, tp *npTopology, port uint16) []byte {
	t.Helper()
	const backendPort, backendID = 8081, 21
	var uc *net.UDPConn
	err := tp.r.ns.Do(func(ns.NetNS) error {
		var err error
		uc, err = net.ListenUDP("udp4", &net.UDPAddr{IP: npRemote.AsSlice(), Port: backendPort})
		if err != nil {
			return err
		}
		rc, err := uc.SyscallConn()
		if err != nil {
			return err
		}
		var serr error
		if err := rc.Control(func(fd uintptr) {
			serr = syscall.SetsockoptInt(int(fd), syscall.IPPROTO_IP, syscall.IP_RECVOPTS, 1)
		}); err != nil {
			return err
		}
		return serr
	})
	if err != nil {
		t.Fatal(err)
	}
	defer uc.Close()
	pm := openPolicy(t, tp.n2.dir, npEPR)
	if err := pm.Update(policy.Entry{Key: policy.NewKey(identity.ReservedIdentityWorld, policy.Ingress, policy.ProtoUDP, backendPort, 16)}); err != nil {
		t.Fatal(err)
	}
	if err := tp.lb.Backends.Update([]uint32{backendID}, []lb.L4Addr{{Addr: npRemote, Port: backendPort, Proto: syscall.IPPROTO_UDP}}); err != nil {
		t.Fatal(err)
	}
	tp.service(t, port, syscall.IPPROTO_UDP, svcNodePort, backendID)
	c, err := tp.dialOutside("udp4", netip.AddrPort{}, tp.nodePort(port), 0)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write([]byte("opt")); err != nil {
		t.Fatal(err)
	}
	_ = uc.SetReadDeadline(time.Now().Add(3 * time.Second))
	buf, oob := make([]byte, 64), make([]byte, 256)
	_, oobn, _, _, err := uc.ReadMsgUDP(buf, oob)
	if err != nil {
		t.Fatalf("backend socket: %v", err)
	}
	msgs, err := syscall.ParseSocketControlMessage(oob[:oobn])
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range msgs {
		if m.Header.Level == syscall.IPPROTO_IP && m.Header.Type == syscall.IP_RECVOPTS {
			return m.Data
		}
	}
	return nil
}
