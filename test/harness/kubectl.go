package harness

import (
	"context"
	"log/slog"
	"path/filepath"
	"time"
)

// EnsureKubectl returns the path of the cached kubectl, building it from
// the tools/k8s module (k8s.io/kubernetes/cmd/kubectl, the version of the
// cluster's binaries) when it is missing (a few minutes cold; the build
// cache is shared with the other Kubernetes binaries). It lives in
// bin/k8s-<version>/ beside them with a recipe file of its own
// (.recipe-kubectl), so building it rebuilds nothing else. make up uses it
// when no kubectl is on $PATH. Progress goes to log; a nil log discards it.
//
// Errors: as [EnsureBinaries].
func EnsureKubectl(ctx context.Context, log *slog.Logger) (string, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	b, err := planKubectl()
	if err != nil {
		return "", err
	}
	if err := b.ensure(ctx, log); err != nil {
		return "", err
	}
	return filepath.Join(b.outDir, "kubectl"), nil
}

// planKubectl works out where kubectl lives and how to build it.
func planKubectl() (toolBuild, error) {
	root, cache, err := repoAndCache()
	if err != nil {
		return toolBuild{}, err
	}
	mod := filepath.Join(root, "tools", "k8s")
	version, err := requiredVersion(filepath.Join(mod, "go.mod"), "k8s.io/kubernetes")
	if err != nil {
		return toolBuild{}, err
	}
	return toolBuild{
		moduleDir:  mod,
		version:    version,
		ldflags:    kubernetesLdflags(version),
		outDir:     filepath.Join(cache, "bin", "k8s-"+version),
		recipeName: ".recipe-kubectl",
		programs:   []program{{name: "kubectl", pkg: "k8s.io/kubernetes/cmd/kubectl", estimate: 3 * time.Minute}},
	}, nil
}

// CachedKubectl returns the path of the cached kubectl and whether it is
// there (built by the current recipe); nothing is built.
func CachedKubectl() (string, bool) {
	b, err := planKubectl()
	if err != nil {
		return "", false
	}
	return filepath.Join(b.outDir, "kubectl"), len(b.missing()) == 0
}
