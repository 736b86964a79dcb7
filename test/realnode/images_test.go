package realnode

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/cellium/cellium/test/harness"
	"github.com/cellium/cellium/test/ociimage"
)

// TestBuildImagePause builds the pause image from test/cmd/pause and checks
// the archive: named SandboxImage, its one layer holding /pause as an
// executable, run as 65535 through the entrypoint /pause.
func TestBuildImagePause(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a program")
	}
	path, err := BuildImage(t.Context(), t.TempDir(), PauseSpec)
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	blobs := map[string][]byte{}
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		blobs[h.Name] = b
	}
	var index ociimage.Index
	if err := json.Unmarshal(blobs["index.json"], &index); err != nil || len(index.Manifests) != 1 {
		t.Fatalf("index.json %s: %v", blobs["index.json"], err)
	}
	if got := index.Manifests[0].Annotations[ociimage.AnnotationImageName]; got != SandboxImage {
		t.Errorf("image named %q, want %s", got, SandboxImage)
	}
	blob := func(digest string) []byte { return blobs["blobs/sha256/"+strings.TrimPrefix(digest, "sha256:")] }
	var man ociimage.Manifest
	if err := json.Unmarshal(blob(index.Manifests[0].Digest), &man); err != nil || len(man.Layers) != 1 {
		t.Fatalf("manifest: %v", err)
	}
	var cfg ociimage.Config
	if err := json.Unmarshal(blob(man.Config.Digest), &cfg); err != nil {
		t.Fatal(err)
	}
	if cfg.Config.User != "65535:65535" || len(cfg.Config.Entrypoint) != 1 || cfg.Config.Entrypoint[0] != "/pause" {
		t.Errorf("runtime config %+v", cfg.Config)
	}
	lr := tar.NewReader(strings.NewReader(string(blob(man.Layers[0].Digest))))
	h, err := lr.Next()
	if err != nil {
		t.Fatal(err)
	}
	if h.Name != "pause" || h.Mode&0o111 == 0 || h.Size < 1000 {
		t.Errorf("layer entry %s mode %o size %d, want the executable pause", h.Name, h.Mode, h.Size)
	}
	if filepath.Base(path) != "registry.k8s.io_pause_3.10.2.tar" {
		t.Errorf("archive %s", path)
	}
}

// TestBuildImageCNIPlugins: an image with CNIPlugins carries portmap,
// built static, as an executable at /usr/lib/cni/portmap (cellium's image
// does, for the install-cni-plugin init container).
func TestBuildImageCNIPlugins(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a program")
	}
	path, err := BuildImage(t.Context(), t.TempDir(), ImageSpec{Name: "cellium.local/cni-plugins-test:dev", Entrypoint: []string{"/usr/lib/cni/portmap"}, CNIPlugins: true})
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var layers [][]byte
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		if strings.HasPrefix(h.Name, "blobs/") {
			layers = append(layers, b)
		}
	}
	for _, b := range layers {
		lr := tar.NewReader(strings.NewReader(string(b)))
		for {
			h, err := lr.Next()
			if err != nil {
				break // not a layer, or its end
			}
			if h.Name != "usr/lib/cni/portmap" {
				continue
			}
			elf := make([]byte, 4)
			if _, err := io.ReadFull(lr, elf); err != nil || string(elf) != "\x7fELF" || h.Mode&0o111 == 0 {
				t.Fatalf("usr/lib/cni/portmap: mode %o, starts %q (%v); want an executable ELF file", h.Mode, elf, err)
			}
			return
		}
	}
	t.Fatalf("no usr/lib/cni/portmap in the image's layers")
}

