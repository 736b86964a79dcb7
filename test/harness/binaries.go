package harness

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"
)

// ModulePath is the module path of the cellium repository; [RepoRoot] looks for
// the go.mod that declares it.
const ModulePath = "github.com/cellium/cellium"

// Binaries are the absolute paths of the control-plane programs and the versions
// they were built from.
type Binaries struct {
	Etcd                  string
	KubeAPIServer         string
	KubeControllerManager string

	EtcdVersion       string // e.g. "v3.6.16", from tools/etcd/go.mod
	KubernetesVersion string // e.g. "v1.37.2", from tools/k8s/go.mod
}

// EnsureBinaries returns the cached etcd, kube-apiserver and
// kube-controller-manager binaries, building those that are missing from the
// tools modules of the repository that contains the working directory.
//
// Binaries live in [CacheDir] under bin/<component>-<version>/, so a version bump
// in tools/*/go.mod builds afresh. A build goes to a temporary directory beside
// its destination and is renamed into place, so a cached binary is always
// complete; a file lock per version makes concurrent callers (parallel test
// packages) wait for one build instead of running their own. Progress goes to
// log; a nil log discards it.
//
// Errors: the working directory is not inside the cellium checkout, the go
// command is missing, a build fails (the error carries the tail of its output),
// or ctx ends while building or waiting for another builder.
func EnsureBinaries(ctx context.Context, log *slog.Logger) (Binaries, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	builds, bins, err := planBinaries()
	if err != nil {
		return Binaries{}, err
	}
	for _, b := range builds {
		if err := b.ensure(ctx, log); err != nil {
			return Binaries{}, err
		}
	}
	return bins, nil
}

// coldBuildNeeded reports whether [EnsureBinaries] would have to build a
// binary that is not in the cache at all (a rebuild after a recipe change is
// mostly linking and does not count).
func coldBuildNeeded() (bool, error) {
	builds, _, err := planBinaries()
	if err != nil {
		return false, err
	}
	for _, b := range builds {
		for _, p := range b.programs {
			if _, err := os.Stat(filepath.Join(b.outDir, p.name)); err != nil {
				return true, nil
			}
		}
	}
	return false, nil
}

// planBinaries works out where each binary lives and how to build it.
func planBinaries() ([]toolBuild, Binaries, error) {
	root, cache, err := repoAndCache()
	if err != nil {
		return nil, Binaries{}, err
	}
	k8sMod := filepath.Join(root, "tools", "k8s")
	k8sVersion, err := requiredVersion(filepath.Join(k8sMod, "go.mod"), "k8s.io/kubernetes")
	if err != nil {
		return nil, Binaries{}, err
	}
	etcdMod := filepath.Join(root, "tools", "etcd")
	etcdVersion, err := requiredVersion(filepath.Join(etcdMod, "go.mod"), "go.etcd.io/etcd/server/v3")
	if err != nil {
		return nil, Binaries{}, err
	}
	k8s := toolBuild{
		moduleDir: k8sMod,
		version:   k8sVersion,
		ldflags:   kubernetesLdflags(k8sVersion),
		outDir:    filepath.Join(cache, "bin", "k8s-"+k8sVersion),
		programs: []program{
			{name: "kube-apiserver", pkg: "k8s.io/kubernetes/cmd/kube-apiserver", estimate: 10 * time.Minute},
			{name: "kube-controller-manager", pkg: "k8s.io/kubernetes/cmd/kube-controller-manager", estimate: 3 * time.Minute},
		},
	}
	etcd := toolBuild{
		moduleDir: etcdMod,
		version:   etcdVersion,
		outDir:    filepath.Join(cache, "bin", "etcd-"+etcdVersion),
		programs:  []program{{name: "etcd", pkg: ".", estimate: 2 * time.Minute}},
	}
	bins := Binaries{
		Etcd:                  filepath.Join(etcd.outDir, "etcd"),
		KubeAPIServer:         filepath.Join(k8s.outDir, "kube-apiserver"),
		KubeControllerManager: filepath.Join(k8s.outDir, "kube-controller-manager"),
		EtcdVersion:           etcdVersion,
		KubernetesVersion:     k8sVersion,
	}
	return []toolBuild{etcd, k8s}, bins, nil
}

