package soak

import (
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
	"k8s.io/klog/v2"
)

// The soak's settings: flags, else environment variables (make soak sets
// them), else the defaults of a run inside `go test ./...`.
var (
	flagDuration = flag.Duration("soak.duration", envDuration("CELLIUM_SOAK_DURATION", 2*time.Minute),
		"how long TestPrivilegedSoak drives the node (env CELLIUM_SOAK_DURATION)")
	flagSeed = flag.Uint64("soak.seed", envUint("CELLIUM_SOAK_SEED", 0),
		"seed of the soak's random choices; 0 picks one (env CELLIUM_SOAK_SEED)")
	flagDatapath = flag.Bool("soak.datapath", envBool("CELLIUM_SOAK_DATAPATH", true),
		"run the agent with the eBPF datapath, host routing and the socket LB, and check the datapath invariants (env CELLIUM_SOAK_DATAPATH)")
	flagSkip = flag.String("soak.skip", os.Getenv("CELLIUM_SOAK_SKIP"),
		"comma-separated actions the soak does not do, e.g. add-retry,del-storm (env CELLIUM_SOAK_SKIP)")
)

func envDuration(name string, def time.Duration) time.Duration {
	if v := os.Getenv(name); v != "" {
		if d, err := time.ParseDuration(v); err == nil {
			return d
		}
		fmt.Fprintf(os.Stderr, "ignoring %s=%q: not a duration such as 30m\n", name, v)
	}
	return def
}

func envBool(name string, def bool) bool {
	if v := os.Getenv(name); v != "" {
		if b, err := strconv.ParseBool(v); err == nil {
			return b
		}
		fmt.Fprintf(os.Stderr, "ignoring %s=%q: not true or false\n", name, v)
	}
	return def
}

func envUint(name string, def uint64) uint64 {
	if v := os.Getenv(name); v != "" {
		if n, err := strconv.ParseUint(v, 10, 64); err == nil {
			return n
		}
		fmt.Fprintf(os.Stderr, "ignoring %s=%q: not a number\n", name, v)
	}
	return def
}

// skipSet parses -soak.skip.
func skipSet(s string) map[string]bool {
	out := map[string]bool{}
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out[f] = true
		}
	}
	return out
}

func TestMain(m *testing.M) {
	// client-go's reflectors complain at length while the soak has the
	// API server down; the soak's timeline says what matters.
	klog.SetOutput(io.Discard)
	klog.LogToStderr(false)
	code := m.Run()
	if code == 0 {
		if err := goleak.Find(goleak.IgnoreTopFunction("k8s.io/klog/v2.(*flushDaemon).run.func1")); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}
