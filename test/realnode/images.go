package realnode

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/cellium/cellium/test/harness"
	"github.com/cellium/cellium/test/ociimage"
)

// Names of the images the node packs.
const (
	// DemoImage runs test/cmd/demoapp (HTTP on :8080).
	DemoImage = "cellium.local/demoapp:dev"
	// CelliumImage holds cellium-agent, cellium-operator, cellium-cni and
	// the cellium CLI in /usr/bin, the upstream hubble CLI beside them,
	// the portmap CNI plugin in /usr/lib/cni (harness.ImageCNIPlugins),
	// and no shell: the image the manifests (install/kubernetes) run,
	// under the name DevValues gives them.
	CelliumImage = "cellium.local/cellium:dev"
	// HubbleRelayImage holds the upstream hubble-relay in /usr/bin (the
	// chart's hubble.relay.image, run as hubble-relay serve).
	HubbleRelayImage = "cellium.local/hubble-relay:dev"
)

// ImageSpec is an image to build from the cellium checkout: its programs
// are built static (CGO_ENABLED=0) and packed into /usr/bin, or at the
// root when AtRoot; Prebuilt programs are packed as they are, beside
// them; with CNIPlugins, harness.ImageCNIPlugins (built static) are
// packed into CNIPluginDir.
type ImageSpec struct {
	Name       string
	Packages   map[string]string // binary name -> package, relative to the repository root
	Prebuilt   []Prebuilt
	Entrypoint []string
	User       string
	AtRoot     bool
	CNIPlugins bool
}

// Prebuilt is a program built elsewhere (static) that an image carries
// under Name: Locate returns its path, building or fetching it into a
// cache first if needed.
type Prebuilt struct {
	Name   string
	Locate func(ctx context.Context) (string, error)
}

// The upstream Hubble programs (harness.EnsureHubble: built once from the
// Go module proxy, about 10 minutes cold, cached after).
var (
	HubbleCLI = Prebuilt{Name: "hubble", Locate: func(ctx context.Context) (string, error) {
		b, err := harness.EnsureHubble(ctx, nil)
		return b.Hubble, err
	}}
	HubbleRelay = Prebuilt{Name: "hubble-relay", Locate: func(ctx context.Context) (string, error) {
		b, err := harness.EnsureHubble(ctx, nil)
		return b.Relay, err
	}}
)

// CNIPluginDir is where cellium's image holds the CNI plugins of
// containernetworking/plugins (as Debian's containernetworking-plugins).
const CNIPluginDir = "/usr/lib/cni"

// PauseSpec, DemoSpec, CelliumSpec and HubbleRelaySpec are the node's
// images.
var (
	PauseSpec = ImageSpec{
		Name:       SandboxImage,
		Packages:   map[string]string{"pause": "./test/cmd/pause"},
		Entrypoint: []string{"/pause"},
		User:       "65535:65535",
		AtRoot:     true,
	}
	DemoSpec = ImageSpec{
		Name:       DemoImage,
		Packages:   map[string]string{"demoapp": "./test/cmd/demoapp"},
		Entrypoint: []string{"/usr/bin/demoapp"},
	}
	CelliumSpec = ImageSpec{
		Name: CelliumImage,
		Packages: map[string]string{
			"cellium-agent":    "./daemon/cellium-agent",
			"cellium-operator": "./operator/cellium-operator",
			"cellium-cni":      "./cni/cellium-cni",
			"cellium":          "./cli/cellium",
		},
		// kubectl exec ds/cellium-agent -- hubble observe (the chart
		// sets HUBBLE_SERVER to the agent's socket).
		Prebuilt:   []Prebuilt{HubbleCLI},
		Entrypoint: []string{"/usr/bin/cellium-agent"},
		CNIPlugins: true,
	}
	// HubbleRelaySpec runs as the relay's chart user (65532), as Cilium's
	// image does.
	HubbleRelaySpec = ImageSpec{
		Name:       HubbleRelayImage,
		Prebuilt:   []Prebuilt{HubbleRelay},
		Entrypoint: []string{"/usr/bin/hubble-relay"},
		User:       "65532:65532",
	}
)

