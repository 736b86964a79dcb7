package scale

import (
	"context"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/cellium/cellium/test/harness"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// TestScale runs the simulation at the CI size (100 nodes, 2,000 remote
// pods) in CEP and CES mode and fails when a figure is over its budget
// (CIBudget): a regression of the agent's memory or CPU per remote
// endpoint, of the CEP-to-ipcache or policy latency, or of the API load
// cellium causes.
func TestScale(t *testing.T) {
	if testing.Short() {
		t.Skip("starts clusters and the real binaries")
	}
	ctx, cancel := context.WithTimeout(t.Context(), 8*time.Minute)
	defer cancel()
	bin := t.TempDir()
	if err := harness.BuildCellium(ctx, bin); err != nil {
		t.Fatal(err)
	}
	var results []*Result
	for _, mode := range []Mode{ModeCEP, ModeCES} {
		t.Run(string(mode), func(t *testing.T) {
			cfg := CIConfig(mode)
			cfg.BinDir = bin
			cfg.Log = harness.TextLogger(t.Output())
			res, err := Run(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			results = append(results, res)
			for _, o := range CIBudget(mode).Check(res) {
				t.Errorf("over budget: %s", o)
			}
		})
	}
	if len(results) > 0 {
		t.Logf("scale figures:\n%s", Table(results...))
	}
}
