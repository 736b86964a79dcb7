package harness

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

func TestRequiredVersion(t *testing.T) {
	dir := t.TempDir()
	gomod := filepath.Join(dir, "go.mod")
	writeFile(t, gomod, `module example.com/tools // a comment

go 1.26.0

require example.com/single v1.2.3

require (
	example.com/other v0.1.0 // indirect
	example.com/wanted v4.5.6
)

replace example.com/wanted => example.com/fork v9.9.9
`)
	for mod, want := range map[string]string{
		"example.com/single": "v1.2.3",
		"example.com/wanted": "v4.5.6",
		"example.com/other":  "v0.1.0",
	} {
		got, err := requiredVersion(gomod, mod)
		if err != nil || got != want {
			t.Errorf("requiredVersion(%s) = %q, %v; want %q", mod, got, err, want)
		}
	}
	if _, err := requiredVersion(gomod, "example.com/missing"); err == nil {
		t.Error("requiredVersion of a module not required: no error")
	}
	if got, err := modulePathOf(gomod); err != nil || got != "example.com/tools" {
		t.Errorf("modulePathOf = %q, %v", got, err)
	}
}

func TestRepoRoot(t *testing.T) {
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	root, err := RepoRoot(wd)
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Dir(filepath.Dir(wd)); root != want { // test/harness
		t.Errorf("RepoRoot = %s, want %s", root, want)
	}
	// Nested modules are passed over.
	if got, err := RepoRoot(filepath.Join(root, "tools", "k8s")); err != nil || got != root {
		t.Errorf("RepoRoot(tools/k8s) = %s, %v; want %s", got, err, root)
	}
	if _, err := RepoRoot(t.TempDir()); err == nil {
		t.Error("RepoRoot outside the checkout: no error")
	}
}

func TestCacheDir(t *testing.T) {
	t.Setenv("CELLIUM_CACHE_DIR", "/x/cache")
	if got, _ := CacheDir(); got != "/x/cache" {
		t.Errorf("with CELLIUM_CACHE_DIR: %s", got)
	}
	t.Setenv("CELLIUM_CACHE_DIR", "")
	t.Setenv("XDG_CACHE_HOME", "/x/xdg")
	if got, _ := CacheDir(); got != "/x/xdg/cellium" {
		t.Errorf("with XDG_CACHE_HOME: %s", got)
	}
	t.Setenv("XDG_CACHE_HOME", "")
	t.Setenv("HOME", "/x/home")
	if got, _ := CacheDir(); got != "/x/home/.cache/cellium" {
		t.Errorf("with HOME: %s", got)
	}
}

func TestPlanBinariesLayout(t *testing.T) {
	t.Setenv("CELLIUM_CACHE_DIR", "/x/cache")
	_, bins, err := planBinaries()
	if err != nil {
		t.Fatal(err)
	}
	want := Binaries{
		Etcd:                  "/x/cache/bin/etcd-" + bins.EtcdVersion + "/etcd",
		KubeAPIServer:         "/x/cache/bin/k8s-" + bins.KubernetesVersion + "/kube-apiserver",
		KubeControllerManager: "/x/cache/bin/k8s-" + bins.KubernetesVersion + "/kube-controller-manager",
		EtcdVersion:           bins.EtcdVersion,
		KubernetesVersion:     bins.KubernetesVersion,
	}
	if bins != want || !strings.HasPrefix(bins.EtcdVersion, "v3.") || !strings.HasPrefix(bins.KubernetesVersion, "v1.") {
		t.Errorf("planBinaries = %+v\nwant %+v", bins, want)
	}
}

// TestToolBuildConcurrent builds a tiny module from several goroutines at once:
// exactly one builds, the others wait for the lock and find the binary.
func TestToolBuildConcurrent(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("no go command")
	}
	mod := t.TempDir()
	writeFile(t, filepath.Join(mod, "go.mod"), "module example.com/hello\n\ngo 1.22\n")
	writeFile(t, filepath.Join(mod, "main.go"), "package main\n\nfunc main() { println(\"hello\") }\n")
	cache := t.TempDir()
	b := toolBuild{
		moduleDir: mod,
		version:   "v0.0.1",
		outDir:    filepath.Join(cache, "bin", "hello-v0.0.1"),
		programs:  []program{{name: "hello", pkg: "."}},
	}

	var mu sync.Mutex
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&lockedWriter{mu: &mu, w: &logs}, nil))
	var wg sync.WaitGroup
	errs := make([]error, 3)
	for i := range errs {
		wg.Go(func() { errs[i] = b.ensure(context.Background(), log) })
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if n := strings.Count(logs.String(), `msg="building hello`); n != 1 {
		t.Errorf("%d builds, want 1; log:\n%s", n, logs.String())
	}
	out, err := exec.Command(filepath.Join(b.outDir, "hello")).CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "hello" {
		t.Errorf("built binary: %q, %v", out, err)
	}
	entries, _ := os.ReadDir(filepath.Join(cache, "bin"))
	for _, e := range entries {
		if strings.Contains(e.Name(), ".tmp-") {
			t.Errorf("temporary build directory left behind: %s", e.Name())
		}
	}
	if len(b.missing()) != 0 {
		t.Errorf("still missing after build: %v", b.missing())
	}
}

