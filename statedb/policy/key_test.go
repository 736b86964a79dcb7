package policy

import (
	"testing"
)

func TestPortRangePrefixes(t *testing.T) {
	tests := []struct {
		lo, hi uint16
		want   []PortPrefix
	}{
		{80, 80, []PortPrefix{{80, 16}}},
		{0, 65535, []PortPrefix{{0, 0}}},
		{80, 81, []PortPrefix{{80, 15}}},
		{81, 82, []PortPrefix{{81, 16}, {82, 16}}},
		{1024, 2047, []PortPrefix{{1024, 6}}},
		// The endPort example of the Kubernetes documentation.
		{32000, 32768, []PortPrefix{{32000, 8}, {32256, 7}, {32768, 16}}},
		{65535, 65535, []PortPrefix{{65535, 16}}},
		{0, 0, []PortPrefix{{0, 16}}},
		{10, 9, nil},
	}
	for _, tt := range tests {
		got := PortRangePrefixes(tt.lo, tt.hi)
		if !equalPrefixes(got, tt.want) {
			t.Errorf("PortRangePrefixes(%d, %d) = %v, want %v", tt.lo, tt.hi, got, tt.want)
		}
		checkPrefixes(t, tt.lo, tt.hi, got)
	}
	if got := PortRangePrefixes(1, 65535); len(got) != 16 {
		t.Errorf("PortRangePrefixes(1, 65535) has %d prefixes, want 16", len(got))
	}
}

func equalPrefixes(a, b []PortPrefix) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// checkPrefixes verifies that ps cover exactly lo..hi, in order, without
// overlap, each aligned, with at most 2*16 prefixes.
func checkPrefixes(t *testing.T, lo, hi uint16, ps []PortPrefix) {
	t.Helper()
	if lo > hi {
		if len(ps) != 0 {
			t.Fatalf("PortRangePrefixes(%d, %d) = %v, want none", lo, hi, ps)
		}
		return
	}
	if len(ps) > 30 {
		t.Fatalf("PortRangePrefixes(%d, %d): %d prefixes, more than 30", lo, hi, len(ps))
	}
	next := uint32(lo)
	for _, p := range ps {
		k := NewKey(1, Ingress, ProtoTCP, p.Port, p.PrefixLen)
		if k.Port != p.Port {
			t.Fatalf("PortRangePrefixes(%d, %d): %v is not aligned", lo, hi, p)
		}
		a, b := k.PortRange()
		if uint32(a) != next {
			t.Fatalf("PortRangePrefixes(%d, %d): %v starts at %d, want %d", lo, hi, p, a, next)
		}
		next = uint32(b) + 1
	}
	if next != uint32(hi)+1 {
		t.Fatalf("PortRangePrefixes(%d, %d) = %v ends at %d", lo, hi, ps, next-1)
	}
	// Minimal: no two neighbours could merge into one aligned block.
	for i := 1; i < len(ps); i++ {
		a, b := ps[i-1], ps[i]
		if a.PrefixLen == b.PrefixLen && a.PrefixLen > 0 {
			merged := NewKey(1, Ingress, ProtoTCP, a.Port, a.PrefixLen-1)
			if merged.Port == a.Port {
				t.Fatalf("PortRangePrefixes(%d, %d): %v and %v could be one prefix", lo, hi, a, b)
			}
		}
	}
}

func FuzzPortRangePrefixes(f *testing.F) {
	for _, s := range [][2]uint16{{0, 0}, {0, 65535}, {1, 65535}, {80, 80}, {32000, 32768}, {5, 4}, {65534, 65535}} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, lo, hi uint16) {
		checkPrefixes(t, lo, hi, PortRangePrefixes(lo, hi))
	})
}

