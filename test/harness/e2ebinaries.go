package harness

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// E2EBinaries are the absolute paths of the programs of Kubernetes' own
// end-to-end suite, built from tools/k8s like the control plane: the suite
// (e2e.test, package k8s.io/kubernetes/test/e2e's test binary) and agnhost,
// the program of the image its pods run (test/e2enetpol packs it).
type E2EBinaries struct {
	E2ETest string
	Agnhost string // static (CGO_ENABLED=0), as upstream builds it

	KubernetesVersion string // e.g. "v1.37.2", from tools/k8s/go.mod
	// AgnhostVersion is test/images/agnhost/VERSION of those sources,
	// stamped into agnhost (main.Version) as its image build does.
	AgnhostVersion string
	// KubernetesSource is the k8s.io/kubernetes module tools/k8s requires,
	// in the module cache: the image names the suite expects
	// (test/utils/image/manifest.go), agnhost's other files.
	KubernetesSource string
}

// EnsureE2EBinaries returns the cached e2e.test and agnhost, building those
// that are missing as [EnsureBinaries] does, into the control plane's
// bin/k8s-<version>/ with recipe files of their own (.recipe-agnhost,
// .recipe-e2e), so that no group invalidates another's cache. Nothing in `make test` calls it:
// only `make e2e-netpol` (and its e2e-binaries target) needs them. Cold, on 2
// busy cores, agnhost took 8.5 minutes and then e2e.test 15.5 more (3.3 GB
// of memory to link).
//
// Errors: as EnsureBinaries.
func EnsureE2EBinaries(ctx context.Context, log *slog.Logger) (E2EBinaries, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	builds, bins, err := planE2EBinaries()
	if err != nil {
		return E2EBinaries{}, err
	}
	for _, b := range builds {
		if err := b.ensure(ctx, log); err != nil {
			return E2EBinaries{}, err
		}
	}
	return bins, nil
}

// CachedE2EBinaries returns the e2e binaries if they are cached (built by
// the current recipe); otherwise missing names those that are not, and
// nothing is built.
//
// Errors: the working directory is not inside the cellium checkout.
func CachedE2EBinaries() (bins E2EBinaries, missing []string, err error) {
	builds, bins, err := planE2EBinaries()
	if err != nil {
		return E2EBinaries{}, nil, err
	}
	for _, b := range builds {
		for _, p := range b.missing() {
			missing = append(missing, p.name)
		}
	}
	return bins, missing, nil
}

// planE2EBinaries works out where the e2e binaries live and how to build
// them. It asks the go command where the Kubernetes sources are (which
// downloads them if they are not in the module cache yet).
func planE2EBinaries() ([]toolBuild, E2EBinaries, error) {
	root, cache, err := repoAndCache()
	if err != nil {
		return nil, E2EBinaries{}, err
	}
	k8sMod := filepath.Join(root, "tools", "k8s")
	k8sVersion, err := requiredVersion(filepath.Join(k8sMod, "go.mod"), "k8s.io/kubernetes")
	if err != nil {
		return nil, E2EBinaries{}, err
	}
	src, err := moduleSourceDir(k8sMod, "k8s.io/kubernetes")
	if err != nil {
		return nil, E2EBinaries{}, err
	}
	v, err := os.ReadFile(filepath.Join(src, "test", "images", "agnhost", "VERSION"))
	if err != nil {
		return nil, E2EBinaries{}, fmt.Errorf("read agnhost's version: %w", err)
	}
	agnhostVersion := strings.TrimSpace(string(v))
	outDir := filepath.Join(cache, "bin", "k8s-"+k8sVersion)
	agnhost := toolBuild{
		moduleDir: k8sMod,
		version:   k8sVersion,
		// As test/images/agnhost/Makefile stamps it.
		ldflags: "-X main.Version=" + agnhostVersion,
		// Static: the image has no C library (upstream builds it so too).
		env:        []string{"CGO_ENABLED=0"},
		outDir:     outDir,
		recipeName: ".recipe-agnhost",
		programs:   []program{{name: "agnhost", pkg: "k8s.io/kubernetes/test/images/agnhost", estimate: 4 * time.Minute}},
	}
	e2e := toolBuild{
		moduleDir: k8sMod,
		version:   k8sVersion,
		ldflags:   kubernetesLdflags(k8sVersion),
		// As agnhost, so that the two share the Go build cache.
		env:        []string{"CGO_ENABLED=0"},
		outDir:     outDir,
		recipeName: ".recipe-e2e",
		programs:   []program{{name: "e2e.test", pkg: "k8s.io/kubernetes/test/e2e", estimate: 15 * time.Minute, test: true}},
	}
	return []toolBuild{agnhost, e2e}, E2EBinaries{
		E2ETest:           filepath.Join(outDir, "e2e.test"),
		Agnhost:           filepath.Join(outDir, "agnhost"),
		KubernetesVersion: k8sVersion,
		AgnhostVersion:    agnhostVersion,
		KubernetesSource:  src,
	}, nil
}

// moduleSourceDir returns the directory of module mod, as required by the
// module in dir, in the module cache.
func moduleSourceDir(dir, mod string) (string, error) {
	cmd := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", mod)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOWORK=off")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("locate the sources of %s: go list -m in %s: %w: %s", mod, dir, err, strings.TrimSpace(stderr.String()))
	}
	d := strings.TrimSpace(string(out))
	if d == "" {
		return "", fmt.Errorf("locate the sources of %s: go list -m in %s gave no directory", mod, dir)
	}
	return d, nil
}

// String names the binaries, for messages.
func (b E2EBinaries) String() string {
	return fmt.Sprintf("e2e.test %s and agnhost %s", b.KubernetesVersion, b.AgnhostVersion)
}
