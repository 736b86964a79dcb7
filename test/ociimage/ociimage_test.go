package ociimage

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
)

// readTar returns the entries of a tar stream by name, and their order.
func readTar(t *testing.T, r io.Reader) (map[string]*tar.Header, map[string][]byte, []string) {
	t.Helper()
	hdrs := map[string]*tar.Header{}
	data := map[string][]byte{}
	var order []string
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return hdrs, data, order
		}
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		hdrs[h.Name], data[h.Name] = h, b
		order = append(order, h.Name)
	}
}

func blob(t *testing.T, data map[string][]byte, d Descriptor) []byte {
	t.Helper()
	b, ok := data[blobPath(d.Digest)]
	if !ok {
		t.Fatalf("no blob %s (%s) in the archive", d.Digest, d.MediaType)
	}
	if got := Digest(b); got != d.Digest {
		t.Errorf("blob %s has digest %s", d.Digest, got)
	}
	if int64(len(b)) != d.Size {
		t.Errorf("blob %s: %d bytes, descriptor says %d", d.Digest, len(b), d.Size)
	}
	return b
}

// TestWriteLayout packs an image with a file from disk and one from memory
// and checks the archive as an OCI image layout: oci-layout, index.json
// naming the image for containerd, every blob under its digest with the
// descriptor's size, the configuration's diff_id equal to the (uncompressed)
// layer's digest, the runtime settings, and the layer's files with their
// parent directories, modes and content.
func TestWriteLayout(t *testing.T) {
	src := filepath.Join(t.TempDir(), "prog")
	if err := os.WriteFile(src, []byte("#!binary"), 0o700); err != nil {
		t.Fatal(err)
	}
	img := Image{
		Name: "registry.k8s.io/pause:3.10.2",
		Files: []File{
			{Path: "/pause", Source: src},
			{Path: "/etc/cellium/motd", Mode: 0o644, Data: []byte("hello\n")},
		},
		Entrypoint: []string{"/pause"},
		User:       "65535:65535",
	}
	var buf bytes.Buffer
	packed, err := Write(&buf, img)
	if err != nil {
		t.Fatal(err)
	}
	_, data, _ := readTar(t, &buf)

	if got := string(data["oci-layout"]); got != `{"imageLayoutVersion":"1.0.0"}` {
		t.Errorf("oci-layout = %s", got)
	}
	var index Index
	if err := json.Unmarshal(data["index.json"], &index); err != nil {
		t.Fatalf("index.json: %v", err)
	}
	if index.SchemaVersion != 2 || index.MediaType != MediaTypeIndex || len(index.Manifests) != 1 {
		t.Fatalf("index.json = %+v", index)
	}
	md := index.Manifests[0]
	if md.MediaType != MediaTypeManifest || md.Digest != packed.Manifest.Digest {
		t.Errorf("index entry %+v, Write returned %+v", md, packed.Manifest)
	}
	if md.Annotations[AnnotationImageName] != img.Name || md.Annotations[AnnotationRefName] != "3.10.2" {
		t.Errorf("index entry annotations %v", md.Annotations)
	}
	if md.Platform == nil || md.Platform.OS != "linux" || md.Platform.Architecture != runtime.GOARCH {
		t.Errorf("index entry platform %+v", md.Platform)
	}

	var man Manifest
	if err := json.Unmarshal(blob(t, data, md), &man); err != nil {
		t.Fatalf("manifest: %v", err)
	}
	if man.SchemaVersion != 2 || man.MediaType != MediaTypeManifest || man.Config.MediaType != MediaTypeConfig ||
		len(man.Layers) != 1 || man.Layers[0].MediaType != MediaTypeLayer {
		t.Fatalf("manifest = %+v", man)
	}
	var cfg Config
	if err := json.Unmarshal(blob(t, data, man.Config), &cfg); err != nil {
		t.Fatalf("config: %v", err)
	}
	if cfg.OS != "linux" || cfg.Architecture != runtime.GOARCH {
		t.Errorf("config platform %s/%s", cfg.OS, cfg.Architecture)
	}
	if !slices.Equal(cfg.Config.Entrypoint, []string{"/pause"}) || cfg.Config.User != "65535:65535" ||
		!slices.Equal(cfg.Config.Env, []string{"PATH=/usr/local/bin:/usr/bin:/bin"}) {
		t.Errorf("runtime config %+v", cfg.Config)
	}
	if cfg.RootFS.Type != "layers" || !slices.Equal(cfg.RootFS.DiffIDs, []string{man.Layers[0].Digest}) {
		t.Errorf("rootfs %+v, layer %s", cfg.RootFS, man.Layers[0].Digest)
	}

	layer := blob(t, data, man.Layers[0])
	hdrs, files, order := readTar(t, bytes.NewReader(layer))
	if want := []string{"etc/", "etc/cellium/", "etc/cellium/motd", "pause"}; !slices.Equal(order, want) {
		t.Errorf("layer entries %v, want %v", order, want)
	}
	for name, want := range map[string]struct {
		typ  byte
		mode int64
		data string
	}{
		"etc/":             {tar.TypeDir, 0o755, ""},
		"etc/cellium/":     {tar.TypeDir, 0o755, ""},
		"etc/cellium/motd": {tar.TypeReg, 0o644, "hello\n"},
		"pause":            {tar.TypeReg, 0o755, "#!binary"},
	} {
		h := hdrs[name]
		if h == nil {
			continue
		}
		if h.Typeflag != want.typ || h.Mode != want.mode || string(files[name]) != want.data || h.Uid != 0 || h.Gid != 0 {
			t.Errorf("layer %s: type %c mode %o uid %d content %q; want %c %o 0 %q", name, h.Typeflag, h.Mode, h.Uid, files[name], want.typ, want.mode, want.data)
		}
	}
}

