package identity

import (
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/cellium/cellium/test/harness"
)

// cluster is the real API server of the integration tests, started on
// first use.
var cluster = harness.NewShared(harness.Options{})

func TestMain(m *testing.M) {
	code := m.Run()
	if err := cluster.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		code = 1
	}
	if code == 0 {
		if err := goleak.Find(goleak.IgnoreAnyFunction("k8s.io/klog/v2.(*loggingT).flushDaemon")); err != nil {
			fmt.Fprintln(os.Stderr, "goroutines left behind:", err)
			code = 1
		}
	}
	os.Exit(code)
}
