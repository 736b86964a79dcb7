package realnode

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netns"

	"github.com/cellium/cellium/test/privileged"
)

// inNewNetns runs f on a thread of its own in a new network namespace;
// the thread is discarded afterwards (never returned to the runtime).
func inNewNetns(t *testing.T, f func()) {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread goes with the goroutine
		n, err := netns.New()
		if err != nil {
			done <- err
			return
		}
		defer n.Close()
		defer func() { done <- nil }()
		f()
	}()
	if err := <-done; err != nil {
		t.Fatalf("new network namespace: %v", err)
	}
}

// TestPrivilegedWaitHostFreeOrphans: kube-proxy's tables with no process
// that may own them are a killed run's, and WaitHostFree removes them after
// the grace (CI failed once with every real node waiting 15 minutes for
// such tables); with a kube-proxy running in the namespace it leaves them
// alone and its error names that process. In a network namespace of the
// test's own, so the host's tables are never touched.
func TestPrivilegedWaitHostFreeOrphans(t *testing.T) {
	privileged.Require(t)
	if _, err := exec.LookPath("nft"); err != nil {
		t.Fatalf("nft: %v (make deps installs it)", err)
	}
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(sleep)
	if err != nil {
		t.Fatal(err)
	}
	fakeProxy := filepath.Join(t.TempDir(), "kube-proxy")
	if err := os.WriteFile(fakeProxy, b, 0o755); err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(testWriter{t}, nil))
	var errs []string
	inNewNetns(t, func() {
		fail := func(format string, args ...any) { errs = append(errs, fmt.Sprintf(format, args...)) }
		ctx := context.Background()
		if _, err := NFT(ctx, "add", "table", "ip", "kube-proxy"); err != nil {
			fail("%v", err)
			return
		}
		// A kube-proxy runs: the table is its, and stays.
		proxy := exec.Command(fakeProxy, "60")
		if err := proxy.Start(); err != nil {
			fail("%v", err)
			return
		}
		wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := waitHostFree(wctx, true, false, time.Second, log)
		cancel()
		want := fmt.Sprintf("pid %d: %s 60", proxy.Process.Pid, fakeProxy)
		if err == nil || !strings.Contains(err.Error(), want) {
			fail("with a kube-proxy running: err %v; want one naming %q", err, want)
		}
		if !nftTableExists("ip kube-proxy") {
			fail("the table of a running kube-proxy was removed")
		}
		_ = proxy.Process.Kill()
		_ = proxy.Wait()

		// Nobody owns it now: removed after the grace.
		wctx, cancel = context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		if err := waitHostFree(wctx, true, false, time.Second, log); err != nil {
			fail("an orphan table: %v", err)
		}
		if nftTableExists("ip kube-proxy") {
			fail("the orphan table is still there")
		}
	})
	for _, e := range errs {
		t.Error(e)
	}
}

// testWriter sends log lines to t.Log.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}
