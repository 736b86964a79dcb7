package link

import (
	"os"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// requirePrivilegedEnv is the variable that turns skipped privileged
// tests into failures (set in CI, where root and netns are a given).
const requirePrivilegedEnv = "CELLIUM_REQUIRE_PRIVILEGED"

// requirePrivileged skips tb, saying why, unless the process is root and
// can create network namespaces; with CELLIUM_REQUIRE_PRIVILEGED=1 it
// fails tb instead of skipping.
func requirePrivileged(tb testing.TB) {
	tb.Helper()
	reason := ""
	if os.Geteuid() != 0 {
		reason = "not running as root"
	} else if n, err := ns.TempNetNS(); err != nil {
		reason = "cannot create a network namespace: " + err.Error()
	} else {
		_ = n.Close()
	}
	if reason == "" {
		return
	}
	if os.Getenv(requirePrivilegedEnv) == "1" {
		tb.Fatalf("privileged test cannot run (%s) and %s=1", reason, requirePrivilegedEnv)
	}
	tb.Skipf("privileged test skipped: %s (set %s=1 to fail instead)", reason, requirePrivilegedEnv)
}
