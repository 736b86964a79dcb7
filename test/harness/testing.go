package harness

import (
	"context"
	"crypto/rand"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// coldBuildTime is what a test needs to have left on its clock for Start to
// build the Kubernetes binaries.
const coldBuildTime = 25 * time.Minute

// ForTest starts a cluster for one test and stops it when the test and its
// subtests finish (t.Cleanup). It fails the test if the cluster does not
// start. When the test has failed, the work directory is kept and its path
// logged, so the component logs can be read. Options.Logger defaults to the
// test's output.
//
// When the binaries are not built yet and the test's deadline (go test
// -timeout) would expire during the build, it fails at once and says how to
// build them beforehand.
func ForTest(t testing.TB, opts Options) *Cluster {
	t.Helper()
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.NewTextHandler(t.Output(), nil))
	}
	if msg := buildWontFit(t, opts); msg != "" {
		t.Fatal(msg)
	}
	c, err := Start(t.Context(), opts)
	if err != nil {
		t.Fatalf("start test cluster: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			c.keepWorkDir()
			t.Logf("test failed: cluster logs are kept in %s", c.Dir())
		}
		if err := c.Stop(); err != nil {
			t.Errorf("stop test cluster: %v", err)
		}
	})
	return c
}

// Shared is one cluster shared by the tests of a package: started by the
// first [Shared.Get], stopped by [Shared.Stop] from TestMain. Tests that
// share it should keep to namespaces of their own ([Cluster.TestNamespace]).
// See the package documentation for an example.
type Shared struct {
	opts Options

	mu      sync.Mutex
	started bool
	c       *Cluster
	err     error
}

// NewShared returns a Shared that starts a cluster with opts on first use.
// Options.Logger defaults to standard error (the cluster outlives any one
// test's output).
func NewShared(opts Options) *Shared {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	return &Shared{opts: opts}
}

// Get returns the shared cluster, starting it on the first call. If it could
// not be started, Get fails t (and every later caller) with the reason.
func (s *Shared) Get(t testing.TB) *Cluster {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.started {
		if msg := buildWontFit(t, s.opts); msg != "" {
			t.Fatal(msg) // not recorded: a later test may have more time
		}
		s.started = true
		s.c, s.err = Start(context.Background(), s.opts)
	}
	if s.err != nil {
		t.Fatalf("start shared test cluster: %v", s.err)
	}
	return s.c
}

// Stop stops the shared cluster if it was started. Call it from TestMain after
// m.Run.
func (s *Shared) Stop() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.c == nil {
		return nil
	}
	return s.c.Stop()
}

// TestNamespace creates a namespace named after the test (lower-cased, with a
// random suffix) that has a "default" ServiceAccount, and deletes it when the
// test finishes. It fails the test on error. Without the controller-manager a
// deleted namespace stays Terminating, which is harmless.
func (c *Cluster) TestNamespace(t testing.TB) string {
	t.Helper()
	name := namespaceName(t.Name())
	ctx := t.Context()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{
		Name:   name,
		Labels: map[string]string{"cellium.io/test": "true"},
	}}
	if _, err := c.Clientset().CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create test namespace: %v", err)
	}
	t.Cleanup(func() {
		if c.stopped.Load() {
			return // the test stopped the cluster itself
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		err := c.Clientset().CoreV1().Namespaces().Delete(ctx, name, metav1.DeleteOptions{})
		if err != nil {
			t.Logf("delete test namespace %s: %v", name, err)
		}
	})
	if err := c.EnsureServiceAccount(ctx, name); err != nil {
		t.Fatalf("create test namespace: %v", err)
	}
	return name
}

// namespaceName turns a test name into a DNS label: lower case, [a-z0-9-],
// at most 63 characters including a random 5-character suffix.
func namespaceName(testName string) string {
	var b strings.Builder
	dash := true // no leading dash
	for _, r := range strings.ToLower(testName) {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
			b.WriteRune(r)
			dash = false
		} else if !dash {
			b.WriteByte('-')
			dash = true
		}
	}
	base := strings.TrimSuffix(b.String(), "-")
	if len(base) > 50 {
		base = strings.TrimSuffix(base[:50], "-")
	}
	if base == "" {
		base = "test"
	}
	const alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
	suffix := []byte(rand.Text()[:5]) // base32: A-Z2-7
	for i, ch := range suffix {
		suffix[i] = alphabet[int(ch)%len(alphabet)]
	}
	return base + "-" + string(suffix)
}

// buildWontFit returns advice if Start would have to build binaries and t's
// deadline leaves too little time for that.
func buildWontFit(t testing.TB, opts Options) string {
	if opts.Binaries.KubeAPIServer != "" {
		return ""
	}
	d, ok := t.(interface{ Deadline() (time.Time, bool) })
	if !ok {
		return ""
	}
	deadline, ok := d.Deadline()
	if !ok || time.Until(deadline) >= coldBuildTime {
		return ""
	}
	cold, err := coldBuildNeeded()
	if err != nil || !cold {
		return "" // Start reports err
	}
	return fmt.Sprintf("the Kubernetes test binaries are not built yet: building them takes 10-15 minutes, "+
		"more than this test's deadline allows (%s left). Build them once with\n"+
		"\tgo run ./test/cmd/devcluster build\n"+
		"from the repository root, or run go test with -timeout 30m.", time.Until(deadline).Round(time.Second))
}
