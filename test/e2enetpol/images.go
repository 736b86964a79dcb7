package e2enetpol

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"github.com/cellium/cellium/test/harness"
	"github.com/cellium/cellium/test/ociimage"
)

// manifestFile, in the Kubernetes sources, names the images the e2e suite
// runs.
const manifestFile = "test/utils/image/manifest.go"

// promoterLine is the registry of the e2e test images:
// PromoterE2eRegistry:      "registry.k8s.io/e2e-test-images",
var promoterLine = regexp.MustCompile(`PromoterE2eRegistry:\s*"([^"]+)"`)

// imageName reads the name of an e2e test image (id as manifest.go calls
// it, e.g. "Agnhost"; name its repository, e.g. "agnhost") that the
// suite's pods run (without KUBE_TEST_REPO_LIST) from the source of
// manifest.go, e.g. "registry.k8s.io/e2e-test-images/agnhost:2.66.1".
//
// Errors: the source does not name it as v1.37 does.
func imageName(manifest []byte, id, name string) (string, error) {
	// configs[Agnhost] = Config{list.PromoterE2eRegistry, "agnhost", "2.66.1"}
	line := regexp.MustCompile(`configs\[` + regexp.QuoteMeta(id) + `\]\s*=\s*Config\{list\.PromoterE2eRegistry,\s*"` + regexp.QuoteMeta(name) + `",\s*"([^"]+)"\}`)
	m := line.FindSubmatch(manifest)
	if m == nil {
		return "", fmt.Errorf("%s: no configs[%s] line", manifestFile, id)
	}
	r := promoterLine.FindSubmatch(manifest)
	if r == nil {
		return "", fmt.Errorf("%s: no PromoterE2eRegistry default", manifestFile)
	}
	return string(r[1]) + "/" + name + ":" + string(m[1]), nil
}

// agnhostImageName is imageName of the agnhost image.
func agnhostImageName(manifest []byte) (string, error) {
	return imageName(manifest, "Agnhost", "agnhost")
}

// PackedImage is an image packed into an OCI archive.
type PackedImage struct {
	// Archive is the archive's path.
	Archive string
	// Name is the image's name, as the suite's pods ask for it.
	Name string
}

// AgnhostImage packs bins.Agnhost as the agnhost image the suite expects
// (its name from the sources' manifest.go) into the OCI archive
// dir/agnhost.tar, and returns the archive's path and the image's name.
// Like the upstream image it has /agnhost as its entrypoint with "pause"
// as its command, and porter's TLS certificate and key in / (its working
// directory); it has no shell and none of the upstream image's Alpine
// tools (dig, curl, nc, iperf), which the Netpol specs do not use: they run
// `/agnhost porter` and probe with `/agnhost connect`. [Images] packs it
// with the tools for the conformance specs.
//
// Errors: the sources are not found; packing fails.
func AgnhostImage(ctx context.Context, dir string, bins harness.E2EBinaries) (archive, name string, err error) {
	imgs, err := Images(ctx, Netpol, dir, bins)
	if err != nil {
		return "", "", err
	}
	return imgs[0].Archive, imgs[0].Name, nil
}

// Images packs the images suite's pods run (besides the pause image,
// which the node has) into OCI archives in dir, under the names the
// sources' manifest.go gives them:
//
//   - Netpol: agnhost alone (see [AgnhostImage]).
//   - Conformance and Services: agnhost with [ConformanceTools] (a shell, nc, curl,
//     dig, getent, wget, coreutils: what the specs exec in it);
//     glibc-dns-testing (the DNS specs' glibc prober: the same tools,
//     which are glibc programs of this Debian machine, as upstream's
//     Debian-based image has); nginx (the Endpoints and EndpointSlice
//     specs' backends, which only need to run and declare ports:
//     `/agnhost netexec --http-port=80`, serving HTTP on nginx's port).
//
// Errors: the sources are not found; a tool is not installed (`make deps`
// installs them); packing fails.
func Images(ctx context.Context, suite Suite, dir string, bins harness.E2EBinaries) ([]PackedImage, error) {
	src := bins.KubernetesSource
	manifest, err := os.ReadFile(filepath.Join(src, manifestFile))
	if err != nil {
		return nil, fmt.Errorf("e2e images: %w", err)
	}
	agnhostName, err := agnhostImageName(manifest)
	if err != nil {
		return nil, fmt.Errorf("e2e images: %w", err)
	}
	porter := filepath.Join(src, "test", "images", "agnhost", "porter")
	agnhostFiles := []ociimage.File{
		{Path: "/agnhost", Source: bins.Agnhost},
		{Path: "/localhost.crt", Source: filepath.Join(porter, "localhost.crt"), Mode: 0o644},
		{Path: "/localhost.key", Source: filepath.Join(porter, "localhost.key"), Mode: 0o644},
	}
	imgs := []ociimage.Image{{
		Name:       agnhostName,
		Entrypoint: []string{"/agnhost"},
		Cmd:        []string{"pause"},
		Files:      agnhostFiles,
	}}
	if suite.Name == Conformance.Name || suite.Name == Services.Name {
		tools, err := ToolFiles(ctx, ConformanceTools)
		if err != nil {
			return nil, fmt.Errorf("e2e images: %w", err)
		}
		glibcName, err := imageName(manifest, "GlibcDnsTesting", "glibc-dns-testing")
		if err != nil {
			return nil, fmt.Errorf("e2e images: %w", err)
		}
		nginxName, err := imageName(manifest, "Nginx", "nginx")
		if err != nil {
			return nil, fmt.Errorf("e2e images: %w", err)
		}
		withTools := append(slices.Clone(agnhostFiles), tools...)
		imgs[0].Files = withTools
		imgs = append(imgs, ociimage.Image{
			Name:  glibcName,
			Cmd:   []string{"/bin/sh"},
			Files: tools,
		}, ociimage.Image{
			Name:       nginxName,
			Entrypoint: []string{"/agnhost"},
			Cmd:        []string{"netexec", "--http-port=80"},
			Files:      withTools,
		})
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("e2e images: %w", err)
	}
	var out []PackedImage
	for _, img := range imgs {
		repo := img.Name[strings.LastIndex(img.Name, "/")+1:]
		repo, _, _ = strings.Cut(repo, ":")
		archive := filepath.Join(dir, repo+".tar")
		if _, err := ociimage.WriteFile(archive, img); err != nil {
			return nil, fmt.Errorf("e2e images: %w", err)
		}
		out = append(out, PackedImage{Archive: archive, Name: img.Name})
	}
	return out, nil
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