// repoAndCache returns the root of the checkout that contains the working
// directory and the cache directory.
func repoAndCache() (root, cache string, err error) {
	wd, err := os.Getwd()
	if err != nil {
		return "", "", fmt.Errorf("locate binaries: %w", err)
	}
	if root, err = RepoRoot(wd); err != nil {
		return "", "", err
	}
	if cache, err = CacheDir(); err != nil {
		return "", "", err
	}
	return root, cache, nil
}

// kubernetesLdflags stamps the version into the Kubernetes binaries, as
// Kubernetes' own build does (hack/lib/version.sh); without it the API server
// reports v0.0.0-master to clients that check the server version.
func kubernetesLdflags(version string) string {
	var major, minor string
	if parts := strings.SplitN(strings.TrimPrefix(version, "v"), ".", 3); len(parts) >= 2 {
		major, minor = parts[0], parts[1]
	}
	var flags []string
	for _, pkg := range []string{"k8s.io/component-base/version", "k8s.io/client-go/pkg/version"} {
		flags = append(flags,
			"-X "+pkg+".gitVersion="+version,
			"-X "+pkg+".gitMajor="+major,
			"-X "+pkg+".gitMinor="+minor,
			"-X "+pkg+".gitTreeState=clean",
		)
	}
	return strings.Join(flags, " ")
}

// RepoRoot returns the root of the cellium checkout that contains dir: the
// closest ancestor (or dir itself) whose go.mod declares [ModulePath]. The
// go.mod files of nested modules (tools/k8s, ...) are passed over.
func RepoRoot(dir string) (string, error) {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return "", fmt.Errorf("find repository root: %w", err)
	}
	for d := dir; ; d = filepath.Dir(d) {
		mod, err := modulePathOf(filepath.Join(d, "go.mod"))
		if err == nil && mod == ModulePath {
			return d, nil
		}
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return "", fmt.Errorf("find repository root: %w", err)
		}
		if filepath.Dir(d) == d {
			return "", fmt.Errorf("find repository root: no go.mod of module %s in %s or above it; run from inside the cellium checkout", ModulePath, dir)
		}
	}
}

// CacheDir returns the directory the harness caches binaries in:
// $CELLIUM_CACHE_DIR if set, else $XDG_CACHE_HOME/cellium, else
// ~/.cache/cellium.
func CacheDir() (string, error) {
	if d := os.Getenv("CELLIUM_CACHE_DIR"); d != "" {
		return filepath.Abs(d)
	}
	d, err := os.UserCacheDir() // $XDG_CACHE_HOME or ~/.cache on Linux
	if err != nil {
		return "", fmt.Errorf("find cache directory (set CELLIUM_CACHE_DIR): %w", err)
	}
	return filepath.Join(d, "cellium"), nil
}

// modulePathOf returns the module path declared by a go.mod file.
func modulePathOf(gomod string) (string, error) {
	data, err := os.ReadFile(gomod)
	if err != nil {
		return "", err
	}
	for line := range strings.Lines(string(data)) {
		f := strings.Fields(stripComment(line))
		if len(f) == 2 && f[0] == "module" {
			return strings.Trim(f[1], `"`), nil
		}
	}
	return "", fmt.Errorf("%s: no module line", gomod)
}

