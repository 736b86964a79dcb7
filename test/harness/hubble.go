package harness

import (
	"context"
	"log/slog"
	"path/filepath"
	"strings"
	"time"
)

// ciliumModule is the module whose hubble and hubble-relay [EnsureHubble]
// builds.
const ciliumModule = "github.com/cilium/cilium"

// HubbleBinaries are the paths of the upstream Hubble commands.
type HubbleBinaries struct {
	// Hubble is the hubble CLI.
	Hubble string
	// Relay is hubble-relay.
	Relay string
	// Version is the github.com/cilium/cilium version they were built from.
	Version string
}

// EnsureHubble returns the cached upstream hubble CLI and hubble-relay,
// building them from the tools/hubble module of the repository that
// contains the working directory when they are missing (about 10 minutes
// cold on 2 cores). They are cellium's Hubble API test clients; the
// version is the github.com/cilium/cilium that tools/hubble/go.mod
// requires, and the binaries are cached in [CacheDir] under
// bin/hubble-<version>/ with the same locking and atomic install as
// [EnsureBinaries]. Progress goes to log; a nil log discards it.
//
// Errors: as [EnsureBinaries].
func EnsureHubble(ctx context.Context, log *slog.Logger) (HubbleBinaries, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	b, err := planHubble()
	if err != nil {
		return HubbleBinaries{}, err
	}
	if err := b.ensure(ctx, log); err != nil {
		return HubbleBinaries{}, err
	}
	return hubbleBinaries(b), nil
}

// CachedHubble returns the cached Hubble commands and whether they are
// there (built by the current recipe); nothing is built.
func CachedHubble() (HubbleBinaries, bool) {
	b, err := planHubble()
	if err != nil {
		return HubbleBinaries{}, false
	}
	return hubbleBinaries(b), len(b.missing()) == 0
}

func hubbleBinaries(b toolBuild) HubbleBinaries {
	return HubbleBinaries{
		Hubble:  filepath.Join(b.outDir, "hubble"),
		Relay:   filepath.Join(b.outDir, "hubble-relay"),
		Version: b.version,
	}
}

// planHubble works out where the Hubble commands live and how to build
// them.
func planHubble() (toolBuild, error) {
	root, cache, err := repoAndCache()
	if err != nil {
		return toolBuild{}, err
	}
	mod := filepath.Join(root, "tools", "hubble")
	version, err := requiredVersion(filepath.Join(mod, "go.mod"), ciliumModule)
	if err != nil {
		return toolBuild{}, err
	}
	return toolBuild{
		moduleDir: mod,
		version:   version,
		ldflags:   hubbleLdflags(version),
		env:       []string{"CGO_ENABLED=0"},
		outDir:    filepath.Join(cache, "bin", "hubble-"+version),
		programs: []program{
			{name: "hubble", pkg: ciliumModule + "/hubble", estimate: 6 * time.Minute},
			{name: "hubble-relay", pkg: ciliumModule + "/hubble-relay", estimate: 4 * time.Minute},
		},
	}, nil
}

// hubbleLdflags stamps the versions Cilium's release build stamps: the
// CLI's own (hubble version, the client version it reports) and
// Cilium's, which hubble-relay reports as its server version.
func hubbleLdflags(version string) string {
	return "-X " + ciliumModule + "/hubble/pkg.Version=" + version +
		" -X " + ciliumModule + "/pkg/version.ciliumVersion=" + strings.TrimPrefix(version, "v")
}
