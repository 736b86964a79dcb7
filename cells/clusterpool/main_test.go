package clusterpool_test

import (
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"
)

// TestMain stops the shared API server of the integration test, then
// checks that no test left a goroutine behind.
func TestMain(m *testing.M) {
	code := m.Run()
	for _, c := range []interface{ Stop() error }{cluster, gcCluster} {
		if err := c.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "stop test cluster:", err)
			code = 1
		}
	}
	if code == 0 {
		if err := goleak.Find(goleak.IgnoreAnyFunction("k8s.io/klog/v2.(*loggingT).flushDaemon")); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}