// ImageBuildEnv and ImageBuildFlags are how the images' programs are
// built (static, without the checkout's paths): `make build` builds bin/
// the same way, so that [BuildImageFrom] with binDir bin/ finds them
// current and go build links nothing again.
var (
	ImageBuildEnv   = []string{"CGO_ENABLED=0"}
	ImageBuildFlags = []string{"-trimpath"}
)

// BuildImage builds spec's programs into dir and packs them into the OCI
// archive dir/<name>.tar, whose path it returns.
//
// Errors: not inside the cellium checkout; the build or the packing fails.
func BuildImage(ctx context.Context, dir string, spec ImageSpec) (string, error) {
	return BuildImageFrom(ctx, dir, "", spec)
}

// BuildImageFrom is [BuildImage] with the programs built into binDir (when
// not empty; relative to the working directory), e.g. `make build`'s bin/:
// go build with ImageBuildEnv and ImageBuildFlags leaves a binary that is
// current (same build ID: same sources and flags) as it is, so the image
// reuses what `make build` just built instead of compiling it again.
//
// Errors: as BuildImage.
func BuildImageFrom(ctx context.Context, dir, binDir string, spec ImageSpec) (string, error) {
	root, err := harness.RepoRoot(".")
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "bin-"+safeName(spec.Name))
	if binDir != "" {
		if bin, err = filepath.Abs(binDir); err != nil {
			return "", fmt.Errorf("image %s: %w", spec.Name, err)
		}
	}
	if err := os.MkdirAll(bin, 0o755); err != nil {
		return "", fmt.Errorf("image %s: %w", spec.Name, err)
	}
	args := append([]string{"build"}, ImageBuildFlags...)
	args = append(args, "-o", bin+"/")
	for _, pkg := range spec.Packages {
		args = append(args, pkg)
	}
	if len(spec.Packages) > 0 {
		cmd := exec.CommandContext(ctx, "go", args...)
		cmd.Dir = root
		cmd.Env = append(os.Environ(), ImageBuildEnv...)
		if out, err := cmd.CombinedOutput(); err != nil {
			return "", fmt.Errorf("image %s: go %s: %w\n%s", spec.Name, strings.Join(args, " "), err, out)
		}
	}
	img := ociimage.Image{Name: spec.Name, Entrypoint: spec.Entrypoint, User: spec.User}
	for name := range spec.Packages {
		p := "/usr/bin/" + name
		if spec.AtRoot {
			p = "/" + name
		}
		img.Files = append(img.Files, ociimage.File{Path: p, Source: filepath.Join(bin, name)})
	}
	for _, p := range spec.Prebuilt {
		src, err := p.Locate(ctx)
		if err != nil {
			return "", fmt.Errorf("image %s: %s: %w", spec.Name, p.Name, err)
		}
		dst := "/usr/bin/" + p.Name
		if spec.AtRoot {
			dst = "/" + p.Name
		}
		img.Files = append(img.Files, ociimage.File{Path: dst, Source: src})
	}
	if spec.CNIPlugins {
		pluginDir, err := harness.EnsureImageCNIPlugins(ctx, nil)
		if err != nil {
			return "", fmt.Errorf("image %s: %w", spec.Name, err)
		}
		for _, name := range harness.ImageCNIPlugins {
			img.Files = append(img.Files, ociimage.File{Path: CNIPluginDir + "/" + name, Source: filepath.Join(pluginDir, name)})
		}
	}
	out := filepath.Join(dir, safeName(spec.Name)+".tar")
	if _, err := ociimage.WriteFile(out, img); err != nil {
		return "", err
	}
	return out, nil
}

// safeName turns an image name into a file name.
func safeName(image string) string {
	return strings.NewReplacer("/", "_", ":", "_").Replace(image)
}
