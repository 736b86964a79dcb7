package ipam

import (
	"context"
	"fmt"
	"testing"

	"github.com/cellium/cellium/cells/hive/hivetest"
)

// BenchmarkAllocateRelease allocates and releases one address per
// iteration, with the state file written (fsync'ed) for each change;
// parallel callers share writes.
func BenchmarkAllocateRelease(b *testing.B) {
	for _, par := range []int{1, 16} {
		b.Run(fmt.Sprintf("callers=%d", par), func(b *testing.B) {
			store := newStateStore(b.TempDir()+"/"+StateFileName, "boot")
			a := newAllocatorCore(testNode, store, hivetest.Discard())
			if err := a.restore(); err != nil {
				b.Fatal(err)
			}
			if err := a.setPodCIDRs(prefixes("10.0.0.0/16")); err != nil {
				b.Fatal(err)
			}
			b.SetParallelism(par)
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					al, err := a.AllocateNext(context.Background(), Owner{Name: "ns/pod"})
					if err != nil {
						b.Error(err)
						return
					}
					if err := a.Release(al.IP); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}
