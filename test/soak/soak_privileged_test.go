package soak

import (
	"crypto/rand"
	"encoding/binary"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/cellium/cellium/test/devkubelet/devnode"
	"github.com/cellium/cellium/test/harness"
	"github.com/cellium/cellium/test/privileged"
)

// soakMargin is what a soak needs beyond its duration: starting the API
// server, building the binaries, the final check and the clean-up.
const soakMargin = 6 * time.Minute

// TestPrivilegedSoak is the chaos soak: for -soak.duration (2 minutes by
// default, `make soak DURATION=30m` for longer) it churns pods through
// the real CNI path on one node of a real API server, relabels them,
// repeats and races CNI DELs, retries ADDs, kills the agent and the
// operator and stops the API server, and checks the node's invariants at
// quiescent points (see Check). A violation fails the test with the
// timeline of the actions that led to it; the counts are logged at the
// end. The seed is logged: -soak.seed=N repeats a run's choices.
func TestPrivilegedSoak(t *testing.T) {
	if testing.Short() {
		t.Skip("the soak runs for minutes: skipped with -short")
	}
	privileged.Require(t)
	dur := *flagDuration
	if d, ok := t.Deadline(); ok && time.Until(d) < dur+soakMargin {
		t.Fatalf("a soak of %s needs about %s more than that: go test's -timeout leaves %s; pass -timeout %s",
			dur, soakMargin, time.Until(d).Truncate(time.Second), (dur + soakMargin + 5*time.Minute).Truncate(time.Minute))
	}
	seed := *flagSeed
	if seed == 0 {
		var b [8]byte
		_, _ = rand.Read(b[:])
		seed = binary.LittleEndian.Uint64(b[:]) >> 1
	}
	t.Logf("soak: datapath %v (-soak.datapath, CELLIUM_SOAK_DATAPATH)", *flagDatapath)
	t.Logf("soak: seed %d (repeat with -soak.seed=%d or CELLIUM_SOAK_SEED=%d)", seed, seed, seed)

	ctx := t.Context()
	began := time.Now()
	// With the socket load balancer, the cluster's Service range must be
	// one nobody else on the machine uses: its programs act on every
	// socket of the machine.
	svcRange := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 232, byte(os.Getpid() % 250), 0}), 24)
	c := harness.ForTest(t, harness.Options{ServiceClusterIPRange: svcRange.String()})
	binDir := t.TempDir()
	bins, err := devnode.BuildBinaries(ctx, binDir, devnode.Agent, devnode.Operator, devnode.CNIPlugin, devnode.CLI)
	if err != nil {
		t.Fatal(err)
	}
	// Short: the agent's socket lives in it.
	dir, err := os.MkdirTemp("", "csoak-")
	if err != nil {
		t.Fatal(err)
	}
	ns := c.TestNamespace(t)

	s, err := Start(ctx, Config{
		Duration:     dur,
		Seed:         seed,
		Cluster:      c,
		Binaries:     bins,
		Dir:          dir,
		Namespace:    ns,
		Skip:         skipSet(*flagSkip),
		Logf:         t.Logf,
		Datapath:     *flagDatapath,
		ServiceRange: svcRange,
	})
	t.Cleanup(func() {
		if s != nil {
			began := time.Now()
			if err := s.Close(); err != nil {
				t.Errorf("soak clean-up: %v", err)
			}
			t.Logf("soak: cleaned up in %s", time.Since(began).Truncate(time.Millisecond))
		}
		if t.Failed() {
			if s != nil {
				t.Log(s.LogTails(60))
			}
			t.Logf("soak logs kept in %s", dir)
			return
		}
		_ = os.RemoveAll(dir)
	})
	if err != nil {
		t.Fatal(err)
	}

	t.Logf("soak: set up in %s (API server, binaries, operator, node)", time.Since(began).Truncate(time.Millisecond))
	r := s.Run(ctx)
	t.Logf("soak: %s", r.Summary())
	if len(r.Violations) > 0 {
		var b strings.Builder
		r.WriteFailure(&b)
		t.Errorf("soak failed: %s", b.String())
	}
}
