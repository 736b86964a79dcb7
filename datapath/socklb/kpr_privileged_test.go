package socklb

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cellium/cellium/statedb/lb"
	"github.com/cellium/cellium/test/privileged"
)

// runKPRItem runs the child items of the kube-proxy replacement test
// (see runChild); it reports false for other kinds.
//
//	peer=ADDR  TCP connect to ADDR, print "peer <getpeername>" and the
//	           answer of a serve= server
func runKPRItem(kind, arg string) (bool, error) {
	if kind != "peer" {
		return false, nil
	}
	c, err := net.DialTimeout("tcp4", arg, 3*time.Second)
	if err != nil {
		return true, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(3 * time.Second))
	if _, err := c.Write([]byte("?")); err != nil {
		return true, err
	}
	b := make([]byte, 16)
	n, err := c.Read(b)
	if err != nil {
		return true, err
	}
	fmt.Println(kind, c.RemoteAddr(), string(b[:n]))
	return true, nil
}

// TestPrivilegedSocketLBKubeProxyReplacement: the frontends of
// --kube-proxy-replacement at the socket, with the programs on a cgroup
// of the test's own and the clients in two network namespaces of their
// own, one standing for the node's host namespace (HostNetnsCookie), one
// for a pod:
//
//   - a NodePort frontend with externalTrafficPolicy Local and two scopes
//     sends sockets to its internal scope's backend, never to the
//     external scope's (a socket is a client inside the cluster);
//   - the NodePort's wildcard 0.0.0.0 answers 127.0.0.1:nodePort in the
//     host namespace, TCP and UDP, and the client sees 127.0.0.1:nodePort
//     as its peer and as the datagrams' source; in the pod's namespace
//     127.0.0.1 stays the pod's own loopback (connection refused);
//   - a frontend without backends fails connect() with EHOSTUNREACH.
func TestPrivilegedSocketLBKubeProxyReplacement(t *testing.T) {
	privileged.Require(t)
	e := newLBEnv(t)
	node, pod := e.newClient(), e.newClient()
	if err := AttachWith(e.m, e.cg, e.linkDir, Options{HostNetnsCookie: node.cookie}); err != nil {
		t.Fatal(err)
	}
	loop := func(port uint16, proto uint8) lb.L4Addr {
		return lb.L4Addr{Addr: netip.MustParseAddr("127.0.0.1"), Port: port, Proto: proto}
	}
	// Backends 1..3 TCP on the clients' loopback, 4 UDP.
	e.addBackends([]uint32{1, 2, 3, 4}, []lb.L4Addr{loop(backendPorts[0], lb.TCP), loop(backendPorts[1], lb.TCP),
		loop(backendPorts[2], lb.TCP), loop(backendPorts[2], lb.UDP)})
	x := byte(os.Getpid()%250) + 1
	nodeIP := netip.AddrFrom4([4]byte{198, 18, x, 20})
	update := func(f *lb.Frontend) {
		t.Helper()
		txn := e.db.ReadTxn()
		for _, id := range slices.Concat(f.BackendIDs, f.IntBackendIDs) {
			b, _, ok := e.backends.Get(txn, lb.BackendIDIndex.Query(id))
			if !ok {
				t.Fatalf("no backend %d", id)
			}
			if slices.Contains(f.BackendIDs, id) {
				f.Backends = append(f.Backends, b.Address)
			}
			if slices.Contains(f.IntBackendIDs, id) {
				f.IntBackends = append(f.IntBackends, b.Address)
			}
		}
		if err := e.ops.Update(context.Background(), txn, f); err != nil {
			t.Fatal(err)
		}
	}
	local := lb.L4Addr{Addr: nodeIP, Port: 30080, Proto: lb.TCP}
	update(&lb.Frontend{Address: local, Type: lb.TypeNodePort, Service: "test/local", Local: true, TwoScopes: true,
		BackendIDs: []uint32{1}, IntBackendIDs: []uint32{2}})
	any := netip.IPv4Unspecified()
	update(&lb.Frontend{Address: lb.L4Addr{Addr: any, Port: 30081, Proto: lb.TCP}, Type: lb.TypeNodePort, Service: "test/np",
		BackendIDs: []uint32{3}})
	update(&lb.Frontend{Address: lb.L4Addr{Addr: any, Port: 30081, Proto: lb.UDP}, Type: lb.TypeNodePort, Service: "test/np",
		BackendIDs: []uint32{4}})
	update(&lb.Frontend{Address: lb.L4Addr{Addr: any, Port: 30082, Proto: lb.TCP}, Type: lb.TypeNodePort, Service: "test/empty"})

	// Two scopes: the internal one's backend (port 18082) only.
	for _, c := range []*client{pod, node} {
		if got := distinct(e.ask(c, "tcpwho", local, 6)); !slices.Equal(got, []uint16{backendPorts[1]}) {
			t.Errorf("two-scope NodePort %v answered by %v, want the internal scope's %d only", local, got, backendPorts[1])
		}
	}
	// The host's loopback reaches the NodePort; TCP and UDP.
	lo := netip.MustParseAddr("127.0.0.1")
	if got := distinct(e.ask(node, "tcpwho", lb.L4Addr{Addr: lo, Port: 30081, Proto: lb.TCP}, 2)); !slices.Equal(got, []uint16{backendPorts[2]}) {
		t.Errorf("127.0.0.1:30081/TCP from the host namespace answered by %v, want %d", got, backendPorts[2])
	}
	if got := distinct(e.ask(node, "udpwho", lb.L4Addr{Addr: lo, Port: 30081, Proto: lb.UDP}, 2)); !slices.Equal(got, []uint16{backendPorts[2]}) {
		t.Errorf("127.0.0.1:30081/UDP from the host namespace answered by %v, want %d", got, backendPorts[2])
	}
	serve := fmt.Sprintf("serve=%d/%d/%d", backendPorts[0], backendPorts[1], backendPorts[2])
	out := child(t, e.cg, "netns="+node.netns.Path()+","+serve+",peer=127.0.0.1:30081,refused=127.0.0.1:30082")
	if want := fmt.Sprintf("peer 127.0.0.1:30081 %d\nrefused EHOSTUNREACH\n", backendPorts[2]); out != want {
		t.Errorf("host namespace, getpeername and a NodePort without backends:\n%s\nwant:\n%s", out, want)
	}
	// A pod's loopback is its own.
	out = child(t, e.cg, "netns="+pod.netns.Path()+",refused=127.0.0.1:30081")
	if strings.TrimSpace(out) != "refused ECONNREFUSED" {
		t.Errorf("127.0.0.1:30081 from a pod: %q, want ECONNREFUSED (untranslated, nothing listens)", out)
	}
}
