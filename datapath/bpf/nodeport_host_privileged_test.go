package bpf_test

import (
	"net/netip"
	"syscall"
	"testing"

	"github.com/cellium/cellium/statedb/lb"
)

// hostBackendPort is where node 1 itself serves whoami (a hostNetwork
// pod's port).
const hostBackendPort = 18080

// TestPrivilegedNodePortHostBackend: a NodePort whose backend is node 1
// itself (a hostNetwork pod: the node's address and the pod's port)
// answers clients outside the node, TCP and UDP, with
// externalTrafficPolicy Cluster and Local, also when it shares the
// frontend with a backend on node 2. The request goes up node 1's stack
// with the client's address kept (SNAT to the node's own address would be
// a martian source there), and cil_to_netdev on eth0's egress translates
// the node's replies back to the frontend. Before cil_to_netdev and the
// host check, cil_from_netdev found no route to forward to its own address
// and dropped the request (the e2e spec "Networking Granular Checks:
// Services should function for service endpoints using hostNetwork"
// never reached the node it dialed).
func TestPrivilegedNodePortHostBackend(t *testing.T) {
	tp := newNPTopology(t, false)
	(&testPod{ns: tp.n1.ns, ip: tp.n1.ip}).serveWhoami(t, hostBackendPort)
	const hostTCP, hostUDP = 5, 15
	for id, proto := range map[uint32]uint8{hostTCP: syscall.IPPROTO_TCP, hostUDP: syscall.IPPROTO_UDP} {
		if err := tp.lb.Backends.Update([]uint32{id}, []lb.L4Addr{{Addr: tp.n1.ip, Port: hostBackendPort, Proto: proto}}); err != nil {
			t.Fatal(err)
		}
	}
	tp.service(t, 30090, syscall.IPPROTO_TCP, svcNodePort, hostTCP)
	tp.service(t, 30090, syscall.IPPROTO_UDP, svcNodePort, hostUDP)
	tp.service(t, 30091, syscall.IPPROTO_TCP, svcNodePort|svcLocal, hostTCP)
	tp.service(t, 30091, syscall.IPPROTO_UDP, svcNodePort|svcLocal, hostUDP)
	// The host and the pod on node 2 behind one frontend.
	tp.service(t, 30092, syscall.IPPROTO_TCP, svcNodePort, hostTCP, 2)

	client := outsideIP.String()
	for _, port := range []uint16{30090, 30091} {
		conn, seen, err := tp.dialWhoami(port)
		if err != nil {
			t.Fatalf("tcp %s:%d (backend: node 1 itself) from outside: %v", tp.n1.ip, port, err)
		}
		if seen != client {
			t.Errorf("port %d: the node saw source %s, want the client %s", port, seen, client)
		}
		if err := roundTrip(conn, "to the node itself"); err != nil {
			t.Errorf("port %d echo: %v", port, err)
		}
		conn.Close()
		seen, err = tp.udpWhoami(port)
		if err != nil {
			t.Fatalf("udp %s:%d (backend: node 1 itself) from outside: %v", tp.n1.ip, port, err)
		}
		if seen != client {
			t.Errorf("udp port %d: the node saw source %s, want the client %s", port, seen, client)
		}
	}
	// Both backends, each connection whole: the host's keeps the client,
	// node 2's pod sees node 1 (SNAT).
	seen := map[string]int{}
	for range 24 {
		conn, who, err := tp.dialWhoami(30092)
		if err != nil {
			t.Fatalf("tcp %s:30092 (node 1 and a pod on node 2) from outside: %v (so far %v)", tp.n1.ip, err, seen)
		}
		if err := roundTrip(conn, "mixed"); err != nil {
			t.Errorf("echo through 30092 (backend saw %s): %v", who, err)
		}
		conn.Close()
		seen[who]++
	}
	if seen[client] == 0 || seen[tp.n1.ip.String()] == 0 || len(seen) != 2 {
		t.Errorf("sources seen through a frontend of the host and a remote pod: %v, want both %s (host) and %s (remote, SNAT)",
			seen, client, netip.Addr(tp.n1.ip))
	}
}
