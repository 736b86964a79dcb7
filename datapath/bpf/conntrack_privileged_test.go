package bpf_test

import (
	"encoding/binary"
	"errors"
	"net/netip"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/cellium/cellium/datapath/bpf"
	"github.com/cellium/cellium/datapath/maps"
	"github.com/cellium/cellium/statedb/policy"
	"github.com/cellium/cellium/test/privileged"
)

const (
	tcpFIN = 0x01
	tcpSYN = 0x02
	tcpACK = 0x10
)

func monotonicNow(tb testing.TB) time.Duration {
	tb.Helper()
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		tb.Fatal(err)
	}
	return time.Duration(ts.Nano())
}

// TestPrivilegedProgramConntrack drives the conntrack table with crafted
// packets (BPF_PROG_TEST_RUN): replies pass an enforcing direction,
// lifetimes follow the TCP state, a SYN reopens a closing tuple, ICMP
// echoes pair by id, established packets are checked against the current
// policy, and packets the programs do not handle pass or drop with
// Cilium's reasons.
func TestPrivilegedProgramConntrack(t *testing.T) {
	privileged.Require(t)
	m, dir := openMaps(t)
	events := newEventReader(t, m)
	self, remote := netip.MustParseAddr("10.7.0.10"), netip.MustParseAddr("10.7.0.11")
	if err := m.IPCache.Update(netip.PrefixFrom(remote, 32), maps.IPCacheEntry{Identity: 1001}); err != nil {
		t.Fatal(err)
	}
	pm := openPolicy(t, dir, 7)
	allowWeb := policy.Entry{Key: policy.NewKey(1001, policy.Egress, policy.ProtoTCP, 80, 16)}
	if err := pm.BatchUpdate([]policy.Entry{
		allowWeb,
		{Key: policy.NewKey(1001, policy.Egress, policy.ProtoUDP, 53, 16)},
		{Key: policy.NewKey(1001, policy.Egress, policy.ProtoICMP, 0, 0)},
		// No ingress entry: ingress enforces and allows nothing.
	}); err != nil {
		t.Fatal(err)
	}
	coll := loadEndpoint(t, m, pm, endpointConfig{ID: 7, Identity: 1000, IfIndex: 3, IPv4: self})
	from, to := coll.Programs[bpf.LxcProgCilFromContainer], coll.Programs[bpf.LxcProgCilToContainer]

	expect := func(t *testing.T, what string, prog *ebpf.Program, pkt []byte, want uint32) []maps.Event {
		t.Helper()
		if got := run(t, prog, pkt); got != want {
			t.Fatalf("%s: verdict %d, want %d", what, got, want)
		}
		return events.drain(t)
	}
	entry := func(t *testing.T, k maps.CTKey) maps.CTEntry {
		t.Helper()
		e, err := m.CT4.Lookup(k)
		if err != nil {
			t.Fatalf("conntrack %+v: %v", k, err)
		}
		return e
	}
	lifetime := func(e maps.CTEntry) time.Duration {
		return time.Duration(e.Expires) - monotonicNow(t)
	}
	within := func(t *testing.T, what string, got, want time.Duration) {
		t.Helper()
		if got > want || got < want-5*time.Second {
			t.Errorf("%s: lifetime %v, want about %v", what, got, want)
		}
	}

	web := maps.CTKey{Src: self, Dst: remote, SrcPort: 40000, DstPort: 80, Proto: 6, Dir: maps.CTEgress, Endpoint: 7}
	t.Run("tcp", func(t *testing.T) {
		evs := expect(t, "SYN out", from, packet(self, remote, 6, 40000, 80, tcpSYN), tcActOK)
		if len(evs) != 1 || evs[0].Type != maps.EventPolicyVerdict || evs[0].Verdict != maps.VerdictAllowed {
			t.Errorf("events of a new allowed connection: %v, want one allowed verdict", evs)
		}
		e := entry(t, web)
		if e.Flags != maps.CTFlagSYN || e.TxPackets != 1 || e.RemoteID != 1001 {
			t.Errorf("entry after SYN: %+v", e)
		}
		within(t, "after SYN", lifetime(e), 60*time.Second)

		evs = expect(t, "SYN-ACK in (reply through enforcing ingress)", to, packet(remote, self, 6, 80, 40000, tcpSYN|tcpACK), tcActOK)
		if len(evs) != 0 {
			t.Errorf("a reply made events: %v", evs)
		}
		e = entry(t, web)
		if e.Flags&maps.CTFlagReplySeen == 0 || e.RxPackets != 1 {
			t.Errorf("entry after reply: %+v", e)
		}
		within(t, "established", lifetime(e), 6*time.Hour)

		evs = expect(t, "data in on another tuple", to, packet(remote, self, 6, 80, 40001, tcpACK), tcActShot)
		if len(evs) != 2 || evs[1].Type != maps.EventDrop || evs[1].Reason != maps.DropPolicy {
			t.Errorf("events: %v, want a verdict and a Policy denied drop", evs)
		}

		// A FIN one way half-closes: the other way may still send.
		expect(t, "FIN out", from, packet(self, remote, 6, 40000, 80, tcpFIN|tcpACK), tcActOK)
		e = entry(t, web)
		if e.Flags&maps.CTFlagClosing != 0 || e.Flags&maps.CTFlagTxFIN == 0 {
			t.Errorf("entry after one FIN: %+v, want half-closed", e)
		}
		within(t, "half-closed", lifetime(e), 6*time.Hour)
		expect(t, "FIN in", to, packet(remote, self, 6, 80, 40000, tcpFIN|tcpACK), tcActOK)
		e = entry(t, web)
		if e.Flags&maps.CTFlagClosing == 0 {
			t.Errorf("entry after a FIN each way: %+v", e)
		}
		within(t, "closing", lifetime(e), 10*time.Second)

		evs = expect(t, "new SYN on the closing tuple", from, packet(self, remote, 6, 40000, 80, tcpSYN), tcActOK)
		if len(evs) != 1 || evs[0].Type != maps.EventPolicyVerdict {
			t.Errorf("a SYN on a closing tuple is a new connection; events %v", evs)
		}
		if e = entry(t, web); e.Flags != maps.CTFlagSYN || e.TxPackets != 1 {
			t.Errorf("entry after a new SYN: %+v", e)
		}

		// Established packets meet the current policy.
		expect(t, "reply", to, packet(remote, self, 6, 80, 40000, tcpSYN|tcpACK), tcActOK)
		if err := pm.Delete(allowWeb.Key); err != nil {
			t.Fatal(err)
		}
		evs = expect(t, "data out after the allow went", from, packet(self, remote, 6, 40000, 80, tcpACK), tcActShot)
		if len(evs) != 1 || evs[0].Type != maps.EventDrop || evs[0].Reason != maps.DropPolicy {
			t.Errorf("events: %v, want just a Policy denied drop (no verdict: not a new connection)", evs)
		}
		// The entry stays, so the connection keeps its direction: the
		// peer's packets are its replies (they open no entry the other
		// way), and its own direction keeps dropping.
		if _, err := m.CT4.Lookup(web); err != nil {
			t.Errorf("the denied connection's entry: %v, want it kept", err)
		}
		expect(t, "late reply", to, packet(remote, self, 6, 80, 40000, tcpACK), tcActOK)
		back := maps.CTKey{Src: remote, Dst: self, SrcPort: 80, DstPort: 40000, Proto: 6, Dir: maps.CTIngress, Endpoint: 7}
		if _, err := m.CT4.Lookup(back); !errors.Is(err, ebpf.ErrKeyNotExist) {
			t.Errorf("the late reply opened an entry the other way: %v", err)
		}
		evs = expect(t, "data out after the reply", from, packet(self, remote, 6, 40000, 80, tcpACK), tcActShot)
		if len(evs) != 1 || evs[0].Reason != maps.DropPolicy {
			t.Errorf("events: %v, want a Policy denied drop", evs)
		}
	})

	t.Run("udp", func(t *testing.T) {
		expect(t, "query", from, packet(self, remote, 17, 5000, 53, 0), tcActOK)
		within(t, "udp", lifetime(entry(t, maps.CTKey{Src: self, Dst: remote, SrcPort: 5000, DstPort: 53, Proto: 17, Dir: maps.CTEgress, Endpoint: 7})), 60*time.Second)
		expect(t, "answer", to, packet(remote, self, 17, 53, 5000, 0), tcActOK)
		expect(t, "answer to another port", to, packet(remote, self, 17, 53, 5001, 0), tcActShot)
	})

	t.Run("icmp echo", func(t *testing.T) {
		expect(t, "echo request", from, packet(self, remote, 1, 77, 0, 0), tcActOK)
		entry(t, maps.CTKey{Src: self, Dst: remote, SrcPort: 77, Proto: 1, Dir: maps.CTEgress, Endpoint: 7})
		reply := packet(remote, self, 1, 77, 0, 0)
		reply[14+20] = 0 // echo reply, same id
		expect(t, "echo reply", to, reply, tcActOK)
		other := packet(remote, self, 1, 78, 0, 0)
		other[14+20] = 0
		expect(t, "echo reply with another id", to, other, tcActShot)
	})

	t.Run("flush by address", func(t *testing.T) {
		other := netip.MustParseAddr("10.7.0.99")
		expect(t, "to another peer", from, packet(self, other, 17, 6000, 53, 0), tcActShot) // no allow for world
		n, err := m.CT4.DeleteMatching(func(k maps.CTKey, _ maps.CTEntry) bool { return k.Dst == remote && k.Proto == 17 })
		if err != nil || n != 1 {
			t.Errorf("DeleteMatching removed %d entries (%v), want the one UDP entry", n, err)
		}
		if _, err := m.CT4.Lookup(maps.CTKey{Src: self, Dst: remote, SrcPort: 5000, DstPort: 53, Proto: 17, Dir: maps.CTEgress, Endpoint: 7}); !errors.Is(err, ebpf.ErrKeyNotExist) {
			t.Errorf("UDP entry still there: %v", err)
		}
		entry(t, maps.CTKey{Src: self, Dst: remote, SrcPort: 77, Proto: 1, Dir: maps.CTEgress, Endpoint: 7}) // the ICMP one stays
	})

	t.Run("other packets", func(t *testing.T) {
		fwd := func() uint64 {
			v, err := m.Metrics.Get(maps.MetricsKey{Reason: maps.ReasonForwarded, Dir: maps.DirEgress})
			if err != nil {
				t.Fatal(err)
			}
			return v.Packets
		}
		before := fwd()
		v6 := make([]byte, 14+40)
		binary.BigEndian.PutUint16(v6[12:], 0x86dd)
		v6[14] = 0x60
		for _, prog := range []*ebpf.Program{from, to} {
			evs := expect(t, "IPv6", prog, v6, tcActShot)
			if len(evs) != 1 || evs[0].Reason != maps.DropUnknownL3 {
				t.Errorf("IPv6: events %v, want one drop 139 (the endpoints are IPv4 only)", evs)
			}
		}
		expect(t, "ARP", from, arpPacket(nil, self), tcActOK)
		if got := fwd(); got != before+1 {
			t.Errorf("forwarded egress counter %d -> %d, want +1", before, got)
		}

		for _, c := range []struct {
			what   string
			pkt    []byte
			reason uint8
		}{
			{"LLDP", func() []byte {
				b := make([]byte, 60)
				binary.BigEndian.PutUint16(b[12:], 0x88cc)
				return b
			}(), maps.DropUnknownL3},
			{"IPv4 header longer than the packet", func() []byte {
				b := packet(self, remote, 6, 1, 80, tcpSYN)
				b[14] = 0x4f // 60 bytes of header claimed, 40 bytes sent
				return b
			}(), maps.DropInvalid},
			{"IPv4 version 6", func() []byte {
				b := packet(self, remote, 6, 1, 80, tcpSYN)
				b[14] = 0x65
				return b
			}(), maps.DropInvalid},
			{"IPv4 datagram longer than the packet", packet(self, remote, 6, 1, 80, tcpSYN)[:14+20+8], maps.DropInvalid},
			{"truncated TCP header", func() []byte {
				b := packet(self, remote, 6, 1, 80, tcpSYN)[:14+20+8]
				binary.BigEndian.PutUint16(b[14+2:], 20+8)
				return b
			}(), maps.DropCTInvalidHeader},
		} {
			evs := expect(t, c.what, from, c.pkt, tcActShot)
			if len(evs) != 1 || evs[0].Type != maps.EventDrop || evs[0].Reason != c.reason {
				t.Errorf("%s: events %v, want one drop with reason %d (%s)", c.what, evs, c.reason, maps.DropReasonName(c.reason))
			}
		}
	})
}