// requiredVersion returns the version of module mod required by a go.mod file,
// from a single-line require or a require block.
func requiredVersion(gomod, mod string) (string, error) {
	data, err := os.ReadFile(gomod)
	if err != nil {
		return "", fmt.Errorf("read tool versions: %w", err)
	}
	inRequire := false
	for line := range strings.Lines(string(data)) {
		f := strings.Fields(stripComment(line))
		switch {
		case len(f) == 0:
		case inRequire && f[0] == ")":
			inRequire = false
		case !inRequire && len(f) == 2 && f[0] == "require" && f[1] == "(":
			inRequire = true
		case inRequire && len(f) == 2 && f[0] == mod:
			return f[1], nil
		case !inRequire && len(f) == 3 && f[0] == "require" && f[1] == mod:
			return f[2], nil
		}
	}
	return "", fmt.Errorf("read tool versions: %s does not require %s", gomod, mod)
}

func stripComment(line string) string {
	if i := strings.Index(line, "//"); i >= 0 {
		return line[:i]
	}
	return line
}

// program is one main package of a tools module.
type program struct {
	name     string        // binary name
	pkg      string        // package to build, relative to the module directory
	estimate time.Duration // rough cold build time on 2 cores, for the progress message
	// test builds the package's test binary (go test -c) instead of its
	// command: the Kubernetes e2e suite is a test binary.
	test bool
}

// toolBuild builds programs of one tools module into a directory keyed by
// version.
type toolBuild struct {
	moduleDir string
	version   string
	ldflags   string   // passed to go build -ldflags
	tags      string   // passed to go build -tags; empty for none
	env       []string // KEY=VALUE added to the build's environment (CGO_ENABLED=0)
	outDir    string
	programs  []program
	// recipeName is the recipe file in outDir; empty means recipeFile.
	// Builds that share an outDir (the control plane and the node's
	// Kubernetes binaries) each keep their own, so that adding one group
	// never rebuilds the other.
	recipeName string
	// sources are files of the tools module (its own main.go) whose
	// content goes into the recipe as a hash: editing them builds again,
	// as a new build flag does. Empty for modules that only pin versions.
	sources []string
}

// recipeFile, in a toolBuild's outDir, records how its binaries were built;
// when the recipe changes (new build flags), they are built again.
const recipeFile = ".recipe"

func (b toolBuild) recipePath() string {
	if b.recipeName != "" {
		return filepath.Join(b.outDir, b.recipeName)
	}
	return filepath.Join(b.outDir, recipeFile)
}

func (b toolBuild) recipe() string {
	var pkgs, tests []string
	for _, p := range b.programs {
		if p.test {
			tests = append(tests, p.pkg)
		} else {
			pkgs = append(pkgs, p.pkg)
		}
	}
	// The control plane's recipe predates tags, env and test binaries: it
	// stays as it was written, so that its cached binaries stay valid.
	var extra string
	if len(b.env) > 0 {
		extra += strings.Join(b.env, " ") + " "
	}
	var lines []string
	if len(pkgs) > 0 {
		if b.tags != "" {
			lines = append(lines, fmt.Sprintf("%sgo build -trimpath -tags=%q -ldflags=%q %s\n", extra, b.tags, b.ldflags, strings.Join(pkgs, " ")))
		} else {
			lines = append(lines, fmt.Sprintf("%sgo build -trimpath -ldflags=%q %s\n", extra, b.ldflags, strings.Join(pkgs, " ")))
		}
	}
	for _, pkg := range tests {
		if b.tags != "" {
			lines = append(lines, fmt.Sprintf("%sgo test -c -vet=off -trimpath -tags=%q -ldflags=%q %s\n", extra, b.tags, b.ldflags, pkg))
		} else {
			lines = append(lines, fmt.Sprintf("%sgo test -c -vet=off -trimpath -ldflags=%q %s\n", extra, b.ldflags, pkg))
		}
	}
	if h := b.sourcesHash(); h != "" {
		lines = append(lines, "# sources "+h+"\n")
	}
	return strings.Join(lines, "")
}

