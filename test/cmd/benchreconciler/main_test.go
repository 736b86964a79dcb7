package main

import (
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// Both sides reconcile every object of a small run and stop cleanly (the
// figures themselves come from make bench-reconciler).
func TestBothReconcileEverything(t *testing.T) {
	for name, run := range map[string]func(n, batch, incr int) (time.Duration, int64, error){
		"upstream": runUpstream,
		"cellium":  runCellium,
	} {
		d, updates, err := run(5000, 100, 50)
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		if d <= 0 || updates < 5000 {
			t.Errorf("%s: took %v, %d updates for 5000 objects", name, d, updates)
		}
	}
}
