package socklb

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/cellium/cellium/datapath/bpf"
	"github.com/cellium/cellium/statedb/lb"
	"github.com/cellium/cellium/test/privileged"
)

// runBenchItem runs the benchmark's child item; it reports false for
// other kinds.
//
//	connect=ADDR:port*N  connect a UDP socket (AF_INET for an IPv4
//	                     address, else dual-stack AF_INET6) to ADDR:port
//	                     N times (a UDP socket may connect again: each
//	                     connect runs the hook); print "connect <ns per
//	                     connect>"
func runBenchItem(kind, arg string) (bool, error) {
	if kind != "connect" {
		return false, nil
	}
	addr, count, _ := strings.Cut(arg, "*")
	n, err := strconv.Atoi(count)
	if err != nil {
		return true, err
	}
	ap, err := netip.ParseAddrPort(addr)
	if err != nil {
		return true, err
	}
	family := unix.AF_INET6
	var sa unix.Sockaddr = &unix.SockaddrInet6{Port: int(ap.Port()), Addr: ap.Addr().As16()}
	if ap.Addr().Is4() {
		family, sa = unix.AF_INET, &unix.SockaddrInet4{Port: int(ap.Port()), Addr: ap.Addr().As4()}
	}
	fd, err := unix.Socket(family, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return true, err
	}
	defer unix.Close(fd)
	if family == unix.AF_INET6 {
		if err := unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_V6ONLY, 0); err != nil {
			return true, err
		}
	}
	start := time.Now()
	for range n {
		if err := unix.Connect(fd, sa); err != nil {
			return true, fmt.Errorf("connect %s: %w", addr, err)
		}
	}
	fmt.Println(kind, float64(time.Since(start).Nanoseconds())/float64(n))
	return true, nil
}

// BenchmarkPrivilegedSocketLBConnect measures what the programs add to
// connect(): a client process in a network namespace of its own connects
// one UDP socket b.N times (no packet is sent) and reports ns/connect,
// measured in the client (ns/op also counts starting it), and, from the
// kernel's BPF run-time statistics (BPF_ENABLE_STATS while the benchmark
// runs), ns/run of the connect4 or connect6 program alone.
// "no-programs" runs outside the programs' cgroup; "not-frontend" is an
// address the programs look up and leave; "frontend" is translated (one
// backend, no affinity: services looked up twice, backends once, the
// reverse entry written). v6 is a dual-stack AF_INET6 socket: "real" is
// [::1], which the program leaves after checking the prefix; "mapped-*"
// are [::ffff:a.b.c.d].
func BenchmarkPrivilegedSocketLBConnect(b *testing.B) {
	privileged.Require(b)
	e := newLBEnv(b)
	stats, err := ebpf.EnableStats(unix.BPF_STATS_RUN_TIME)
	if err != nil {
		b.Fatalf("enable BPF run-time statistics: %v", err)
	}
	defer stats.Close()
	x := byte(os.Getpid()%250) + 1
	vip := netip.AddrFrom4([4]byte{198, 18, x, 50})
	loop := netip.MustParseAddr("127.0.0.1")
	const port = 18081
	e.addBackends([]uint32{1}, []lb.L4Addr{{Addr: loop, Port: port, Proto: lb.UDP}})
	e.frontend(lb.L4Addr{Addr: vip, Port: 53, Proto: lb.UDP}, false, 0, 1)
	c := e.newClient()
	be := netip.AddrPortFrom(loop, port)
	fe := netip.AddrPortFrom(vip, 53)
	mapped := func(ap netip.AddrPort) netip.AddrPort {
		return netip.AddrPortFrom(netip.AddrFrom16(ap.Addr().As16()), ap.Port())
	}
	one6 := netip.AddrPortFrom(netip.IPv6Loopback(), port)
	for _, bc := range []struct {
		name     string
		dst      netip.AddrPort
		programs bool
	}{
		{"v4/no-programs", be, false},
		{"v4/not-frontend", be, true},
		{"v4/frontend", fe, true},
		{"v6/no-programs", one6, false},
		{"v6/real", one6, true},
		{"v6/mapped-no-programs", mapped(be), false},
		{"v6/mapped-not-frontend", mapped(be), true},
		{"v6/mapped-frontend", mapped(fe), true},
	} {
		b.Run(bc.name, func(b *testing.B) {
			cg := ""
			if bc.programs {
				cg = e.cg
			}
			var prog *ebpf.Program
			if bc.programs {
				name := bpf.SockProgCilSock4Connect
				if bc.dst.Addr().Is6() {
					name = bpf.SockProgCilSock6Connect
				}
				prog = linkedProgram(b, filepath.Join(e.linkDir, name))
			}
			before := progStats(b, prog)
			out := child(b, cg, fmt.Sprintf("netns=%s,connect=%s*%d", c.netns.Path(), bc.dst, b.N))
			after := progStats(b, prog)
			if runs := after.RunCount - before.RunCount; prog != nil {
				if runs < uint64(b.N) {
					b.Fatalf("%s ran %d times for %d connects", prog, runs, b.N)
				}
				b.ReportMetric(float64(after.Runtime-before.Runtime)/float64(runs), "ns/run")
			}
			f := strings.Fields(out)
			if len(f) != 2 || f[0] != "connect" {
				b.Fatalf("client: %q", out)
			}
			ns, err := strconv.ParseFloat(f[1], 64)
			if err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(ns, "ns/connect")
		})
	}
}

// linkedProgram returns the program of the link pinned at pin.
func linkedProgram(tb testing.TB, pin string) *ebpf.Program {
	tb.Helper()
	l, err := link.LoadPinnedLink(pin, nil)
	if err != nil {
		tb.Fatal(err)
	}
	defer l.Close()
	info, err := l.Info()
	if err != nil {
		tb.Fatal(err)
	}
	p, err := ebpf.NewProgramFromID(info.Program)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { p.Close() })
	return p
}

// progStats returns p's run-time statistics (zero for nil).
func progStats(tb testing.TB, p *ebpf.Program) ebpf.ProgramStats {
	tb.Helper()
	if p == nil {
		return ebpf.ProgramStats{}
	}
	s, err := p.Stats()
	if err != nil {
		tb.Fatal(err)
	}
	return *s
}
