package plugin

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"testing"

	"go.uber.org/goleak"

	"github.com/cellium/cellium/test/privileged"
)

// binDir holds the cellium-cni binary the tests build once, lazily.
var (
	buildOnce sync.Once
	binDir    string
	buildErr  error
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.Cleanup(func(code int) {
		if binDir != "" {
			os.RemoveAll(binDir)
		}
		os.Exit(code)
	}))
}

// pluginBinary returns the directory holding a freshly built cellium-cni,
// the CNI_PATH of the tests.
func pluginBinary(t testing.TB) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "cellium-cni-bin")
		if err != nil {
			buildErr = err
			return
		}
		binDir = dir
		goBin, err := exec.LookPath("go")
		if err != nil {
			goBin = filepath.Join(runtime.GOROOT(), "bin", "go")
		}
		cmd := exec.Command(goBin, "build", "-o", filepath.Join(dir, PluginType), "github.com/cellium/cellium/cni/cellium-cni")
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = &buildError{err: err, out: string(out)}
		}
	})
	if buildErr != nil {
		t.Fatalf("build cellium-cni: %v", buildErr)
	}
	return binDir
}

type buildError struct {
	err error
	out string
}

func (e *buildError) Error() string { return e.err.Error() + "\n" + e.out }

// requirePrivileged skips or fails tb without root and netns.
func requirePrivileged(tb testing.TB) { tb.Helper(); privileged.Require(tb) }
