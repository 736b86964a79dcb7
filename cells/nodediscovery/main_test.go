package nodediscovery_test

import (
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/cellium/cellium/test/harness"
)

// cluster is the real etcd and kube-apiserver of the integration test,
// started by the first test that needs it.
var cluster = harness.NewShared(harness.Options{})

// TestMain stops the shared API server, then checks that no test left a
// goroutine behind.
func TestMain(m *testing.M) {
	code := m.Run()
	if err := cluster.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, "stop test cluster:", err)
		code = 1
	}
	if code == 0 {
		if err := goleak.Find(goleak.IgnoreAnyFunction("k8s.io/klog/v2.(*loggingT).flushDaemon")); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}
