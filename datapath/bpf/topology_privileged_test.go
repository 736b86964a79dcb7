package bpf_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	ebpflink "github.com/cilium/ebpf/link"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/containernetworking/plugins/pkg/testutils"
	"github.com/vishvananda/netlink"

	"github.com/cellium/cellium/datapath/bpf"
	"github.com/cellium/cellium/datapath/link"
)

// The test topology lives only in namespaces the test makes: a "node"
// namespace with forwarding on and the router IP on cellium_host (one end
// of a veth pair: the test kernel has no dummy driver), and one namespace
// per pod, attached with datapath/link exactly as the agent attaches pods
// (/32 address, default route via the router IP, /32 host route).
var routerIP = netip.MustParseAddr("10.77.0.1")

// newNetns makes a network namespace removed when tb ends.
func newNetns(tb testing.TB) ns.NetNS {
	tb.Helper()
	n, err := testutils.NewNS()
	if err != nil {
		tb.Fatalf("create netns: %v", err)
	}
	tb.Cleanup(func() {
		_ = n.Close()
		if _, err := os.Stat(n.Path()); err == nil {
			if err := testutils.UnmountNS(n); err != nil {
				tb.Errorf("remove netns %s: %v", n.Path(), err)
			}
		}
	})
	return n
}

type testNode struct {
	ns   ns.NetNS
	host link.Host
	// router is the router IP on cellium_host, the pods' gateway.
	router netip.Addr
}

func newTestNode(tb testing.TB) *testNode {
	tb.Helper()
	return newTestNodeWithRouter(tb, routerIP)
}

