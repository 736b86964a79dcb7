package plugin

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"go.uber.org/goleak"
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