// sourcesHash is the SHA-256 of b.sources' names and contents (a file that
// cannot be read counts as its error), or empty without sources.
func (b toolBuild) sourcesHash() string {
	if len(b.sources) == 0 {
		return ""
	}
	h := sha256.New()
	for _, f := range b.sources {
		data, err := os.ReadFile(filepath.Join(b.moduleDir, f))
		if err != nil {
			data = []byte(err.Error())
		}
		fmt.Fprintf(h, "%s %d\n", f, len(data))
		h.Write(data)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// missing returns the programs to build: those not in outDir, or all of them
// if they were built by another recipe.
func (b toolBuild) missing() []program {
	if got, err := os.ReadFile(b.recipePath()); err != nil || string(got) != b.recipe() {
		return b.programs
	}
	var out []program
	for _, p := range b.programs {
		if fi, err := os.Stat(filepath.Join(b.outDir, p.name)); err != nil || !fi.Mode().IsRegular() {
			out = append(out, p)
		}
	}
	return out
}

// anyBuilt reports whether any of the programs is in outDir.
func (b toolBuild) anyBuilt() bool {
	for _, p := range b.programs {
		if _, err := os.Stat(filepath.Join(b.outDir, p.name)); err == nil {
			return true
		}
	}
	return false
}

// ensure builds the missing programs, under the version's file lock.
func (b toolBuild) ensure(ctx context.Context, log *slog.Logger) error {
	if len(b.missing()) == 0 {
		return nil
	}
	parent := filepath.Dir(b.outDir)
	key := filepath.Base(b.outDir)
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return fmt.Errorf("build %s: %w", key, err)
	}
	unlock, err := lockFile(ctx, filepath.Join(parent, "."+key+".lock"), func() {
		log.Info(fmt.Sprintf("waiting for another process that is building %s into %s...", key, b.outDir))
	})
	if err != nil {
		return fmt.Errorf("build %s: %w", key, err)
	}
	defer unlock()

	missing := b.missing() // another process may have built them while we waited
	if len(missing) == 0 {
		return nil
	}
	goCmd, err := exec.LookPath("go")
	if err != nil {
		return fmt.Errorf("build %s: the go command is needed to build the test binaries: %w", key, err)
	}
	tmp, err := os.MkdirTemp(parent, "."+key+".tmp-")
	if err != nil {
		return fmt.Errorf("build %s: %w", key, err)
	}
	defer os.RemoveAll(tmp)

	var names []string
	var estimate time.Duration
	for _, p := range missing {
		names = append(names, p.name)
		estimate += p.estimate
	}
	what := fmt.Sprintf("%s %s", strings.Join(names, ", "), b.version)
	if b.anyBuilt() {
		log.Info(fmt.Sprintf("building %s again: the build recipe changed (with a warm Go build cache this is mostly linking)...", what),
			"module", b.moduleDir, "into", b.outDir)
	} else {
		log.Info(fmt.Sprintf("building %s (first time, ~%s)...", what, estimate.Round(time.Minute)), "module", b.moduleDir, "into", b.outDir)
	}

	start := time.Now()
	progress := func() {
		log.Info(fmt.Sprintf("still building %s (%s elapsed)...", what, time.Since(start).Round(time.Second)))
	}
	// One go build for the commands, one go test -c per test binary.
	var pkgs []string
	var tests []program
	for _, p := range missing {
		if p.test {
			tests = append(tests, p)
		} else {
			pkgs = append(pkgs, p.pkg)
		}
	}
	if len(pkgs) > 0 {
		if out, err := runGoBuild(ctx, goCmd, b, b.buildArgs(tmp+string(filepath.Separator), pkgs), progress); err != nil {
			return fmt.Errorf("build %s in %s: %w\n%s", what, b.moduleDir, err, tailLines(out, 30))
		}
	}
	for _, p := range tests {
		if out, err := runGoBuild(ctx, goCmd, b, b.testArgs(filepath.Join(tmp, p.name), p.pkg), progress); err != nil {
			return fmt.Errorf("build %s in %s: %w\n%s", what, b.moduleDir, err, tailLines(out, 30))
		}
	}
	if err := os.MkdirAll(b.outDir, 0o755); err != nil {
		return fmt.Errorf("build %s: %w", what, err)
	}
	for _, p := range missing {
		if err := os.Rename(filepath.Join(tmp, p.name), filepath.Join(b.outDir, p.name)); err != nil {
			return fmt.Errorf("build %s: install: %w", what, err)
		}
	}
	if err := writeFileAtomic(b.recipePath(), []byte(b.recipe())); err != nil {
		return fmt.Errorf("build %s: install: %w", what, err)
	}
	log.Info(fmt.Sprintf("built %s in %s", what, time.Since(start).Round(time.Second)))
	return nil
}

// buildArgs are the go command's arguments that build pkgs into out (a
// directory, with a trailing separator): `build -trimpath [-tags=...]
// -ldflags=... -o out pkgs...`.
func (b toolBuild) buildArgs(out string, pkgs []string) []string {
	args := []string{"build", "-trimpath"}
	if b.tags != "" {
		args = append(args, "-tags="+b.tags)
	}
	args = append(args, "-ldflags="+b.ldflags, "-o", out)
	return append(args, pkgs...)
}

// testArgs are the go command's arguments that build pkg's test binary
// into the file out: `test -c -vet=off -trimpath [-tags=...] -ldflags=... -o out pkg`.
func (b toolBuild) testArgs(out, pkg string) []string {
	// No vet: the suite is not ours to check, and vetting its thousands of
	// packages takes minutes.
	args := []string{"test", "-c", "-vet=off", "-trimpath"}
	if b.tags != "" {
		args = append(args, "-tags="+b.tags)
	}
	return append(args, "-ldflags="+b.ldflags, "-o", out, pkg)
}

// runGoBuild runs the go command with args (buildArgs, testArgs) in b's
// module directory, with b's environment, and returns its combined output.
// progress is called every minute.
func runGoBuild(ctx context.Context, goCmd string, b toolBuild, args []string, progress func()) ([]byte, error) {
	cmd := exec.CommandContext(ctx, goCmd, args...)
	cmd.Dir = b.moduleDir
	// The tools modules are not part of any workspace.
	cmd.Env = append(append(os.Environ(), "GOWORK=off"), b.env...)
	var out bytes.Buffer
	cmd.Stdout = &out
	cmd.Stderr = &out
	// If the test binary dies (go test's -timeout), take the build with it. The
	// parent-death signal follows the thread that forked, so hold on to it.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	tick := time.NewTicker(time.Minute)
	defer tick.Stop()
	for {
		select {
		case err := <-done:
			return out.Bytes(), err
		case <-tick.C:
			progress()
		}
	}
}

// lockFile takes an exclusive flock on path, polling so that ctx can end the
// wait; waiting is called once if the lock is busy. The returned func releases
// it.
func lockFile(ctx context.Context, path string, waiting func()) (func(), error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("lock: %w", err)
	}
	fd := int(f.Fd())
	told := false
	for {
		err := syscall.Flock(fd, syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return func() {
				_ = syscall.Flock(fd, syscall.LOCK_UN)
				_ = f.Close()
			}, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) && !errors.Is(err, syscall.EINTR) {
			_ = f.Close()
			return nil, fmt.Errorf("lock %s: %w", path, err)
		}
		if !told {
			told = true
			waiting()
		}
		select {
		case <-ctx.Done():
			_ = f.Close()
			return nil, fmt.Errorf("lock %s: %w", path, context.Cause(ctx))
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// tailLines returns the last n lines of b.
func tailLines(b []byte, n int) string {
	var lines []string
	s := bufio.NewScanner(bytes.NewReader(b))
	s.Buffer(make([]byte, 64*1024), 1024*1024)
	for s.Scan() {
		lines = append(lines, s.Text())
		if len(lines) > n {
			lines = lines[1:]
		}
	}
	return strings.Join(lines, "\n")
}