// TestPrivilegedProgramReplyIdentity: a reply passes on its conntrack
// entry without an ipcache lookup; with tracing on, its trace event names
// the remote identity the entry recorded, in both directions, also once
// the remote's prefix has left the ipcache.
func TestPrivilegedProgramReplyIdentity(t *testing.T) {
	privileged.Require(t)
	m, dir := openMaps(t)
	events := newEventReader(t, m)
	self, remote := netip.MustParseAddr("10.7.1.10"), netip.MustParseAddr("10.7.1.11")
	prefix := netip.PrefixFrom(remote, 32)
	if err := m.IPCache.Update(prefix, maps.IPCacheEntry{Identity: 1001}); err != nil {
		t.Fatal(err)
	}
	pm := openPolicy(t, dir, 8)
	if err := pm.BatchUpdate([]policy.Entry{
		{Key: policy.NewKey(1001, policy.Egress, policy.ProtoTCP, 80, 16)},
		{Key: policy.NewKey(1001, policy.Ingress, policy.ProtoTCP, 22, 16)},
	}); err != nil {
		t.Fatal(err)
	}
	coll := loadEndpoint(t, m, pm, endpointConfig{ID: 8, Identity: 1000, IfIndex: 3, IPv4: self, Trace: true})
	from, to := coll.Programs[bpf.LxcProgCilFromContainer], coll.Programs[bpf.LxcProgCilToContainer]
	for _, c := range []struct {
		name              string
		open, reply       *ebpf.Program
		openPkt, replyPkt []byte
		src, dst          uint32
		obs               uint8
	}{
		{"egress connection, reply in", from, to, packet(self, remote, 6, 40000, 80, tcpSYN), packet(remote, self, 6, 80, 40000, tcpSYN|tcpACK), 1001, 1000, maps.TraceToLxc},
		{"ingress connection, reply out", to, from, packet(remote, self, 6, 40001, 22, tcpSYN), packet(self, remote, 6, 22, 40001, tcpSYN|tcpACK), 1000, 1001, maps.TraceFromLxc},
	} {
		t.Run(c.name, func(t *testing.T) {
			if err := m.IPCache.Update(prefix, maps.IPCacheEntry{Identity: 1001}); err != nil {
				t.Fatal(err)
			}
			if got := run(t, c.open, c.openPkt); got != tcActOK {
				t.Fatalf("opening packet: verdict %d", got)
			}
			events.drain(t)
			// The ipcache no longer knows the remote: a lookup would say
			// world (2).
			if err := m.IPCache.Delete(prefix); err != nil {
				t.Fatal(err)
			}
			if got := run(t, c.reply, c.replyPkt); got != tcActOK {
				t.Fatalf("reply: verdict %d", got)
			}
			var trace *maps.Event
			for _, e := range events.drain(t) {
				if e.Type == maps.EventTrace && e.Reason == c.obs {
					trace = &e
				}
			}
			if trace == nil {
				t.Fatal("no trace event of the reply")
			}
			if uint32(trace.SrcIdentity) != c.src || uint32(trace.DstIdentity) != c.dst {
				t.Errorf("reply traced %d -> %d, want %d -> %d (the entry's remote identity)", trace.SrcIdentity, trace.DstIdentity, c.src, c.dst)
			}
		})
	}
}