// TestWriteDeterministic: the same image packs to the same bytes, and a
// change of content changes the image digest.
func TestWriteDeterministic(t *testing.T) {
	img := Image{Name: "cellium.local/demo:dev", Files: []File{{Path: "/demo", Data: []byte("v1")}}, Cmd: []string{"/demo"}}
	var a, b bytes.Buffer
	pa, err := Write(&a, img)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Write(&b, img); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a.Bytes(), b.Bytes()) {
		t.Error("two packs of the same image differ")
	}
	img.Files[0].Data = []byte("v2")
	pc, err := Write(io.Discard, img)
	if err != nil {
		t.Fatal(err)
	}
	if pc.Manifest.Digest == pa.Manifest.Digest || pc.Layer.Digest == pa.Layer.Digest {
		t.Error("different content, same digests")
	}
}

// TestWriteFile writes the archive to disk and reads the index back.
func TestWriteFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "img.tar")
	p, err := WriteFile(path, Image{Name: "cellium.local/x:1", Files: []File{{Path: "/x", Data: []byte("x")}}, Entrypoint: []string{"/x"}})
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	_, data, _ := readTar(t, f)
	if !strings.Contains(string(data["index.json"]), p.Manifest.Digest) {
		t.Errorf("index.json %s lacks manifest %s", data["index.json"], p.Manifest.Digest)
	}
}

// TestWriteInvalid: images that cannot be packed fail with ErrInvalid and
// write nothing.
func TestWriteInvalid(t *testing.T) {
	ok := Image{Name: "cellium.local/x:1", Files: []File{{Path: "/x", Data: []byte("x")}}, Entrypoint: []string{"/x"}}
	for name, mutate := range map[string]func(*Image){
		"no name":        func(i *Image) { i.Name = "" },
		"no tag":         func(i *Image) { i.Name = "localhost:5000/x" },
		"relative path":  func(i *Image) { i.Files[0].Path = "x" },
		"unclean path":   func(i *Image) { i.Files[0].Path = "/a/../x" },
		"duplicate path": func(i *Image) { i.Files = append(i.Files, i.Files[0]) },
		"nothing to run": func(i *Image) { i.Entrypoint = nil },
	} {
		t.Run(name, func(t *testing.T) {
			img := ok
			img.Files = slices.Clone(ok.Files)
			mutate(&img)
			var buf bytes.Buffer
			if _, err := Write(&buf, img); !errors.Is(err, ErrInvalid) {
				t.Errorf("Write = %v, want ErrInvalid", err)
			}
			if buf.Len() != 0 {
				t.Errorf("%d bytes written", buf.Len())
			}
		})
	}
	if _, err := Write(io.Discard, Image{Name: "cellium.local/x:1", Files: []File{{Path: "/x", Source: "/nonexistent/file"}}, Entrypoint: []string{"/x"}}); err == nil || errors.Is(err, ErrInvalid) {
		t.Errorf("missing source file: %v", err)
	}
}
