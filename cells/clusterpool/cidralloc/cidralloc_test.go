package cidralloc

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"testing"
)

func mustNew(t testing.TB, maskSize int, cidrs ...string) *Allocator {
	t.Helper()
	a, err := New(Config{IPv4CIDRs: cidrs, IPv4MaskSize: maskSize})
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func pfx(s string) netip.Prefix { return netip.MustParsePrefix(s) }

func TestDefaultConfig(t *testing.T) {
	a, err := New(DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	if a.Capacity() != 65536 || a.MaskSize() != 24 || fmt.Sprint(a.ClusterCIDRs()) != "[10.0.0.0/8]" {
		t.Errorf("default: capacity %d, mask %d, CIDRs %v", a.Capacity(), a.MaskSize(), a.ClusterCIDRs())
	}
	c, err := a.Allocate("node-1")
	if err != nil || c != pfx("10.0.0.0/24") {
		t.Errorf("first allocation = %v, %v; want 10.0.0.0/24", c, err)
	}
}

func TestValidate(t *testing.T) {
	tests := []struct {
		name     string
		cidrs    []string
		mask     int
		wantFlag string
		want     string
	}{
		{"no cidr", nil, 24, FlagIPv4CIDR, "no CIDR given"},
		{"bad cidr", []string{"10.0.0.0/33"}, 24, FlagIPv4CIDR, "10.0.0.0/33"},
		{"not a cidr", []string{"10.0.0.0"}, 24, FlagIPv4CIDR, "10.0.0.0"},
		{"ipv6", []string{"fd00::/104"}, 120, FlagIPv4CIDR, "not an IPv4 CIDR"},
		{"host bits", []string{"10.0.0.1/8"}, 24, FlagIPv4CIDR, "did you mean 10.0.0.0/8?"},
		{"overlap", []string{"10.0.0.0/8", "10.1.0.0/16"}, 24, FlagIPv4CIDR, "10.1.0.0/16 overlaps 10.0.0.0/8"},
		{"mask equal to prefix", []string{"10.0.0.0/24"}, 24, FlagIPv4MaskSize, "must be larger than the prefix length of 10.0.0.0/24"},
		{"mask shorter than prefix", []string{"10.0.0.0/16"}, 8, FlagIPv4MaskSize, "must be larger"},
		{"mask shorter than second prefix", []string{"10.0.0.0/8", "192.168.0.0/24"}, 24, FlagIPv4MaskSize, "192.168.0.0/24"},
		{"mask zero", []string{"10.0.0.0/8"}, 0, FlagIPv4MaskSize, "must be larger"},
		{"mask too long", []string{"10.0.0.0/24"}, 31, FlagIPv4MaskSize, "at most 30"},
		{"too many node cidrs", []string{"10.0.0.0/8"}, 25, FlagIPv4MaskSize, "into 2^17 node CIDRs, at most 2^16 are allowed; use a mask size of at most 24"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := New(Config{IPv4CIDRs: tt.cidrs, IPv4MaskSize: tt.mask})
			if err == nil {
				t.Fatal("New succeeded")
			}
			if !strings.Contains(err.Error(), "--"+tt.wantFlag) || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %q: want --%s and %q", err, tt.wantFlag, tt.want)
			}
		})
	}
	// Accepted edge cases.
	for _, cfg := range []Config{
		{IPv4CIDRs: []string{"10.0.0.0/8"}, IPv4MaskSize: 24},
		{IPv4CIDRs: []string{"10.0.0.0/16", " 10.1.0.0/16"}, IPv4MaskSize: 30},
		{IPv4CIDRs: []string{"192.168.0.0/29"}, IPv4MaskSize: 30},
	} {
		if _, err := cfg.Validate(); err != nil {
			t.Errorf("Validate(%v) = %v", cfg, err)
		}
	}
}

func TestAllocateStableAndSequential(t *testing.T) {
	a := mustNew(t, 26, "10.0.0.0/25", "10.1.0.0/25")
	got := map[string]netip.Prefix{}
	for _, n := range []string{"n1", "n2", "n3", "n4"} {
		c, err := a.Allocate(n)
		if err != nil {
			t.Fatal(err)
		}
		got[n] = c
	}
	want := map[string]netip.Prefix{"n1": pfx("10.0.0.0/26"), "n2": pfx("10.0.0.64/26"), "n3": pfx("10.1.0.0/26"), "n4": pfx("10.1.0.64/26")}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("allocations = %v, want %v", got, want)
	}
	for n, c := range want {
		if again, err := a.Allocate(n); err != nil || again != c {
			t.Errorf("Allocate(%s) again = %v, %v; want %v", n, again, err, c)
		}
	}
	_, err := a.Allocate("n5")
	if !errors.Is(err, ErrPoolExhausted) {
		t.Fatalf("Allocate on a full pool = %v", err)
	}
	for _, s := range []string{`"n5"`, "all 4 /26 node CIDRs", "10.0.0.0/25", "10.1.0.0/25", "--" + FlagIPv4CIDR} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("exhaustion error %q does not mention %s", err, s)
		}
	}
	if a.Used() != 4 {
		t.Errorf("Used() = %d", a.Used())
	}
	if _, err := a.Allocate(""); !errors.Is(err, ErrEmptyNode) {
		t.Errorf("Allocate(\"\") = %v", err)
	}
}

