package devkubelet

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"go.uber.org/goleak"

	"github.com/cellium/cellium/test/harness"
)

// cluster is the API server the privileged tests run the kubelet against.
var cluster = harness.NewShared(harness.Options{})

func TestMain(m *testing.M) {
	// The test binary doubles as the fake CNI plugin: libcni runs it
	// through a symbolic link named after the plugin type.
	if filepath.Base(os.Args[0]) == fakePluginType {
		fakePluginMain()
		return
	}
	code := m.Run()
	if err := cluster.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		code = 1
	}
	if code == 0 {
		if err := goleak.Find(goleak.IgnoreTopFunction("k8s.io/klog/v2.(*flushDaemon).run.func1")); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}
