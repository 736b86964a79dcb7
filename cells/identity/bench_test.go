package identity

import (
	"fmt"
	"testing"
	"time"
)

// BenchmarkAllocate measures Allocate against the fake API: "held" takes
// another reference to an identity this agent uses (the common case: a
// second replica on the node), "new" creates an identity for new labels.
func BenchmarkAllocate(b *testing.B) {
	b.Run("held", func(b *testing.B) {
		ag := startAgent(b, newFakeClientset(), nil)
		ctx := ctxTimeout(b, time.Minute)
		lbls := podLabels("web", "prod")
		if _, err := ag.alloc.Allocate(ctx, lbls); err != nil {
			b.Fatal(err)
		}
		b.ResetTimer()
		for b.Loop() {
			if _, err := ag.alloc.Allocate(ctx, lbls); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("new", func(b *testing.B) {
		ag := startAgent(b, newFakeClientset(), nil)
		ctx := ctxTimeout(b, time.Minute)
		i := 0
		for b.Loop() {
			i++
			if _, err := ag.alloc.Allocate(ctx, podLabels(fmt.Sprintf("app-%d", i), "prod")); err != nil {
				b.Fatal(err)
			}
		}
	})
}
