package socklb

import (
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/cellium/cellium/datapath/maps"
	"github.com/cellium/cellium/statedb/lb"
	"github.com/cellium/cellium/test/privileged"
)

// runChild is the client side of TestPrivilegedSocketLB, run in the test's
// cgroup: for each "kind=addr" in args (comma-separated) it does one
// exchange and prints one line.
//
//	tcp=VIP:port      connect, echo, print "tcp <peer>" (getpeername)
//	udp=VIP:port      connected UDP: echo, print "udp <peer>"
//	udpto=VIP:port    unconnected UDP: sendto, recvfrom, print "udpto <from>"
//	refused=VIP:port  connect; print "refused <errno name>"
//
// and for TestPrivilegedSocketLBSessionAffinity:
//
//	netns=PATH           every later socket is in the network namespace
//	                     PATH (the client the affinity is for)
//	serve=P1/P2/...      TCP and UDP servers on 127.0.0.1:Pi answering Pi
//	serve6=P1/P2/...     the same on [::1]:Pi
//	tcpwho=VIP:port*N    N connections, print "tcpwho <answer>" each
//	udpwho=VIP:port*N    N sendto/recvfrom on one unconnected UDP socket,
//	                     print "udpwho <answer> <from>" each
//
// and the AF_INET6 items of TestPrivilegedSocketLBMappedV4 (see
// runMappedItem) and the benchmark's (runBenchItem).
func runChild(args string) error {
	for item := range strings.SplitSeq(args, ",") {
		kind, addr, _ := strings.Cut(item, "=")
		var done bool
		var err error
		for _, run := range []func(kind, arg string) (bool, error){runAffinityItem, runMappedItem, runBenchItem, runKPRItem} {
			if done, err = run(kind, addr); done || err != nil {
				break
			}
		}
		if done || err != nil {
			if err != nil {
				return fmt.Errorf("%s: %w", item, err)
			}
			continue
		}
		msg := []byte("cellium socket lb")
		buf := make([]byte, 64)
		deadline := time.Now().Add(3 * time.Second)
		switch kind {
		case "tcp", "udp":
			c, err := net.DialTimeout(kind+"4", addr, 3*time.Second)
			if err != nil {
				return fmt.Errorf("%s %s: %w", kind, addr, err)
			}
			_ = c.SetDeadline(deadline)
			if _, err := c.Write(msg); err != nil {
				return err
			}
			if _, err := io.ReadAtLeast(c, buf, len(msg)); err != nil {
				return fmt.Errorf("%s %s: read: %w", kind, addr, err)
			}
			fmt.Println(kind, c.RemoteAddr())
			c.Close()
		case "udpto":
			pc, err := net.ListenPacket("udp4", "127.0.0.1:0")
			if err != nil {
				return err
			}
			_ = pc.SetDeadline(deadline)
			ua, err := net.ResolveUDPAddr("udp4", addr)
			if err != nil {
				return err
			}
			if _, err := pc.WriteTo(msg, ua); err != nil {
				return fmt.Errorf("udpto %s: %w", addr, err)
			}
			_, from, err := pc.ReadFrom(buf)
			if err != nil {
				return fmt.Errorf("udpto %s: read: %w", addr, err)
			}
			fmt.Println(kind, from)
			pc.Close()
		case "refused":
			c, err := net.DialTimeout("tcp4", addr, 3*time.Second)
			if err == nil {
				c.Close()
				fmt.Println(kind, "connected")
				continue
			}
			var errno syscall.Errno
			if errors.As(err, &errno) {
				fmt.Println(kind, unix.ErrnoName(errno))
			} else {
				fmt.Println(kind, err)
			}
		default:
			return fmt.Errorf("unknown kind %q", kind)
		}
	}
	return nil
}

// cgroup2Mount finds the machine's cgroup v2 mount.
func cgroup2Mount(t testing.TB) string {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mounts")
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 3 && f[2] == "cgroup2" {
			return f[1]
		}
	}
	t.Skip("no cgroup2 mount on this machine")
	return ""
}

// echo serves TCP and UDP echo on 127.0.0.1 (free ports) until the test
// ends and returns the two addresses.
func echo(t *testing.T) (tcp, udp netip.AddrPort) {
	t.Helper()
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	pc, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{}, 2)
	go func() {
		defer func() { done <- struct{}{} }()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); _, _ = io.Copy(c, c) }()
		}
	}()
	go func() {
		defer func() { done <- struct{}{} }()
		buf := make([]byte, 1500)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			_, _ = pc.WriteTo(buf[:n], from)
		}
	}()
	t.Cleanup(func() { ln.Close(); pc.Close(); <-done; <-done })
	return ln.Addr().(*net.TCPAddr).AddrPort(), pc.LocalAddr().(*net.UDPAddr).AddrPort()
}

