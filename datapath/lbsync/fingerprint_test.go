package lbsync

import (
	"net/netip"
	"testing"

	"github.com/cellium/cellium/statedb/lb"
)

// Every field the maps hold changes the fingerprint, the same frontend
// hashes the same, and hashing allocates nothing (the full pass hashes
// every frontend's backends).
func TestWrittenFingerprint(t *testing.T) {
	be := func(s string, port uint16) lb.L4Addr {
		return lb.L4Addr{Addr: netip.MustParseAddr(s), Port: port, Proto: lb.TCP}
	}
	base := func() *lb.Frontend {
		return &lb.Frontend{
			Address:      be("10.96.0.10", 80),
			Type:         lb.TypeNodePort,
			Backends:     []lb.L4Addr{be("10.0.1.5", 8080), be("10.0.2.6", 8080)},
			BackendIDs:   []uint32{7, 8},
			SourceRanges: []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")},
		}
	}
	want := writtenFingerprint(base())
	if got := writtenFingerprint(base()); got != want {
		t.Fatalf("the same frontend hashed %x then %x", want, got)
	}
	changes := map[string]func(f *lb.Frontend){
		"session affinity":   func(f *lb.Frontend) { f.SessionAffinity = true },
		"affinity timeout":   func(f *lb.Frontend) { f.AffinityTimeout = 10800 },
		"type (node port)":   func(f *lb.Frontend) { f.Type = lb.TypeClusterIP },
		"local":              func(f *lb.Frontend) { f.Local = true },
		"two scopes":         func(f *lb.Frontend) { f.TwoScopes = true },
		"backend address":    func(f *lb.Frontend) { f.Backends[1] = be("10.0.2.7", 8080) },
		"backend port":       func(f *lb.Frontend) { f.Backends[1].Port = 8081 },
		"backend protocol":   func(f *lb.Frontend) { f.Backends[1].Proto = lb.UDP },
		"backend mapped v6":  func(f *lb.Frontend) { f.Backends[1].Addr = netip.AddrFrom16(f.Backends[1].Addr.As16()) },
		"backend order":      func(f *lb.Frontend) { f.Backends[0], f.Backends[1] = f.Backends[1], f.Backends[0] },
		"backend moved":      func(f *lb.Frontend) { f.IntBackends, f.Backends = f.Backends[1:], f.Backends[:1] },
		"backend ID":         func(f *lb.Frontend) { f.BackendIDs[0] = 9 },
		"backend IDs moved":  func(f *lb.Frontend) { f.IntBackendIDs, f.BackendIDs = f.BackendIDs[1:], f.BackendIDs[:1] },
		"source range bits":  func(f *lb.Frontend) { f.SourceRanges[0] = netip.MustParsePrefix("192.0.2.0/25") },
		"source range addr":  func(f *lb.Frontend) { f.SourceRanges[0] = netip.MustParsePrefix("198.51.100.0/24") },
		"source range added": func(f *lb.Frontend) { f.SourceRanges = append(f.SourceRanges, netip.MustParsePrefix("10.0.0.0/8")) },
	}
	seen := map[uint64]string{want: "base"}
	for name, change := range changes {
		f := base()
		change(f)
		got := writtenFingerprint(f)
		if got == want {
			t.Errorf("%s: fingerprint unchanged", name)
		}
		if other, ok := seen[got]; ok {
			t.Errorf("%s hashes like %s", name, other)
		}
		seen[got] = name
	}
	f := base()
	if n := testing.AllocsPerRun(100, func() { writtenFingerprint(f) }); n != 0 {
		t.Errorf("writtenFingerprint allocates %v times per call, want 0", n)
	}
}