// newTestNodeWithRouter is newTestNode with router as the router IP, and
// reverse-path filtering off (a node of the two-node tests receives
// packets from remote pods).
func newTestNodeWithRouter(tb testing.TB, router netip.Addr) *testNode {
	tb.Helper()
	n := newNetns(tb)
	err := n.Do(func(ns.NetNS) error {
		for _, f := range []string{"ipv4/ip_forward", "ipv4/conf/all/rp_filter", "ipv4/conf/default/rp_filter"} {
			v := "1\n"
			if f != "ipv4/ip_forward" {
				v = "0\n"
			}
			if err := os.WriteFile("/proc/sys/net/"+f, []byte(v), 0); err != nil {
				return err
			}
		}
		attrs := netlink.NewLinkAttrs()
		attrs.Name = "cellium_host"
		dev := &netlink.Veth{LinkAttrs: attrs, PeerName: "cellium_net"}
		if err := netlink.LinkAdd(dev); err != nil {
			return fmt.Errorf("add router device: %w", err)
		}
		addr := &netlink.Addr{IPNet: &net.IPNet{IP: router.AsSlice(), Mask: net.CIDRMask(32, 32)}}
		if err := netlink.AddrAdd(dev, addr); err != nil {
			return err
		}
		for _, name := range []string{"cellium_host", "cellium_net"} {
			l, err := netlink.LinkByName(name)
			if err == nil {
				err = netlink.LinkSetUp(l)
			}
			if err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		tb.Fatalf("set up node namespace: %v", err)
	}
	return &testNode{ns: n, host: link.Host{NetnsPath: n.Path()}, router: router}
}

type testPod struct {
	ns  ns.NetNS
	ip  netip.Addr
	res link.Result
}

// addPod makes a pod namespace with address ip behind a veth to the node.
func (node *testNode) addPod(tb testing.TB, name string, ip netip.Addr) *testPod {
	tb.Helper()
	ctx := context.Background()
	pn := newNetns(tb)
	res, err := node.host.SetupEndpoint(ctx, link.Spec{
		ContainerID: fmt.Sprintf("cellium-bpf-test-%d-%s", os.Getpid(), name),
		NetnsPath:   pn.Path(),
		IPv4:        ip.AsSlice(),
		Gateway:     node.router.AsSlice(),
	})
	if err != nil {
		tb.Fatalf("SetupEndpoint %s: %v", name, err)
	}
	tb.Cleanup(func() {
		if err := node.host.RemoveEndpoint(ctx, res.HostIfName, pn.Path()); err != nil {
			tb.Errorf("RemoveEndpoint %s: %v", name, err)
		}
	})
	if err := node.host.EnsurePodRoute(ctx, res.HostIfName, ip.AsSlice()); err != nil {
		tb.Fatal(err)
	}
	return &testPod{ns: pn, ip: ip, res: res}
}

// attached are an endpoint's two tcx links.
type attached struct{ from, to ebpflink.Link }

// attach attaches the collection's programs to the pod's host-side veth
// with tcx, from inside the node namespace; detached when tb ends.
func (node *testNode) attach(tb testing.TB, pod *testPod, coll *ebpf.Collection) *attached {
	tb.Helper()
	a := &attached{}
	err := node.ns.Do(func(ns.NetNS) error {
		var err error
		a.from, err = ebpflink.AttachTCX(ebpflink.TCXOptions{
			Interface: pod.res.HostIfIndex, Program: coll.Programs[bpf.LxcProgCilFromContainer], Attach: ebpf.AttachTCXIngress,
		})
		if err != nil {
			return fmt.Errorf("attach cil_from_container: %w", err)
		}
		a.to, err = ebpflink.AttachTCX(ebpflink.TCXOptions{
			Interface: pod.res.HostIfIndex, Program: coll.Programs[bpf.LxcProgCilToContainer], Attach: ebpf.AttachTCXEgress,
		})
		if err != nil {
			a.from.Close()
			return fmt.Errorf("attach cil_to_container: %w", err)
		}
		return nil
	})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { a.from.Close(); a.to.Close() })
	return a
}

// replace swaps the attached programs for coll's, atomically per hook.
func (a *attached) replace(tb testing.TB, coll *ebpf.Collection) {
	tb.Helper()
	if err := a.from.Update(coll.Programs[bpf.LxcProgCilFromContainer]); err != nil {
		tb.Fatal(err)
	}
	if err := a.to.Update(coll.Programs[bpf.LxcProgCilToContainer]); err != nil {
		tb.Fatal(err)
	}
}

// echoServer echoes TCP on one port and UDP on the same port inside a pod
// until tb ends.
type echoServer struct {
	tcp   net.Listener
	udp   net.PacketConn
	wg    sync.WaitGroup
	mu    sync.Mutex
	conns []net.Conn
}

func (p *testPod) serveEcho(tb testing.TB, port uint16) {
	tb.Helper()
	s := &echoServer{}
	err := p.ns.Do(func(ns.NetNS) error {
		var err error
		addr := netip.AddrPortFrom(p.ip, port).String()
		if s.tcp, err = net.Listen("tcp4", addr); err != nil {
			return err
		}
		s.udp, err = net.ListenPacket("udp4", addr)
		return err
	})
	if err != nil {
		tb.Fatalf("listen in pod: %v", err)
	}
	s.wg.Add(2)
	go func() {
		defer s.wg.Done()
		for {
			c, err := s.tcp.Accept()
			if err != nil {
				return
			}
			s.mu.Lock()
			s.conns = append(s.conns, c)
			s.mu.Unlock()
			s.wg.Add(1)
			go func() {
				defer s.wg.Done()
				_, _ = io.Copy(c, c)
				c.Close()
			}()
		}
	}()
	go func() {
		defer s.wg.Done()
		buf := make([]byte, 1500)
		for {
			n, from, err := s.udp.ReadFrom(buf)
			if err != nil {
				return
			}
			_, _ = s.udp.WriteTo(buf[:n], from)
		}
	}()
	tb.Cleanup(func() {
		s.tcp.Close()
		s.udp.Close()
		s.mu.Lock()
		for _, c := range s.conns {
			c.Close()
		}
		s.mu.Unlock()
		s.wg.Wait()
	})
}

// dial connects from inside the pod; ctx bounds the attempt.
func (p *testPod) dial(ctx context.Context, dst netip.AddrPort) (net.Conn, error) {
	var c net.Conn
	err := p.ns.Do(func(ns.NetNS) error {
		var err error
		c, err = (&net.Dialer{}).DialContext(ctx, "tcp4", dst.String())
		return err
	})
	return c, err
}

// roundTrip writes msg on c and reads it back within 5 s.
func roundTrip(c net.Conn, msg string) error {
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	defer c.SetDeadline(time.Time{})
	if _, err := c.Write([]byte(msg)); err != nil {
		return err
	}
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(c, got); err != nil {
		return err
	}
	if string(got) != msg {
		return fmt.Errorf("echo %q, want %q", got, msg)
	}
	return nil
}

// tcpEcho connects, echoes one message and closes.
func (p *testPod) tcpEcho(dst netip.AddrPort) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := p.dial(ctx, dst)
	if err != nil {
		return err
	}
	defer c.Close()
	return roundTrip(c, "cellium-bpf")
}

// udpEcho sends datagrams until one comes back (at most 5 tries, 1 s
// each).
func (p *testPod) udpEcho(dst netip.AddrPort) error {
	var c net.Conn
	if err := p.ns.Do(func(ns.NetNS) error {
		var err error
		c, err = net.Dial("udp4", dst.String())
		return err
	}); err != nil {
		return err
	}
	defer c.Close()
	buf := make([]byte, 64)
	for range 5 {
		if _, err := c.Write([]byte("cellium-udp")); err != nil {
			return err
		}
		_ = c.SetReadDeadline(time.Now().Add(time.Second))
		n, err := c.Read(buf)
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			continue
		}
		if err != nil {
			return err
		}
		if string(buf[:n]) != "cellium-udp" {
			return fmt.Errorf("udp echo %q", buf[:n])
		}
		return nil
	}
	return fmt.Errorf("no udp echo from %s in 5 tries", dst)
}
