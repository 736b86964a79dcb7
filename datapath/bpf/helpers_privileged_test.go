package bpf_test

import (
	"encoding/binary"
	"errors"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/ringbuf"
	"golang.org/x/sys/unix"

	"github.com/cellium/cellium/datapath/bpf"
	"github.com/cellium/cellium/datapath/maps"
	"github.com/cellium/cellium/statedb/identity"
)

// tempBPFFS mounts a bpffs on a fresh temporary directory, unmounted when
// tb ends (before the directory is removed): every pin goes with it.
func tempBPFFS(tb testing.TB) string {
	tb.Helper()
	dir := filepath.Join(tb.TempDir(), "bpffs")
	if err := maps.EnsureBPFFS(dir); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := unix.Unmount(dir, 0); err != nil {
			tb.Errorf("unmount %s: %v", dir, err)
		}
	})
	return dir
}

// openMaps opens the global maps in a fresh bpffs, closed when tb ends.
func openMaps(tb testing.TB) (*maps.Maps, string) {
	tb.Helper()
	dir := tempBPFFS(tb)
	m, err := maps.Open(dir)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { m.Close() })
	return m, dir
}

// endpointConfig are the load-time constants of one endpoint.
type endpointConfig struct {
	ID       uint16
	Identity identity.NumericIdentity
	IfIndex  uint32
	MAC      net.HardwareAddr
	IPv4     netip.Addr
	Audit    bool
	Trace    bool
	// Aggregation is MONITOR_AGGREGATION (none unless set).
	Aggregation bpf.Aggregation
	// NodePort is NODEPORT_ENABLED.
	NodePort bool
}

// loadEndpoint loads the programs for one endpoint with its constants and
// policy map, the way the loader does; the collection is closed when tb
// ends.
func loadEndpoint(tb testing.TB, m *maps.Maps, pm *maps.PolicyMap, c endpointConfig) *ebpf.Collection {
	tb.Helper()
	spec, err := bpf.LoadLxc()
	if err != nil {
		tb.Fatal(err)
	}
	consts := bpf.EndpointConstants{
		EndpointID: c.ID, Identity: uint32(c.Identity), IfIndex: c.IfIndex, MAC: c.MAC, IPv4: c.IPv4,
		AuditMode: c.Audit, Trace: c.Trace, Aggregation: c.Aggregation, NodePort: c.NodePort,
	}
	if err := consts.Apply(spec); err != nil {
		tb.Fatal(err)
	}
	coll, err := ebpf.NewCollectionWithOptions(spec, ebpf.CollectionOptions{MapReplacements: m.Replacements(pm)})
	if err != nil {
		var ve *ebpf.VerifierError
		if errors.As(err, &ve) {
			tb.Fatalf("load: %+v", ve)
		}
		tb.Fatalf("load: %v", err)
	}
	tb.Cleanup(coll.Close)
	return coll
}

// registerPod puts pod into the maps the programs read as endpoint ep with
// identity id: its /32 in the ipcache, its veth pair in the endpoints map.
func registerPod(tb testing.TB, m *maps.Maps, pod *testPod, id identity.NumericIdentity, ep uint16) {
	tb.Helper()
	if err := m.IPCache.Update(netip.PrefixFrom(pod.ip, 32), maps.IPCacheEntry{Identity: id}); err != nil {
		tb.Fatal(err)
	}
	if err := m.Endpoints.Update(pod.ip, maps.EndpointInfo{
		IfIndex: uint32(pod.res.HostIfIndex), ID: ep, MAC: pod.res.PodMAC, NodeMAC: pod.res.HostMAC, Identity: id,
	}); err != nil {
		tb.Fatal(err)
	}
}

// openPolicy opens endpoint id's policy map in dir, closed when tb ends.
func openPolicy(tb testing.TB, dir string, id uint16) *maps.PolicyMap {
	tb.Helper()
	pm, err := maps.OpenPolicyMap(dir, id)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { pm.Close() })
	return pm
}

// eventReader reads the event ring buffer.
type eventReader struct{ r *ringbuf.Reader }

func newEventReader(tb testing.TB, m *maps.Maps) *eventReader {
	tb.Helper()
	r, err := m.NewEventReader()
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { r.Close() })
	return &eventReader{r: r}
}

// drain returns the events already in the ring buffer.
func (er *eventReader) drain(tb testing.TB) []maps.Event {
	tb.Helper()
	er.r.SetDeadline(time.Now())
	defer er.r.SetDeadline(time.Time{})
	var out []maps.Event
	for {
		rec, err := er.r.Read()
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return out
		}
		if err != nil {
			tb.Fatal(err)
		}
		e, err := maps.DecodeEvent(rec.RawSample)
		if err != nil {
			tb.Fatal(err)
		}
		out = append(out, e)
	}
}

