package monitor

import (
	"fmt"
	"sync"
	"testing"
)

// BenchmarkPublish measures one Publish with n subscribers that read
// everything, and with n subscribers that never read (every event lost
// for them: the publisher's worst case).
func BenchmarkPublish(b *testing.B) {
	for _, n := range []int{0, 1, 8} {
		b.Run(fmt.Sprintf("readers=%d", n), func(b *testing.B) {
			h := NewHub()
			var wg sync.WaitGroup
			for range n {
				s := h.Subscribe(Filter{}, 4096)
				wg.Add(1)
				go func() {
					defer wg.Done()
					for range s.Events() {
					}
				}()
			}
			ev := drop(1)
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				h.Publish(ev)
			}
			b.StopTimer()
			h.Close()
			wg.Wait()
		})
		b.Run(fmt.Sprintf("stalled=%d", n), func(b *testing.B) {
			h := NewHub()
			for range n {
				h.Subscribe(Filter{}, 1)
			}
			ev := drop(1)
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				h.Publish(ev)
			}
			b.StopTimer()
			h.Close()
		})
	}
}
