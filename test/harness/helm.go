package harness

import (
	"context"
	"log/slog"
	"path/filepath"
	"strings"
	"time"
)

// helmModule is the module whose version [EnsureHelm] builds.
const helmModule = "helm.sh/helm/v3"

// EnsureHelm returns the path of the cached helm command, building it from
// the tools/helm module of the repository that contains the working directory
// when it is missing (about 3 minutes cold on 2 cores). Helm is not packaged in
// Debian; the version is the one tools/helm/go.mod requires, and the binary is
// cached in [CacheDir] under bin/helm-<version>/ with the same locking and
// atomic install as [EnsureBinaries]. Progress goes to log; a nil log discards
// it.
//
// Errors: as [EnsureBinaries].
func EnsureHelm(ctx context.Context, log *slog.Logger) (string, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	b, err := planHelm()
	if err != nil {
		return "", err
	}
	if err := b.ensure(ctx, log); err != nil {
		return "", err
	}
	return filepath.Join(b.outDir, "helm"), nil
}

// planHelm works out where helm lives and how to build it.
func planHelm() (toolBuild, error) {
	root, cache, err := repoAndCache()
	if err != nil {
		return toolBuild{}, err
	}
	mod := filepath.Join(root, "tools", "helm")
	version, err := requiredVersion(filepath.Join(mod, "go.mod"), helmModule)
	if err != nil {
		return toolBuild{}, err
	}
	clientGo, err := requiredVersion(filepath.Join(mod, "go.mod"), "k8s.io/client-go")
	if err != nil {
		return toolBuild{}, err
	}
	return toolBuild{
		moduleDir: mod,
		version:   version,
		ldflags:   helmLdflags(version, clientGo),
		outDir:    filepath.Join(cache, "bin", "helm-"+version),
		programs:  []program{{name: "helm", pkg: helmModule + "/cmd/helm", estimate: 3 * time.Minute}},
	}, nil
}

// helmLdflags stamps what Helm's own release build (its Makefile) stamps:
// its version, and the Kubernetes version of its client-go (v0.35.x means
// 1.35) as the default cluster version of `helm template` and `helm lint`.
// Without it, helm assumes Kubernetes 1.20 and refuses a chart's
// kubeVersion constraint.
func helmLdflags(version, clientGo string) string {
	minor := "0"
	if parts := strings.SplitN(strings.TrimPrefix(clientGo, "v"), ".", 3); len(parts) >= 2 {
		minor = parts[1]
	}
	flags := []string{"-X " + helmModule + "/internal/version.version=" + version}
	for _, pkg := range []string{"pkg/lint/rules", "pkg/chartutil"} {
		flags = append(flags,
			"-X "+helmModule+"/"+pkg+".k8sVersionMajor=1",
			"-X "+helmModule+"/"+pkg+".k8sVersionMinor="+minor)
	}
	return strings.Join(flags, " ")
}