// waitFor reads events until one satisfies match, for at most 10 s, and
// returns it; every event read on the way is appended to *seen.
func (er *eventReader) waitFor(tb testing.TB, what string, seen *[]maps.Event, match func(maps.Event) bool) maps.Event {
	tb.Helper()
	er.r.SetDeadline(time.Now().Add(10 * time.Second))
	defer er.r.SetDeadline(time.Time{})
	for {
		rec, err := er.r.Read()
		if errors.Is(err, os.ErrDeadlineExceeded) {
			tb.Fatalf("no %s event within 10s; saw %v", what, *seen)
		}
		if err != nil {
			tb.Fatal(err)
		}
		e, err := maps.DecodeEvent(rec.RawSample)
		if err != nil {
			tb.Fatal(err)
		}
		*seen = append(*seen, e)
		if match(e) {
			return e
		}
	}
}

// Packets for BPF_PROG_TEST_RUN: Ethernet + IPv4 + L4, checksums left 0
// (the programs do not check them).
func packet(src, dst netip.Addr, proto uint8, sport, dport uint16, tcpFlags uint8) []byte {
	var l4 []byte
	switch proto {
	case 6:
		l4 = make([]byte, 20)
		binary.BigEndian.PutUint16(l4[0:], sport)
		binary.BigEndian.PutUint16(l4[2:], dport)
		l4[12] = 5 << 4
		l4[13] = tcpFlags
	case 17:
		l4 = make([]byte, 8+4)
		binary.BigEndian.PutUint16(l4[0:], sport)
		binary.BigEndian.PutUint16(l4[2:], dport)
		binary.BigEndian.PutUint16(l4[4:], uint16(len(l4)))
	case 1: // echo request, id = sport
		l4 = make([]byte, 8)
		l4[0] = 8
		binary.BigEndian.PutUint16(l4[4:], sport)
	default:
		l4 = make([]byte, 16)
	}
	b := make([]byte, 14+20, 14+20+len(l4))
	copy(b[0:6], []byte{2, 0, 0, 0, 0, 2})
	copy(b[6:12], []byte{2, 0, 0, 0, 0, 1})
	binary.BigEndian.PutUint16(b[12:], 0x0800)
	ip := b[14:]
	ip[0] = 0x45
	binary.BigEndian.PutUint16(ip[2:], uint16(20+len(l4)))
	ip[8] = 64
	ip[9] = proto
	s, d := src.As4(), dst.As4()
	copy(ip[12:16], s[:])
	copy(ip[16:20], d[:])
	return append(b, l4...)
}

// run runs prog on pkt and returns its verdict (TC_ACT_OK 0 or
// TC_ACT_SHOT 2).
func run(tb testing.TB, prog *ebpf.Program, pkt []byte) uint32 {
	tb.Helper()
	ret, err := prog.Run(&ebpf.RunOptions{Data: pkt})
	if err != nil {
		tb.Fatal(err)
	}
	return ret
}

const (
	tcActOK   = 0
	tcActShot = 2
)

// clearCT deletes every conntrack entry.
func clearCT(tb testing.TB, m *maps.Maps) {
	tb.Helper()
	if _, err := m.CT4.DeleteMatching(func(maps.CTKey, maps.CTEntry) bool { return true }); err != nil {
		tb.Fatal(err)
	}
	n := 0
	if err := m.CT4.Iterate(func(maps.CTKey, maps.CTEntry) bool { n++; return true }); err != nil || n != 0 {
		tb.Fatalf("conntrack holds %d entries after clearing (%v)", n, err)
	}
}

// arpPacket is an ARP request for IPv4 over Ethernet from mac and ip
// (nil mac: the Ethernet source of packet, 02:00:00:00:00:01).
func arpPacket(mac net.HardwareAddr, ip netip.Addr) []byte {
	if mac == nil {
		mac = net.HardwareAddr{2, 0, 0, 0, 0, 1}
	}
	b := make([]byte, 14+28)
	copy(b[0:6], []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
	copy(b[6:12], mac)
	binary.BigEndian.PutUint16(b[12:], 0x0806)
	arp := b[14:]
	binary.BigEndian.PutUint16(arp[0:], 1)      // Ethernet
	binary.BigEndian.PutUint16(arp[2:], 0x0800) // IPv4
	arp[4], arp[5] = 6, 4
	binary.BigEndian.PutUint16(arp[6:], 1) // request
	copy(arp[8:14], mac)
	a := ip.As4()
	copy(arp[14:18], a[:])
	return b
}
