package harness

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"
)

// ReferenceCNIPlugins are the plugins of containernetworking/plugins that
// `devkubelet bench` runs beside cellium-cni for comparison.
var ReferenceCNIPlugins = []string{"ptp", "host-local"}

// EnsureReferenceCNIPlugins returns the directory holding the reference
// CNI plugins (ptp, host-local) and their version, building them with
// `go build` from the version pinned in tools/cniplugins/go.mod into
// [CacheDir] under bin/cni-plugins-<version>/ when they are missing, as
// [EnsureBinaries] does for the Kubernetes binaries.
//
// Errors: the working directory is not inside the cellium checkout, the go
// command is missing, the build fails, or ctx ends.
func EnsureReferenceCNIPlugins(ctx context.Context, log *slog.Logger) (dir, version string, err error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	wd, err := os.Getwd()
	if err != nil {
		return "", "", fmt.Errorf("locate reference CNI plugins: %w", err)
	}
	root, err := RepoRoot(wd)
	if err != nil {
		return "", "", err
	}
	cache, err := CacheDir()
	if err != nil {
		return "", "", err
	}
	mod := filepath.Join(root, "tools", "cniplugins")
	version, err = requiredVersion(filepath.Join(mod, "go.mod"), "github.com/containernetworking/plugins")
	if err != nil {
		return "", "", err
	}
	b := toolBuild{
		moduleDir: mod,
		version:   version,
		outDir:    filepath.Join(cache, "bin", "cni-plugins-"+version),
		programs: []program{
			{name: "ptp", pkg: "github.com/containernetworking/plugins/plugins/main/ptp", estimate: time.Minute},
			{name: "host-local", pkg: "github.com/containernetworking/plugins/plugins/ipam/host-local", estimate: time.Minute},
		},
	}
	if err := b.ensure(ctx, log); err != nil {
		return "", "", err
	}
	return b.outDir, version, nil
}

// ImageCNIPlugins are the plugins of containernetworking/plugins that
// cellium's image carries (in /usr/lib/cni) and its install-cni-plugin init
// container copies beside cellium-cni: portmap, chained after cellium-cni
// with --cni-chaining-mode=portmap for the pods' hostPorts.
var ImageCNIPlugins = []string{"portmap"}

// EnsureImageCNIPlugins returns the directory holding [ImageCNIPlugins],
// built static (CGO_ENABLED=0: the image has no C library) from the version
// pinned in tools/cniplugins/go.mod into [CacheDir] under
// bin/cni-plugins-<version>-static/ when they are missing.
//
// Errors: as [EnsureReferenceCNIPlugins].
func EnsureImageCNIPlugins(ctx context.Context, log *slog.Logger) (dir string, err error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	root, cache, err := repoAndCache()
	if err != nil {
		return "", err
	}
	mod := filepath.Join(root, "tools", "cniplugins")
	version, err := requiredVersion(filepath.Join(mod, "go.mod"), "github.com/containernetworking/plugins")
	if err != nil {
		return "", err
	}
	b := toolBuild{
		moduleDir: mod,
		version:   version,
		env:       []string{"CGO_ENABLED=0"},
		outDir:    filepath.Join(cache, "bin", "cni-plugins-"+version+"-static"),
		programs: []program{
			{name: "portmap", pkg: "github.com/containernetworking/plugins/plugins/meta/portmap", estimate: time.Minute},
		},
	}
	if err := b.ensure(ctx, log); err != nil {
		return "", err
	}
	return b.outDir, nil
}
