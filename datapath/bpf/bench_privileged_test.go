package bpf_test

import (
	"net/netip"
	"testing"

	"github.com/cellium/cellium/datapath/bpf"
	"github.com/cellium/cellium/datapath/maps"
	"github.com/cellium/cellium/statedb/identity"
	"github.com/cellium/cellium/statedb/policy"
	"github.com/cellium/cellium/test/privileged"
)

// BenchmarkPrivilegedProgram measures one program run (BPF_PROG_TEST_RUN,
// in the kernel), with 4,000 prefixes in the ipcache, per packet kind: a reply (conntrack only), a packet of an
// established connection in its own direction (conntrack + policy
// re-check), and a packet dropped by policy (with its drop event).
func BenchmarkPrivilegedProgram(b *testing.B) {
	privileged.Require(b)
	m, dir := openMaps(b)
	events := newEventReader(b, m)
	self, remote := netip.MustParseAddr("10.7.0.10"), netip.MustParseAddr("10.7.0.11")
	if err := m.IPCache.Update(netip.PrefixFrom(remote, 32), maps.IPCacheEntry{Identity: 1001}); err != nil {
		b.Fatal(err)
	}
	// A realistic ipcache around it: 4,000 prefixes, a quarter /24s (the
	// LPM trie's depth is what a lookup costs).
	var prefixes []netip.Prefix
	var entries []maps.IPCacheEntry
	for i := range 4000 {
		p := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 98 + byte(i>>16), byte(i >> 8), byte(i)}), 32)
		if i%4 == 3 {
			p = netip.PrefixFrom(netip.AddrFrom4([4]byte{172, 16 + byte(i>>10), byte(i >> 2), 0}), 24)
		}
		prefixes = append(prefixes, p)
		entries = append(entries, maps.IPCacheEntry{Identity: identity.NumericIdentity(20000 + i%500)})
	}
	if err := m.IPCache.BatchUpdate(prefixes, entries); err != nil {
		b.Fatal(err)
	}
	pm := openPolicy(b, dir, 9)
	if err := pm.BatchUpdate([]policy.Entry{
		{Key: policy.NewKey(1001, policy.Egress, policy.ProtoTCP, 80, 16)},
		{Key: policy.NewKey(0, policy.Egress, policy.ProtoUDP, 53, 16)},
	}); err != nil {
		b.Fatal(err)
	}
	coll := loadEndpoint(b, m, pm, endpointConfig{ID: 9, Identity: 1000, IfIndex: 3, IPv4: self})
	from, to := coll.Programs[bpf.LxcProgCilFromContainer], coll.Programs[bpf.LxcProgCilToContainer]
	syn := packet(self, remote, 6, 40000, 80, tcpSYN)
	if run(b, from, syn) != tcActOK {
		b.Fatal("SYN dropped")
	}
	events.drain(b)
	for _, c := range []struct {
		name string
		prog string
		pkt  []byte
		want uint32
	}{
		{"reply", bpf.LxcProgCilToContainer, packet(remote, self, 6, 80, 40000, tcpACK), tcActOK},
		{"established", bpf.LxcProgCilFromContainer, packet(self, remote, 6, 40000, 80, tcpACK), tcActOK},
		{"policy-drop", bpf.LxcProgCilFromContainer, packet(self, remote, 6, 40001, 8080, tcpSYN), tcActShot},
	} {
		b.Run(c.name, func(b *testing.B) {
			prog := from
			if c.prog == bpf.LxcProgCilToContainer {
				prog = to
			}
			ret, per, err := prog.Benchmark(c.pkt, b.N, b.ResetTimer)
			if err != nil {
				b.Fatal(err)
			}
			if ret != c.want {
				b.Fatalf("verdict %d, want %d", ret, c.want)
			}
			b.ReportMetric(float64(per.Nanoseconds()), "ns/packet")
			events.drain(b) // keep the ring buffer from filling
		})
	}
}