func TestReleaseAndReuse(t *testing.T) {
	a := mustNew(t, 26, "10.0.0.0/24") // four node CIDRs
	c1, _ := a.Allocate("n1")
	a.Release("n1")
	a.Release("n1") // idempotent
	a.Release("never-seen")
	c2, _ := a.Allocate("n2")
	if c2 == c1 {
		t.Errorf("released %v handed out again at once", c1)
	}
	a.Allocate("n3")
	a.Allocate("n4")
	if c, err := a.Allocate("n5"); err != nil || c != c1 {
		t.Errorf("after wrap-around Allocate = %v, %v; want %v", c, err, c1)
	}
	if len(a.Lookup("n1")) != 0 {
		t.Error("released node still holds CIDRs")
	}
}

func TestOccupy(t *testing.T) {
	a := mustNew(t, 24, "10.0.0.0/16", "10.5.0.0/16")
	tests := []struct {
		node, cidr string
		wantErr    error
		want       string
	}{
		{"n1", "10.0.7.0/24", nil, ""},
		{"n1", "10.0.7.0/24", nil, ""}, // again: idempotent
		{"n2", "10.0.7.0/24", ErrInUse, `held by node "n1"`},
		{"n1", "10.5.3.0/24", nil, ""}, // a second CIDR for n1
		{"n3", "10.9.0.0/24", ErrNotInPool, "outside [10.0.0.0/16 10.5.0.0/16]"},
		{"n3", "10.0.8.0/25", ErrNotInPool, "not a /24 (--cluster-pool-ipv4-mask-size)"},
		{"n3", "10.0.8.0/23", ErrNotInPool, "not a /24 (--cluster-pool-ipv4-mask-size)"},
		{"n3", "10.0.8.1/24", ErrNotInPool, "host bits"},
		{"n3", "fd00::/24", ErrNotInPool, "not an IPv4 CIDR"},
		{"", "10.0.9.0/24", ErrEmptyNode, ""},
	}
	for _, tt := range tests {
		err := a.Occupy(tt.node, pfx(tt.cidr))
		if (tt.wantErr == nil) != (err == nil) || !errors.Is(err, tt.wantErr) {
			t.Errorf("Occupy(%s, %s) = %v, want %v", tt.node, tt.cidr, err, tt.wantErr)
			continue
		}
		if err != nil && !strings.Contains(err.Error(), tt.want) {
			t.Errorf("Occupy(%s, %s) error %q does not contain %q", tt.node, tt.cidr, err, tt.want)
		}
	}
	if got := fmt.Sprint(a.Lookup("n1")); got != "[10.0.7.0/24 10.5.3.0/24]" {
		t.Errorf("Lookup(n1) = %s", got)
	}
	if c, _ := a.Allocate("n1"); c != pfx("10.0.7.0/24") {
		t.Errorf("Allocate(n1) after Occupy = %v, want its first CIDR", c)
	}
	// Allocate skips occupied CIDRs.
	for i := range 300 {
		c, err := a.Allocate(fmt.Sprintf("x%d", i))
		if err != nil {
			t.Fatal(err)
		}
		if c == pfx("10.0.7.0/24") || c == pfx("10.5.3.0/24") {
			t.Fatalf("Allocate handed out occupied %v", c)
		}
	}
	a.Release("n1")
	if err := a.Occupy("n2", pfx("10.0.7.0/24")); err != nil {
		t.Errorf("Occupy after Release = %v", err)
	}
	if d := a.Dump(); len(d) != 301 || fmt.Sprint(d["n2"]) != "[10.0.7.0/24]" {
		t.Errorf("Dump has %d nodes, n2 = %v", len(d), d["n2"])
	}
}

func TestConcurrent(t *testing.T) {
	a := mustNew(t, 24, "10.0.0.0/20", "10.1.0.0/22") // 16 + 4 node CIDRs
	var wg sync.WaitGroup
	results := make([][]netip.Prefix, 8)
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 10 {
				node := fmt.Sprintf("w%d-n%d", w, i)
				c, err := a.Allocate(node)
				if errors.Is(err, ErrPoolExhausted) {
					return
				}
				if err != nil {
					t.Error(err)
					return
				}
				if i%4 == 3 {
					a.Release(node)
					continue
				}
				results[w] = append(results[w], c)
			}
		}()
	}
	wg.Wait()
	seen := map[netip.Prefix]bool{}
	for _, cs := range results {
		for _, c := range cs {
			if seen[c] {
				t.Fatalf("%v handed out twice", c)
			}
			seen[c] = true
		}
	}
	if len(seen) != a.Used() || a.Used() != a.Capacity() {
		t.Errorf("held %d, used %d, capacity %d", len(seen), a.Used(), a.Capacity())
	}
}