// TestPrivilegedSocketLB attaches the programs to a cgroup of the test's
// own (not the root: nothing else on the machine is affected) and runs a
// client in it: TCP, connected UDP and unconnected UDP to a frontend reach
// the backend (an echo server on loopback), and the client sees the
// frontend as its peer (getpeername4) and as the source of the datagram
// (recvmsg4); an address that is no frontend is left alone; a frontend
// without backends fails connect() with EHOSTUNREACH; after Detach the
// frontend is not translated any more. The frontend range is blackholed,
// so an untranslated packet never leaves the machine.
func TestPrivilegedSocketLB(t *testing.T) {
	privileged.Require(t)
	cg := filepath.Join(cgroup2Mount(t), "cellium-socklb-test-"+strings.ToLower(rand.Text()[:8]))
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
	// 198.18.0.0/15 is for benchmarks; a /24 of it per process.
	x := byte(os.Getpid()%250) + 1
	prefix := netip.PrefixFrom(netip.AddrFrom4([4]byte{198, 18, x, 0}), 24)
	route := &netlink.Route{Dst: &net.IPNet{IP: prefix.Addr().AsSlice(), Mask: net.CIDRMask(24, 32)},
		Type: syscall.RTN_BLACKHOLE, Table: syscall.RT_TABLE_MAIN}
	if err := netlink.RouteAdd(route); err != nil {
		t.Fatalf("blackhole %s: %v", prefix, err)
	}
	t.Cleanup(func() { _ = netlink.RouteDel(route) })

	// Maps of another size than the object's (--bpf-lb-map-max): the
	// programs load against them as they are.
	m, err := maps.OpenLBWith(bpffs, maps.LBOptions{MapMax: 4096})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close() })
	tcpBE, udpBE := echo(t)
	vip := netip.AddrFrom4([4]byte{198, 18, x, 10})
	empty := netip.AddrFrom4([4]byte{198, 18, x, 11})
	fe := func(a netip.Addr, port uint16, proto uint8) lb.L4Addr {
		return lb.L4Addr{Addr: a, Port: port, Proto: proto}
	}
	// Backend 1 TCP, backend 2 UDP; 198.18.x.10:80 TCP and UDP;
	// 198.18.x.11:80 TCP without backends.
	if err := m.Backends.Update([]uint32{1, 2}, []lb.L4Addr{
		{Addr: tcpBE.Addr(), Port: tcpBE.Port(), Proto: lb.TCP}, {Addr: udpBE.Addr(), Port: udpBE.Port(), Proto: lb.UDP}}); err != nil {
		t.Fatal(err)
	}
	if err := m.Services.Update(
		[]maps.ServiceSlot{{Frontend: fe(vip, 80, lb.TCP), Slot: 1}, {Frontend: fe(vip, 80, lb.TCP)},
			{Frontend: fe(vip, 80, lb.UDP), Slot: 1}, {Frontend: fe(vip, 80, lb.UDP)}, {Frontend: fe(empty, 80, lb.TCP)}},
		[]maps.ServiceValue{{BackendID: 1}, {Count: 1}, {BackendID: 2}, {Count: 1}, {Count: 0}}); err != nil {
		t.Fatal(err)
	}
	linkDir := filepath.Join(bpffs, "socklb")
	// A pin of a program this version does not have (left by another
	// version of the agent) goes at Attach.
	stray := filepath.Join(linkDir, "cil_sock6_sendmsg")
	pinStray(t, stray)
	if err := Attach(m, cg, linkDir); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = Detach(linkDir) })
	names, err := Attached(linkDir)
	if err != nil || len(names) != len(Programs) {
		t.Fatalf("attached %v (%v), want %d links", names, err, len(Programs))
	}
	if _, err := os.Stat(stray); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("stray pin %s still there after Attach (%v)", stray, err)
	}
	// Attaching again updates the pinned links in place.
	if err := Attach(m, cg, linkDir); err != nil {
		t.Fatalf("attach again: %v", err)
	}

	v80 := netip.AddrPortFrom(vip, 80).String()
	out := child(t, cg, "tcp="+v80+",udp="+v80+",udpto="+v80+",refused="+netip.AddrPortFrom(empty, 80).String()+
		",tcp="+tcpBE.String())
	want := []string{"tcp " + v80, "udp " + v80, "udpto " + v80, "refused EHOSTUNREACH", "tcp " + tcpBE.String()}
	t.Logf("client in the cgroup:\n%s", out)
	if out != strings.Join(want, "\n")+"\n" {
		t.Errorf("client in the cgroup:\n%s\nwant:\n%s", out, strings.Join(want, "\n"))
	}

	// Detached: the frontend is an ordinary (blackholed) address again.
	// Detach removes a stray pin too, and the directory.
	pinStray(t, stray)
	if err := Detach(linkDir); err != nil {
		t.Fatal(err)
	}
	if names, _ := Attached(linkDir); len(names) != 0 {
		t.Fatalf("still pinned after Detach: %v", names)
	}
	if _, err := os.Stat(linkDir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s still there after Detach (%v)", linkDir, err)
	}
	// A blackhole route answers EINVAL to connect(); translated, the
	// connection would have reached the echo server.
	out = child(t, cg, "refused="+v80)
	t.Logf("after Detach: %s", out)
	if strings.TrimSpace(out) != "refused EINVAL" {
		t.Errorf("after Detach, connect to %s: %q, want the blackhole's EINVAL", v80, out)
	}
}

// pinStray pins a small map at pin (creating its directory), standing in
// for a link pinned by another version of the agent.
func pinStray(t *testing.T, pin string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(pin), 0o700); err != nil {
		t.Fatal(err)
	}
	m, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Array, KeySize: 4, ValueSize: 4, MaxEntries: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if err := m.Pin(pin); err != nil {
		t.Fatal(err)
	}
}

// child runs runChild(args) in cgroup cg (in the test's own cgroup if cg
// is empty) and returns its output.
func child(t testing.TB, cg, args string) string {
	t.Helper()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), childEnv+"="+args)
	if cg != "" {
		f, err := os.Open(cg)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(f.Fd())}
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("client %s: %v\n%s", args, err, out)
	}
	return string(out)
}
