package link

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/cellium/cellium/test/privileged"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// requirePrivileged skips or fails tb without root and netns.
func requirePrivileged(tb testing.TB) { tb.Helper(); privileged.Require(tb) }