func TestKey(t *testing.T) {
	k := NewKey(1234, Egress, ProtoTCP, 81, 15)
	if k.Port != 80 || k.PortPrefixLen != 15 {
		t.Errorf("NewKey did not mask the port: %+v", k)
	}
	if lo, hi := k.PortRange(); lo != 80 || hi != 81 {
		t.Errorf("PortRange = %d-%d", lo, hi)
	}
	if k.LPMPrefixLen() != 23 || k.PrefixLen() != 63 {
		t.Errorf("prefix lengths %d %d", k.LPMPrefixLen(), k.PrefixLen())
	}
	if got := k.String(); got != "egress 1234 tcp/80-81" {
		t.Errorf("String = %q", got)
	}
	any := NewKey(2, Ingress, ProtoAny, 80, 16)
	if any.Port != 0 || any.PortPrefixLen != 0 || any.PrefixLen() != 40 || any.String() != "ingress 2 any" {
		t.Errorf("protocol-any key kept a port: %+v %s", any, any)
	}
	if NewKey(1, Ingress, ProtoUDP, 0, 0).String() != "ingress 1 udp" {
		t.Errorf("String of a protocol-only key = %q", NewKey(1, Ingress, ProtoUDP, 0, 0).String())
	}
	covers := []struct {
		a, b Key
		want bool
	}{
		{NewKey(1, Ingress, 0, 0, 0), NewKey(1, Ingress, ProtoTCP, 80, 16), true},
		{NewKey(1, Ingress, ProtoTCP, 0, 0), NewKey(1, Ingress, ProtoTCP, 80, 16), true},
		{NewKey(1, Ingress, ProtoTCP, 80, 15), NewKey(1, Ingress, ProtoTCP, 81, 16), true},
		{NewKey(1, Ingress, ProtoTCP, 80, 16), NewKey(1, Ingress, ProtoTCP, 80, 15), false},
		{NewKey(1, Ingress, ProtoUDP, 0, 0), NewKey(1, Ingress, ProtoTCP, 80, 16), false},
		{NewKey(1, Ingress, 0, 0, 0), NewKey(2, Ingress, ProtoTCP, 80, 16), false},
		{NewKey(1, Ingress, 0, 0, 0), NewKey(1, Egress, 0, 0, 0), false},
		{NewKey(1, Ingress, ProtoTCP, 80, 16), NewKey(1, Ingress, 0, 0, 0), false},
	}
	for _, c := range covers {
		if got := c.a.Covers(c.b); got != c.want {
			t.Errorf("%s covers %s = %v, want %v", c.a, c.b, got, c.want)
		}
	}
}

func TestVerdict(t *testing.T) {
	e := func(id uint32, proto uint8, port uint16, plen uint8, deny bool) Entry {
		return Entry{Key: NewKey(identityOf(id), Ingress, proto, port, plen), Deny: deny}
	}
	dp := DirectionPolicy{Enforcing: true, Entries: []Entry{
		e(0, ProtoUDP, 53, 16, false),    // anyone to udp/53
		e(0, ProtoTCP, 22, 16, true),     // nobody to tcp/22
		e(100, 0, 0, 0, false),           // 100 anywhere
		e(100, ProtoTCP, 8080, 16, true), // but not tcp/8080
		e(200, ProtoTCP, 80, 15, false),  // 200 to tcp/80-81
		e(300, ProtoTCP, 0, 0, true),     // 300 no tcp at all
	}}
	sortEntries(dp.Entries)
	tests := []struct {
		id    uint32
		proto uint8
		port  uint16
		want  bool
	}{
		{5, ProtoUDP, 53, true},
		{5, ProtoUDP, 54, false},
		{5, ProtoTCP, 53, false},
		{100, ProtoTCP, 22, false}, // L4-only deny beats the L3 allow
		{100, ProtoTCP, 443, true},
		{100, ProtoTCP, 8080, false},
		{100, ProtoUDP, 8080, true},
		{200, ProtoTCP, 80, true},
		{200, ProtoTCP, 81, true},
		{200, ProtoTCP, 82, false},
		{300, ProtoUDP, 53, true}, // the deny is TCP only
		{300, ProtoTCP, 80, false},
	}
	for _, tt := range tests {
		if got, _ := dp.Verdict(identityOf(tt.id), tt.proto, tt.port); got != tt.want {
			t.Errorf("Verdict(%d, %s, %d) = %v, want %v", tt.id, ProtoName(tt.proto), tt.port, got, tt.want)
		}
	}
	if _, ok := dp.Get(NewKey(100, Ingress, 0, 0, 0)); !ok {
		t.Error("Get did not find an entry")
	}
}
