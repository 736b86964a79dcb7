package cidralloc

import (
	"fmt"
	"testing"
)

// The default pool (65536 /24s of 10.0.0.0/8) half full: release one of
// 1024 churning nodes and allocate for it again, which hands it the next
// free /24 rather than its old one.
func BenchmarkAllocateRelease(b *testing.B) {
	a, err := New(DefaultConfig())
	if err != nil {
		b.Fatal(err)
	}
	nodes := make([]string, a.Capacity()/2)
	for i := range nodes {
		nodes[i] = fmt.Sprintf("warm-%d", i)
		if _, err := a.Allocate(nodes[i]); err != nil {
			b.Fatal(err)
		}
	}
	names := make([]string, 1024)
	for i := range names {
		names[i] = fmt.Sprintf("node-%d", i)
	}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		name := names[i%len(names)]
		a.Release(name)
		if _, err := a.Allocate(name); err != nil {
			b.Fatal(err)
		}
	}
}
