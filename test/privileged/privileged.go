// Package privileged gates tests that need root and network namespaces:
// they skip with the reason elsewhere, and fail instead of skipping when
// CELLIUM_REQUIRE_PRIVILEGED=1 (CI sets it, where both are a given).
package privileged

import (
	"os"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
)

// EnvVar turns skipped privileged tests into failures.
const EnvVar = "CELLIUM_REQUIRE_PRIVILEGED"

// Require skips tb, saying why, unless the process is root and can create
// network namespaces; with CELLIUM_REQUIRE_PRIVILEGED=1 it fails tb instead.
func Require(tb testing.TB) {
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
	if os.Getenv(EnvVar) == "1" {
		tb.Fatalf("privileged test cannot run (%s) and %s=1", reason, EnvVar)
	}
	tb.Skipf("privileged test skipped: %s (set %s=1 to fail instead)", reason, EnvVar)
}
