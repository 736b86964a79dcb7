package bpf_test

import (
	"errors"
	"net"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/cellium/cellium/datapath/maps"
	"github.com/cellium/cellium/statedb/lb"
)

// svcSourceRange is lb.h's LB4_SVC_SOURCE_RANGE.
const svcSourceRange = 0x10

// outsideIP2 is a second client address of the outside namespace, in no
// source range of the test.
var outsideIP2 = netip.MustParseAddr("10.78.0.101")

// dialFrom connects from the outside namespace, from address src, to node
// 1's port and returns the source address the backend saw.
func (tp *npTopology) dialFrom(src netip.Addr, port uint16, timeout time.Duration) (string, error) {
	c, seen, err := tp.dialConn(src, port, timeout)
	if err == nil {
		c.Close()
	}
	return seen, err
}

// dialConn is dialFrom leaving the connection open (whoami's line read).
func (tp *npTopology) dialConn(src netip.Addr, port uint16, timeout time.Duration) (net.Conn, string, error) {
	c, err := tp.dialOutside("tcp4", netip.AddrPortFrom(src, 0), tp.nodePort(port), timeout)
	if err != nil {
		return nil, "", err
	}
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 64)
	n, err := c.Read(buf)
	if err != nil {
		c.Close()
		return nil, "", err
	}
	_ = c.SetDeadline(time.Time{})
	return c, string(buf[:n]), nil
}

// TestPrivilegedLBSourceRange: a frontend flagged LB4_SVC_SOURCE_RANGE
// with a prefix of client 10.78.0.100 in cellium_lb4_source_range lets
// that client connect through cil_from_netdev, drops the SYNs of client
// 10.78.0.101 (outside every prefix of the frontend) with 177 "Denied by
// LB src range check", counted in cellium_metrics and reported as a drop
// event; a connection the second client opened before the ranges came
// is cut (its packets dropped too); a prefix of another frontend does not
// count; clearing the flag
// and then deleting the prefixes (the agent's order) opens the frontend
// to both clients. Without the check in nodeport.c the second client
// connects and the test fails.
func TestPrivilegedLBSourceRange(t *testing.T) {
	tp := newNPTopology(t, false)
	// The second client address.
	err := tp.outside.Do(func(ns.NetNS) error {
		l, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		return netlink.AddrAdd(l, &netlink.Addr{IPNet: &net.IPNet{IP: outsideIP2.AsSlice(), Mask: net.CIDRMask(24, 32)}})
	})
	if err != nil {
		t.Fatal(err)
	}
	const port = 30090
	fe := lb.L4Addr{Addr: tp.n1.ip, Port: port, Proto: syscall.IPPROTO_TCP}
	other := lb.L4Addr{Addr: tp.n1.ip, Port: port + 1, Proto: syscall.IPPROTO_TCP}
	ranges := []maps.SourceRange{
		{Frontend: fe, Prefix: netip.MustParsePrefix("10.78.0.100/32")},
		{Frontend: fe, Prefix: netip.MustParsePrefix("192.0.2.0/24")},
		// Another frontend's prefix holding .101: not this one's.
		{Frontend: other, Prefix: netip.MustParsePrefix("10.78.0.0/24")},
	}
	if err := tp.lb.SourceRange.Update(ranges); err != nil {
		t.Fatal(err)
	}
	var got []maps.SourceRange
	if err := tp.lb.SourceRange.Iterate(func(r maps.SourceRange) bool { got = append(got, r); return true }); err != nil {
		t.Fatal(err)
	}
	if len(got) != len(ranges) {
		t.Fatalf("cellium_lb4_source_range holds %v, want %v", got, ranges)
	}
	// Client 2's connection before the frontend is restricted.
	tp.service(t, port, syscall.IPPROTO_TCP, svcNodePort, 1)
	early, _, err := tp.dialConn(outsideIP2, port, 3*time.Second)
	if err != nil {
		t.Fatalf("client %s before the ranges: %v", outsideIP2, err)
	}
	defer early.Close()
	if err := roundTrip(early, "before"); err != nil {
		t.Fatalf("echo before the ranges: %v", err)
	}
	tp.service(t, port, syscall.IPPROTO_TCP, svcNodePort|svcSourceRange, 1)
	before := dropCount(t, tp.n1.m, maps.DropNotInSrcRange)
	if err := roundTrip(early, "after"); err == nil {
		t.Error("the connection opened before the ranges still echoes")
	}
	if after := dropCount(t, tp.n1.m, maps.DropNotInSrcRange); after <= before {
		t.Errorf("drop counter 177 %d -> %d, want the established connection's packets counted", before, after)
	}

	if seen, err := tp.dialFrom(outsideIP, port, 3*time.Second); err != nil {
		t.Fatalf("client %s in the source range: %v", outsideIP, err)
	} else if seen != tp.n1.ip.String()+"\n" {
		t.Errorf("backend saw %q, want node 1's address (SNAT)", seen)
	}

	before = dropCount(t, tp.n1.m, maps.DropNotInSrcRange)
	_, err = tp.dialFrom(outsideIP2, port, time.Second)
	if err == nil {
		t.Fatalf("client %s outside the source ranges connected", outsideIP2)
	}
	if ne := net.Error(nil); !errors.As(err, &ne) || !ne.Timeout() {
		t.Errorf("client outside the ranges: %v, want a timeout (SYN dropped)", err)
	}
	if after := dropCount(t, tp.n1.m, maps.DropNotInSrcRange); after <= before {
		t.Errorf("drop counter 177 %d -> %d, want the SYNs counted", before, after)
	}
	ev := tp.n1.waitEvent(t, "source range drop", func(e maps.Event) bool {
		return e.Type == maps.EventDrop && e.Reason == maps.DropNotInSrcRange && e.DstPort == port
	})
	if ev.Src != outsideIP2 || ev.Dst != tp.n1.ip {
		t.Errorf("drop event %v: want %s -> %s", ev, outsideIP2, tp.n1.ip)
	}
	if name := maps.DropReasonName(maps.DropNotInSrcRange); name != "Denied by LB src range check" {
		t.Errorf("reason 177 is %q", name)
	}

	// The ranges go: flag first, then the prefixes.
	tp.service(t, port, syscall.IPPROTO_TCP, svcNodePort, 1)
	if err := tp.lb.SourceRange.Delete(ranges); err != nil {
		t.Fatal(err)
	}
	for _, src := range []netip.Addr{outsideIP, outsideIP2} {
		if _, err := tp.dialFrom(src, port, 3*time.Second); err != nil {
			t.Errorf("client %s after the ranges went: %v", src, err)
		}
	}
}