// TestBuildImageFromReusesBinDir: a program that `make build` (same flags:
// ImageBuildEnv, ImageBuildFlags) left current in bin/ is packed as it is,
// not linked again (its file is untouched), and the Makefile's build target
// uses those flags (make up packed the images by compiling everything a
// second time, ~3 minutes on 2 cores).
func TestBuildImageFromReusesBinDir(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a program")
	}
	binDir := t.TempDir()
	if _, err := BuildImageFrom(t.Context(), t.TempDir(), binDir, PauseSpec); err != nil {
		t.Fatal(err)
	}
	prog := filepath.Join(binDir, "pause")
	before, err := os.Stat(prog)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := BuildImageFrom(t.Context(), t.TempDir(), binDir, PauseSpec); err != nil {
		t.Fatal(err)
	}
	after, err := os.Stat(prog)
	if err != nil {
		t.Fatal(err)
	}
	// go build touches a current target (its mtime) but a relink
	// replaces the file (a new inode).
	if !os.SameFile(before, after) {
		t.Errorf("%s was linked again: the current binary was not reused", prog)
	}

	root, err := harness.RepoRoot(".")
	if err != nil {
		t.Fatal(err)
	}
	mk, err := os.ReadFile(filepath.Join(root, "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	want := strings.Join(ImageBuildEnv, " ") + " $(GO) build " + strings.Join(ImageBuildFlags, " ") + " -o $(BIN)/"
	if !strings.Contains(string(mk), want) {
		t.Errorf("the Makefile's build target does not run %q: make up's image packer would compile bin/ again", want)
	}
}

// TestBuildImagePrebuilt: a Prebuilt program is packed as it is, at
// /usr/bin/<name>, byte for byte; a Locate error names the image and the
// program.
func TestBuildImagePrebuilt(t *testing.T) {
	src := filepath.Join(t.TempDir(), "prog")
	data := []byte("\x7fELF not really a program, but bytes to compare")
	if err := os.WriteFile(src, data, 0o755); err != nil {
		t.Fatal(err)
	}
	spec := ImageSpec{Name: "cellium.local/prebuilt-test:dev", Entrypoint: []string{"/usr/bin/prog"}, User: "65532:65532",
		Prebuilt: []Prebuilt{{Name: "prog", Locate: func(context.Context) (string, error) { return src, nil }}}}
	path, err := BuildImage(t.Context(), t.TempDir(), spec)
	if err != nil {
		t.Fatal(err)
	}
	files := imageFiles(t, path)
	if got, ok := files["usr/bin/prog"]; !ok || !bytes.Equal(got.data, data) || got.mode&0o111 == 0 {
		t.Fatalf("usr/bin/prog in the image: %v, mode %o, %q; want the executable source (files: %d)", ok, got.mode, got.data, len(files))
	}

	spec.Prebuilt[0].Locate = func(context.Context) (string, error) { return "", errors.New("not cached") }
	if _, err := BuildImage(t.Context(), t.TempDir(), spec); err == nil || !strings.Contains(err.Error(), "image cellium.local/prebuilt-test:dev: prog: not cached") {
		t.Errorf("error %v, want one naming the image and the program", err)
	}
}

// TestHubbleImages: cellium's image carries the upstream hubble CLI (the
// chart's HUBBLE_SERVER is for it) and the relay's image the upstream
// hubble-relay as its entrypoint, run as the chart's user; the packed
// relay is the cached binary (skipped when make hubble-binaries has not
// built it).
func TestHubbleImages(t *testing.T) {
	if !slices.ContainsFunc(CelliumSpec.Prebuilt, func(p Prebuilt) bool { return p.Name == "hubble" }) {
		t.Errorf("CelliumSpec packs %v: no hubble CLI", CelliumSpec.Prebuilt)
	}
	if HubbleRelaySpec.Name != HubbleRelayImage || len(HubbleRelaySpec.Prebuilt) != 1 || HubbleRelaySpec.Prebuilt[0].Name != "hubble-relay" ||
		!slices.Equal(HubbleRelaySpec.Entrypoint, []string{"/usr/bin/hubble-relay"}) || HubbleRelaySpec.User != "65532:65532" {
		t.Errorf("HubbleRelaySpec %+v", HubbleRelaySpec)
	}
	if testing.Short() {
		t.Skip("packs a 100 MB program")
	}
	bins, ok := harness.CachedHubble()
	if !ok {
		t.Skip("the upstream hubble-relay is not cached: make hubble-binaries builds it (~10 minutes)")
	}
	path, err := BuildImage(t.Context(), t.TempDir(), HubbleRelaySpec)
	if err != nil {
		t.Fatal(err)
	}
	want, err := os.ReadFile(bins.Relay)
	if err != nil {
		t.Fatal(err)
	}
	if got := imageFiles(t, path)["usr/bin/hubble-relay"]; !bytes.Equal(got.data, want) {
		t.Errorf("usr/bin/hubble-relay in the image (%d bytes) is not the cached %s (%d bytes)", len(got.data), bins.Relay, len(want))
	}
}

type imageFile struct {
	mode int64
	data []byte
}

// imageFiles reads every file of every layer of the OCI archive at path.
func imageFiles(t *testing.T, path string) map[string]imageFile {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string]imageFile{}
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(h.Name, "blobs/") {
			continue
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		lr := tar.NewReader(bytes.NewReader(b))
		for {
			lh, err := lr.Next()
			if err != nil {
				break // not a layer, or its end
			}
			d, err := io.ReadAll(lr)
			if err != nil {
				break
			}
			out[lh.Name] = imageFile{mode: lh.Mode, data: d}
		}
	}
	return out
}
