package cidralloc

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"
)

// FuzzNoOverlap runs random Allocate, Occupy and Release operations: at
// every step no two nodes hold overlapping CIDRs, every CIDR lies in a
// cluster CIDR and has the mask size, a node's Allocate result is stable,
// and exhaustion is reported exactly when every node CIDR is taken.
func FuzzNoOverlap(f *testing.F) {
	f.Add(uint8(26), []byte{0, 1, 0, 2, 0, 3, 2, 1, 0, 4, 1, 5, 9})
	f.Add(uint8(28), []byte{1, 0, 0, 1, 1, 2, 0, 3, 2, 0, 0, 0})
	f.Fuzz(func(t *testing.T, maskByte uint8, ops []byte) {
		cluster := []string{"10.0.0.0/25", "10.0.1.0/26", "192.168.0.0/26"}
		mask := 27 + int(maskByte%4) // 27..30
		a, err := New(Config{IPv4CIDRs: cluster, IPv4MaskSize: mask})
		if err != nil {
			t.Fatal(err)
		}
		var clusterPrefixes []netip.Prefix
		for _, c := range cluster {
			clusterPrefixes = append(clusterPrefixes, netip.MustParsePrefix(c))
		}
		first := map[string]netip.Prefix{} // what Allocate returned per node
		for i := 0; i+2 < len(ops); i += 3 {
			node := fmt.Sprintf("n%d", ops[i+1]%8)
			switch ops[i] % 3 {
			case 0:
				c, err := a.Allocate(node)
				switch {
				case errors.Is(err, ErrPoolExhausted):
					if a.Used() != a.Capacity() || len(a.Lookup(node)) != 0 {
						t.Fatalf("exhausted with %d/%d used, node holds %v", a.Used(), a.Capacity(), a.Lookup(node))
					}
				case err != nil:
					t.Fatal(err)
				default:
					if prev, ok := first[node]; ok && prev != c {
						t.Fatalf("Allocate(%s) = %v, before %v", node, c, prev)
					}
					first[node] = a.Lookup(node)[0]
				}
			case 1:
				// Occupy a CIDR chosen from the operation bytes, which may be
				// outside the pool or held by another node.
				base := clusterPrefixes[int(ops[i+2])%len(clusterPrefixes)].Addr().As4()
				base[3] = ops[i+2] &^ byte(1<<(32-mask)-1)
				c := netip.PrefixFrom(netip.AddrFrom4(base), mask)
				err := a.Occupy(node, c)
				if err != nil && !errors.Is(err, ErrNotInPool) && !errors.Is(err, ErrInUse) {
					t.Fatalf("Occupy(%s, %v) = %v", node, c, err)
				}
				if held := a.Lookup(node); len(held) > 0 {
					first[node] = held[0]
				}
			case 2:
				a.Release(node)
				delete(first, node)
			}
			checkInvariants(t, a, clusterPrefixes, mask)
		}
	})
}

func checkInvariants(t *testing.T, a *Allocator, cluster []netip.Prefix, mask int) {
	t.Helper()
	var all []netip.Prefix
	owner := map[netip.Prefix]string{}
	for node, cs := range a.Dump() {
		for _, c := range cs {
			if c.Bits() != mask {
				t.Fatalf("%s holds %v, not a /%d", node, c, mask)
			}
			inside := false
			for _, cp := range cluster {
				inside = inside || (cp.Contains(c.Addr()) && cp.Bits() <= c.Bits())
			}
			if !inside {
				t.Fatalf("%s holds %v outside %v", node, c, cluster)
			}
			for _, o := range all {
				if o.Overlaps(c) {
					t.Fatalf("%s holds %v, which overlaps %v of %s", node, c, o, owner[o])
				}
			}
			all = append(all, c)
			owner[c] = node
		}
	}
	if len(all) != a.Used() {
		t.Fatalf("nodes hold %d CIDRs, Used() = %d", len(all), a.Used())
	}
}

// FuzzValidate checks that Validate never panics, names a flag in every
// error, and accepts only configurations that give a working allocator.
func FuzzValidate(f *testing.F) {
	f.Add("10.0.0.0/8", "", 24)
	f.Add("10.0.0.0/16", "10.1.0.0/16", 30)
	f.Add("10.0.0.1/8", "fd00::/8", 0)
	f.Fuzz(func(t *testing.T, c1, c2 string, mask int) {
		cidrs := []string{c1}
		if c2 != "" {
			cidrs = append(cidrs, c2)
		}
		cfg := Config{IPv4CIDRs: cidrs, IPv4MaskSize: mask}
		prefixes, err := cfg.Validate()
		if err != nil {
			if !strings.Contains(err.Error(), "--"+FlagIPv4CIDR) && !strings.Contains(err.Error(), "--"+FlagIPv4MaskSize) {
				t.Fatalf("error %q names no flag", err)
			}
			return
		}
		want := 0
		for _, p := range prefixes {
			if !p.Addr().Is4() || p != p.Masked() || mask <= p.Bits() || mask > MaxMaskSize || mask-p.Bits() > MaxNodeCIDRBits {
				t.Fatalf("Validate accepted %v with mask %d", p, mask)
			}
			want += 1 << (mask - p.Bits())
		}
		a, err := New(cfg)
		if err != nil {
			t.Fatalf("Validate accepted %v but New failed: %v", cfg, err)
		}
		if a.Capacity() != want {
			t.Fatalf("New(%v) capacity %d, want %d", cfg, a.Capacity(), want)
		}
	})
}
