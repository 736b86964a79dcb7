package pool

import (
	"fmt"
	"net/netip"
	"testing"
)

// A /16 pool kept half full: each iteration allocates one address and
// releases the oldest, so Allocate has to skip held addresses.
func BenchmarkAllocateRelease(b *testing.B) {
	for _, bits := range []int{24, 16} {
		b.Run(fmt.Sprintf("/%d", bits), func(b *testing.B) {
			p, err := New(netip.PrefixFrom(netip.MustParseAddr("10.0.0.0"), bits))
			if err != nil {
				b.Fatal(err)
			}
			held := make([]netip.Addr, 0, p.Capacity())
			for len(held) < p.Capacity()/2 {
				a, err := p.Allocate("ns/warm")
				if err != nil {
					b.Fatal(err)
				}
				held = append(held, a)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				a, err := p.Allocate("ns/pod")
				if err != nil {
					b.Fatal(err)
				}
				if err := p.Release(held[i%len(held)]); err != nil {
					b.Fatal(err)
				}
				held[i%len(held)] = a
			}
		})
	}
}

// A full /16 with one free address right behind the cursor: every Allocate
// scans the whole bitmap around to find it (the scan's worst case).
func BenchmarkAllocateNearlyFull(b *testing.B) {
	p, err := New(netip.MustParsePrefix("10.0.0.0/16"))
	if err != nil {
		b.Fatal(err)
	}
	var last netip.Addr
	for {
		a, err := p.Allocate("ns/fill")
		if err != nil {
			break
		}
		last = a
	}
	if err := p.Release(last); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		a, err := p.Allocate("ns/pod")
		if err != nil {
			b.Fatal(err)
		}
		if err := p.Release(a); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkAllocateReleaseParallel(b *testing.B) {
	p, err := New(netip.MustParsePrefix("10.0.0.0/16"))
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			a, err := p.Allocate("ns/pod")
			if err != nil {
				b.Fatal(err)
			}
			if err := p.Release(a); err != nil {
				b.Fatal(err)
			}
		}
	})
}
