package identity

import (
	"testing"
	"testing/quick"
)

func FuzzParseNumericIdentity(f *testing.F) {
	for _, s := range []string{"0", "256", "4294967295", "4294967296", "-1", "007", "+1", " 1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		id, err := ParseNumericIdentity(s)
		if err != nil {
			return
		}
		again, err := ParseNumericIdentity(id.StringID())
		if err != nil || again != id {
			t.Fatalf("ParseNumericIdentity(%q) = %d, but its StringID %q reads back as %d, %v", s, id, id.StringID(), again, err)
		}
	})
}

// Every identity in a cluster's allocation range carries that cluster's ID,
// and the ranges of different clusters do not overlap.
func TestLayoutProperties(t *testing.T) {
	for _, maxClusters := range []uint32{DefaultMaxConnectedClusters, ExtendedMaxConnectedClusters} {
		prop := func(a, b uint32, off uint32) bool {
			a, b = a%(maxClusters+1), b%(maxClusters+1)
			la, _ := NewLayout(a, maxClusters)
			lb, _ := NewLayout(b, maxClusters)
			span := uint32(la.MaxAllocation() - la.MinAllocation() + 1)
			id := la.MinAllocation() + NumericIdentity(off%span)
			if !la.InAllocationRange(id) || la.ClusterIDOf(id) != a {
				return false
			}
			return a == b || !lb.InAllocationRange(id)
		}
		if err := quick.Check(prop, &quick.Config{MaxCount: 5000}); err != nil {
			t.Errorf("max-connected-clusters %d: %v", maxClusters, err)
		}
	}
}
