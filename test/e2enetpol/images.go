package e2enetpol

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/cellium/cellium/test/harness"
	"github.com/cellium/cellium/test/ociimage"
)

// manifestFile, in the Kubernetes sources, names the images the e2e suite
// runs.
const manifestFile = "test/utils/image/manifest.go"

var (
	// configs[Agnhost] = Config{list.PromoterE2eRegistry, "agnhost", "2.66.1"}
	agnhostLine = regexp.MustCompile(`configs\[Agnhost\]\s*=\s*Config\{list\.PromoterE2eRegistry,\s*"agnhost",\s*"([^"]+)"\}`)
	// PromoterE2eRegistry:      "registry.k8s.io/e2e-test-images",
	promoterLine = regexp.MustCompile(`PromoterE2eRegistry:\s*"([^"]+)"`)
)

// agnhostImageName reads the name of the agnhost image the suite's pods
// run (without KUBE_TEST_REPO_LIST) from the source of manifest.go, e.g.
// "registry.k8s.io/e2e-test-images/agnhost:2.66.1".
//
// Errors: the source does not name it as v1.37 does.
func agnhostImageName(manifest []byte) (string, error) {
	m := agnhostLine.FindSubmatch(manifest)
	if m == nil {
		return "", fmt.Errorf("%s: no configs[Agnhost] line", manifestFile)
	}
	r := promoterLine.FindSubmatch(manifest)
	if r == nil {
		return "", fmt.Errorf("%s: no PromoterE2eRegistry default", manifestFile)
	}
	return string(r[1]) + "/agnhost:" + string(m[1]), nil
}

// AgnhostImage packs bins.Agnhost as the agnhost image the suite expects
// (its name from the sources' manifest.go) into the OCI archive
// dir/agnhost.tar, and returns the archive's path and the image's name.
// Like the upstream image it has /agnhost as its entrypoint with "pause"
// as its command, and porter's TLS certificate and key in / (its working
// directory); it has no shell and none of the upstream image's Alpine
// tools (dig, curl, nc, iperf), which the Netpol specs do not use: they run
// `/agnhost porter` and probe with `/agnhost connect`.
//
// Errors: the sources are not found; packing fails.
func AgnhostImage(ctx context.Context, dir string, bins harness.E2EBinaries) (archive, name string, err error) {
	src := bins.KubernetesSource
	manifest, err := os.ReadFile(filepath.Join(src, manifestFile))
	if err != nil {
		return "", "", fmt.Errorf("agnhost image: %w", err)
	}
	if name, err = agnhostImageName(manifest); err != nil {
		return "", "", fmt.Errorf("agnhost image: %w", err)
	}
	porter := filepath.Join(src, "test", "images", "agnhost", "porter")
	img := ociimage.Image{
		Name:       name,
		Entrypoint: []string{"/agnhost"},
		Cmd:        []string{"pause"},
		Files: []ociimage.File{
			{Path: "/agnhost", Source: bins.Agnhost},
			{Path: "/localhost.crt", Source: filepath.Join(porter, "localhost.crt"), Mode: 0o644},
			{Path: "/localhost.key", Source: filepath.Join(porter, "localhost.key"), Mode: 0o644},
		},
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", "", fmt.Errorf("agnhost image: %w", err)
	}
	archive = filepath.Join(dir, "agnhost.tar")
	if _, err := ociimage.WriteFile(archive, img); err != nil {
		return "", "", fmt.Errorf("agnhost image: %w", err)
	}
	return archive, name, nil
}

// ImportImages loads OCI archives into the containerd at socket, in the
// CRI's namespace (k8s.io) where the kubelet finds them, with ctr; the
// images keep the names their archives give them. Call it wherever a node's
// containerd runs (test/realnode's Options.Images does the same at start).
//
// Errors: ctr fails (its standard error is in the error).
func ImportImages(ctx context.Context, ctr, socket string, archives ...string) error {
	for _, a := range archives {
		cmd := exec.CommandContext(ctx, ctr, "--address", socket, "--namespace", "k8s.io", "images", "import", "--local", a)
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("import %s into %s: ctr: %w: %s", a, socket, err, strings.TrimSpace(string(out)))
		}
	}
	return nil
}
