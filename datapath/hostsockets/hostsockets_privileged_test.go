package hostsockets_test

import (
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/cellium/cellium/datapath/hostsockets"
	"github.com/cellium/cellium/datapath/netns"
	"github.com/cellium/cellium/statedb/lb"
	"github.com/cellium/cellium/test/privileged"
)

// newNetns creates a network namespace (loopback up) for the test and
// removes it at the end.
func newNetns(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "ns")
	if err := netns.Create(path); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := netns.Remove(path); err != nil {
			t.Error(err)
		}
	})
	return path
}

// in runs f inside the namespace at path.
func in(t *testing.T, path string, f func() error) {
	t.Helper()
	n, err := ns.GetNS(path)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	if err := n.Do(func(ns.NetNS) error { return f() }); err != nil {
		t.Fatal(err)
	}
}

func find(socks []hostsockets.Socket, proto uint8, port uint16) (hostsockets.Socket, bool) {
	for _, s := range socks {
		if s.Proto == proto && s.Port == port {
			return s, true
		}
	}
	return hostsockets.Socket{}, false
}

func list(t *testing.T, l *hostsockets.Lister) []hostsockets.Socket {
	t.Helper()
	socks, err := l.Listening()
	if err != nil {
		t.Fatal(err)
	}
	return socks
}

// TestPrivilegedListening opens sockets in a namespace of its own and
// checks that the listeners and bound UDP sockets are listed with their
// address, and the connected ones, the closed ones and those of other
// namespaces are not.
func TestPrivilegedListening(t *testing.T) {
	privileged.Require(t)
	path := newNetns(t)
	l, err := hostsockets.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if socks := list(t, l); len(socks) != 0 {
		t.Fatalf("a new namespace has listening sockets: %v", socks)
	}

	var tcpAny, tcpLo net.Listener
	var udpLo, udpConn net.PacketConn
	var client net.Conn
	var udpClient net.Conn
	in(t, path, func() error {
		var err error
		if tcpAny, err = net.Listen("tcp", ":0"); err != nil { // [::], dual-stack
			return err
		}
		if tcpLo, err = net.Listen("tcp4", "127.0.0.1:0"); err != nil {
			return err
		}
		if udpLo, err = net.ListenPacket("udp4", "127.0.0.1:0"); err != nil {
			return err
		}
		if udpConn, err = net.ListenPacket("udp4", "0.0.0.0:0"); err != nil {
			return err
		}
		// Connected sockets take no traffic to their own port from
		// anyone: not listed.
		if client, err = net.Dial("tcp4", tcpLo.Addr().String()); err != nil {
			return err
		}
		udpClient, err = net.Dial("udp4", udpLo.LocalAddr().String())
		return err
	})
	defer client.Close()
	defer udpClient.Close()
	port := func(a net.Addr) uint16 { return uint16(a.(interface{ AddrPort() netip.AddrPort }).AddrPort().Port()) }

	socks := list(t, l)
	want := []struct {
		proto uint8
		port  uint16
		addr  netip.Addr
	}{
		{lb.TCP, port(tcpAny.Addr()), netip.IPv6Unspecified()},
		{lb.TCP, port(tcpLo.Addr()), netip.MustParseAddr("127.0.0.1")},
		{lb.UDP, port(udpLo.LocalAddr()), netip.MustParseAddr("127.0.0.1")},
		{lb.UDP, port(udpConn.LocalAddr()), netip.IPv4Unspecified()},
	}
	for _, w := range want {
		s, ok := find(socks, w.proto, w.port)
		if !ok {
			t.Errorf("%s port %d not listed: %v", lb.ProtoName(w.proto), w.port, socks)
			continue
		}
		if s.Addr != w.addr || !s.Own || s.Inode == 0 {
			t.Errorf("%s port %d: got %+v, want address %s, own, an inode", lb.ProtoName(w.proto), w.port, s, w.addr)
		}
		if w.addr.IsUnspecified() != s.Wildcard() {
			t.Errorf("%v: Wildcard() = %v", s, s.Wildcard())
		}
	}
	if len(socks) != len(want) {
		t.Errorf("listed %d sockets, want %d (the connected ones left out): %v", len(socks), len(want), socks)
	}
	// Another namespace has none of them.
	other, err := hostsockets.Open(newNetns(t))
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if os := list(t, other); len(os) != 0 {
		t.Errorf("another namespace lists the test namespace's sockets: %v", os)
	}

	for _, c := range []interface{ Close() error }{tcpAny, tcpLo, udpLo, udpConn} {
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if socks := list(t, l); len(socks) != 0 {
		t.Fatalf("closed sockets still listed: %v", socks)
	}
}

// TestPrivilegedOtherProcess hands a listener to a child process: it is
// listed as not the caller's, Processes names the child, and it goes when
// the child ends.
func TestPrivilegedOtherProcess(t *testing.T) {
	privileged.Require(t)
	path := newNetns(t)
	l, err := hostsockets.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	var ln *net.TCPListener
	in(t, path, func() error {
		var err error
		ln, err = net.ListenTCP("tcp4", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
		return err
	})
	port := uint16(ln.Addr().(*net.TCPAddr).Port)
	f, err := ln.File()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("sleep", "60")
	cmd.ExtraFiles = []*os.File{f}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	defer func() {
		_ = cmd.Process.Kill()
		<-done
	}()
	_ = f.Close()
	_ = ln.Close()

	s, ok := find(list(t, l), lb.TCP, port)
	if !ok {
		t.Fatalf("the child's listener on port %d is not listed", port)
	}
	if s.Own {
		t.Errorf("the child's listener is listed as the caller's: %+v", s)
	}
	procs := hostsockets.Processes("/proc", []uint32{s.Inode})
	if p := procs[s.Inode]; p.PID != cmd.Process.Pid || p.Comm != "sleep" {
		t.Errorf("Processes: got %v for inode %d, want sleep (pid %d)", procs, s.Inode, cmd.Process.Pid)
	}

	_ = cmd.Process.Kill()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the child did not end")
	}
	if _, ok := find(list(t, l), lb.TCP, port); ok {
		t.Fatalf("the listener of the ended child is still listed")
	}
}