func TestToolBuildFailure(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("no go command")
	}
	mod := t.TempDir()
	writeFile(t, filepath.Join(mod, "go.mod"), "module example.com/broken\n\ngo 1.22\n")
	writeFile(t, filepath.Join(mod, "main.go"), "package main\n\nfunc main() { undefinedThing() }\n")
	b := toolBuild{
		moduleDir: mod,
		version:   "v0.0.1",
		outDir:    filepath.Join(t.TempDir(), "bin", "broken-v0.0.1"),
		programs:  []program{{name: "broken", pkg: "."}},
	}
	err := b.ensure(context.Background(), slog.New(slog.DiscardHandler))
	if err == nil || !strings.Contains(err.Error(), "undefinedThing") {
		t.Fatalf("ensure = %v, want an error quoting the compiler", err)
	}
	if _, err := os.Stat(b.outDir); !os.IsNotExist(err) {
		t.Errorf("output directory exists after a failed build: %v", err)
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	w  *bytes.Buffer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestToolBuildRecipeChange: binaries built with other flags are built again.
func TestToolBuildRecipeChange(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("no go command")
	}
	mod := t.TempDir()
	writeFile(t, filepath.Join(mod, "go.mod"), "module example.com/hello\n\ngo 1.22\n")
	writeFile(t, filepath.Join(mod, "main.go"), "package main\n\nvar greeting = \"hello\"\n\nfunc main() { println(greeting) }\n")
	b := toolBuild{
		moduleDir: mod,
		version:   "v0.0.1",
		outDir:    filepath.Join(t.TempDir(), "bin", "hello-v0.0.1"),
		programs:  []program{{name: "hello", pkg: "."}},
	}
	log := slog.New(slog.DiscardHandler)
	for _, greeting := range []string{"hello", "bonjour"} {
		if greeting != "hello" {
			b.ldflags = "-X main.greeting=" + greeting
		}
		if err := b.ensure(context.Background(), log); err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command(filepath.Join(b.outDir, "hello")).CombinedOutput()
		if err != nil || strings.TrimSpace(string(out)) != greeting {
			t.Errorf("with ldflags %q: %q, %v; want %s", b.ldflags, out, err, greeting)
		}
	}
}

// TestToolBuildSourcesChange: editing a source file of a tools module
// that lists it (tools/coredns's main.go, which picks the plugins) builds
// the program again, although the build command is the same.
func TestToolBuildSourcesChange(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("no go command")
	}
	mod := t.TempDir()
	writeFile(t, filepath.Join(mod, "go.mod"), "module example.com/hello\n\ngo 1.22\n")
	b := toolBuild{
		moduleDir: mod,
		version:   "v0.0.1",
		outDir:    filepath.Join(t.TempDir(), "bin", "hello-v0.0.1"),
		programs:  []program{{name: "hello", pkg: "."}},
		sources:   []string{"main.go"},
	}
	log := slog.New(slog.DiscardHandler)
	for _, greeting := range []string{"hello", "bonjour"} {
		writeFile(t, filepath.Join(mod, "main.go"), "package main\n\nfunc main() { println(\""+greeting+"\") }\n")
		if err := b.ensure(context.Background(), log); err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command(filepath.Join(b.outDir, "hello")).CombinedOutput()
		if err != nil || strings.TrimSpace(string(out)) != greeting {
			t.Errorf("with main.go printing %s: %q, %v", greeting, out, err)
		}
	}
}

func TestKubernetesLdflags(t *testing.T) {
	got := kubernetesLdflags("v1.37.2")
	for _, want := range []string{
		"-X k8s.io/component-base/version.gitVersion=v1.37.2",
		"-X k8s.io/component-base/version.gitMajor=1",
		"-X k8s.io/component-base/version.gitMinor=37",
		"-X k8s.io/client-go/pkg/version.gitVersion=v1.37.2",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("ldflags %q lack %q", got, want)
		}
	}
}

func TestColdBuildNeeded(t *testing.T) {
	cache := t.TempDir()
	t.Setenv("CELLIUM_CACHE_DIR", cache)
	if cold, err := coldBuildNeeded(); err != nil || !cold {
		t.Fatalf("empty cache: cold=%v err=%v", cold, err)
	}
	_, bins, err := planBinaries()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{bins.Etcd, bins.KubeAPIServer, bins.KubeControllerManager} {
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		writeFile(t, p, "") // no recipe: would be rebuilt, but not from scratch
	}
	if cold, err := coldBuildNeeded(); err != nil || cold {
		t.Fatalf("all binaries there: cold=%v err=%v", cold, err)
	}
}
