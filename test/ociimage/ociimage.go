package ociimage

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"runtime"
	"slices"
	"strings"
	"time"
)

// Media types of the OCI image specification.
const (
	MediaTypeIndex    = "application/vnd.oci.image.index.v1+json"
	MediaTypeManifest = "application/vnd.oci.image.manifest.v1+json"
	MediaTypeConfig   = "application/vnd.oci.image.config.v1+json"
	MediaTypeLayer    = "application/vnd.oci.image.layer.v1.tar"
)

// Annotations of the index entry that name the image: containerd's import
// takes the full name from AnnotationImageName, the OCI tag from
// AnnotationRefName.
const (
	AnnotationImageName = "io.containerd.image.name"
	AnnotationRefName   = "org.opencontainers.image.ref.name"
)

// ErrInvalid means that an Image cannot be packed; the error says which of
// its fields is wrong.
var ErrInvalid = errors.New("invalid image")

// epoch is the modification time of every file and the image's creation
// time: fixed, so that the output is reproducible.
var epoch = time.Unix(0, 0).UTC()

// File is one regular file of an image's layer.
type File struct {
	// Path is the absolute path in the image, e.g. "/usr/bin/cellium-agent".
	// Its parent directories are added to the layer (mode 0755).
	Path string
	// Mode is the permission bits; 0 means 0755 (a program).
	Mode fs.FileMode
	// Source is a file on this machine to copy; if empty, Data is the
	// content.
	Source string
	Data   []byte
}

// Image is what to pack.
type Image struct {
	// Name is the image's full reference, e.g. "registry.k8s.io/pause:3.10.2";
	// it must have a tag.
	Name string
	// Files are the content of the image's single layer.
	Files []File
	// Entrypoint and Cmd are the image configuration's.
	Entrypoint []string
	Cmd        []string
	// Env are KEY=VALUE pairs; default PATH=/usr/local/bin:/usr/bin:/bin.
	Env []string
	// User is the user the process runs as, e.g. "65535:65535"; empty
	// means root.
	User string
	// Architecture is the platform's; default runtime.GOARCH. OS is linux.
	Architecture string
}

// Descriptor is an OCI content descriptor.
type Descriptor struct {
	MediaType   string            `json:"mediaType"`
	Digest      string            `json:"digest"`
	Size        int64             `json:"size"`
	Platform    *Platform         `json:"platform,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

// Platform is a descriptor's platform.
type Platform struct {
	Architecture string `json:"architecture"`
	OS           string `json:"os"`
}

// Index is an OCI image index (index.json of the layout).
type Index struct {
	SchemaVersion int          `json:"schemaVersion"`
	MediaType     string       `json:"mediaType"`
	Manifests     []Descriptor `json:"manifests"`
}

// Manifest is an OCI image manifest.
type Manifest struct {
	SchemaVersion int          `json:"schemaVersion"`
	MediaType     string       `json:"mediaType"`
	Config        Descriptor   `json:"config"`
	Layers        []Descriptor `json:"layers"`
}

// Config is the part of an OCI image configuration this package writes.
type Config struct {
	Created      time.Time     `json:"created"`
	Architecture string        `json:"architecture"`
	OS           string        `json:"os"`
	Config       RuntimeConfig `json:"config"`
	RootFS       RootFS        `json:"rootfs"`
}

// RuntimeConfig is the execution part of an image configuration.
type RuntimeConfig struct {
	User       string   `json:"User,omitempty"`
	Env        []string `json:"Env,omitempty"`
	Entrypoint []string `json:"Entrypoint,omitempty"`
	Cmd        []string `json:"Cmd,omitempty"`
	WorkingDir string   `json:"WorkingDir,omitempty"`
}

// RootFS lists the layers' uncompressed digests.
type RootFS struct {
	Type    string   `json:"type"`
	DiffIDs []string `json:"diff_ids"`
}

// Packed is what [Write] wrote: the descriptors of the image's blobs.
type Packed struct {
	Manifest Descriptor // as listed in index.json, with the name annotations
	Config   Descriptor
	Layer    Descriptor
}

// WriteFile packs img into an OCI layout tar archive at path (see [Write]),
// replacing a file there.
//
// Errors: as Write; the file cannot be written.
func WriteFile(path string, img Image) (Packed, error) {
	f, err := os.Create(path)
	if err != nil {
		return Packed{}, fmt.Errorf("pack %s: %w", img.Name, err)
	}
	p, err := Write(f, img)
	if cerr := f.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("pack %s: %w", img.Name, cerr)
	}
	if err != nil {
		_ = os.Remove(path)
	}
	return p, err
}

// Write packs img as an OCI image layout in a tar archive to w: oci-layout,
// index.json naming the image, and the manifest, configuration and layer
// (uncompressed) under blobs/sha256/.
//
// Errors: [ErrInvalid] (no name or tag, a relative or duplicate file path,
// no entrypoint or command); a source file cannot be read; w fails.
func Write(w io.Writer, img Image) (Packed, error) {
	if err := validate(img); err != nil {
		return Packed{}, err
	}
	layer, err := buildLayer(img.Files)
	if err != nil {
		return Packed{}, fmt.Errorf("pack %s: %w", img.Name, err)
	}
	arch := img.Architecture
	if arch == "" {
		arch = runtime.GOARCH
	}
	env := img.Env
	if env == nil {
		env = []string{"PATH=/usr/local/bin:/usr/bin:/bin"}
	}
	layerDesc := descriptor(MediaTypeLayer, layer)
	cfg, err := json.Marshal(Config{
		Created:      epoch,
		Architecture: arch,
		OS:           "linux",
		Config:       RuntimeConfig{User: img.User, Env: env, Entrypoint: img.Entrypoint, Cmd: img.Cmd, WorkingDir: "/"},
		RootFS:       RootFS{Type: "layers", DiffIDs: []string{layerDesc.Digest}},
	})
	if err != nil {
		return Packed{}, fmt.Errorf("pack %s: %w", img.Name, err)
	}
	cfgDesc := descriptor(MediaTypeConfig, cfg)
	manifest, err := json.Marshal(Manifest{
		SchemaVersion: 2,
		MediaType:     MediaTypeManifest,
		Config:        cfgDesc,
		Layers:        []Descriptor{layerDesc},
	})
	if err != nil {
		return Packed{}, fmt.Errorf("pack %s: %w", img.Name, err)
	}
	manDesc := descriptor(MediaTypeManifest, manifest)
	manDesc.Platform = &Platform{Architecture: arch, OS: "linux"}
	manDesc.Annotations = map[string]string{
		AnnotationImageName: img.Name,
		AnnotationRefName:   tagOf(img.Name),
	}
	index, err := json.Marshal(Index{SchemaVersion: 2, MediaType: MediaTypeIndex, Manifests: []Descriptor{manDesc}})
	if err != nil {
		return Packed{}, fmt.Errorf("pack %s: %w", img.Name, err)
	}

	tw := tar.NewWriter(w)
	entries := []struct {
		name string
		data []byte
	}{
		{"oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)},
		{"index.json", index},
		{"blobs/", nil},
		{"blobs/sha256/", nil},
		{blobPath(manDesc.Digest), manifest},
		{blobPath(cfgDesc.Digest), cfg},
		{blobPath(layerDesc.Digest), layer},
	}
	for _, e := range entries {
		if err := writeEntry(tw, e.name, 0o644, e.data); err != nil {
			return Packed{}, fmt.Errorf("pack %s: %w", img.Name, err)
		}
	}
	if err := tw.Close(); err != nil {
		return Packed{}, fmt.Errorf("pack %s: %w", img.Name, err)
	}
	return Packed{Manifest: manDesc, Config: cfgDesc, Layer: layerDesc}, nil
}

func validate(img Image) error {
	if img.Name == "" || tagOf(img.Name) == "" {
		return fmt.Errorf("%w: name %q: give a full reference with a tag, e.g. registry.k8s.io/pause:3.10.2", ErrInvalid, img.Name)
	}
	if len(img.Entrypoint) == 0 && len(img.Cmd) == 0 {
		return fmt.Errorf("%w %s: no Entrypoint and no Cmd: the container would have nothing to run", ErrInvalid, img.Name)
	}
	seen := map[string]bool{}
	for _, f := range img.Files {
		if !path.IsAbs(f.Path) || path.Clean(f.Path) != f.Path || f.Path == "/" {
			return fmt.Errorf("%w %s: file path %q: want a clean absolute path of a file", ErrInvalid, img.Name, f.Path)
		}
		if seen[f.Path] {
			return fmt.Errorf("%w %s: file %s given twice", ErrInvalid, img.Name, f.Path)
		}
		seen[f.Path] = true
	}
	return nil
}

// tagOf returns the tag of an image reference, or "" if it has none.
func tagOf(ref string) string {
	last := ref[strings.LastIndex(ref, "/")+1:]
	if i := strings.LastIndex(last, ":"); i >= 0 {
		return last[i+1:]
	}
	return ""
}

// buildLayer writes the files, and their parent directories, to an
// uncompressed tar stream, sorted by path.
func buildLayer(files []File) ([]byte, error) {
	dirs := map[string]bool{}
	for _, f := range files {
		for d := path.Dir(f.Path); d != "/"; d = path.Dir(d) {
			dirs[d] = true
		}
	}
	type entry struct {
		name string
		dir  bool
		file File
	}
	var entries []entry
	for d := range dirs {
		entries = append(entries, entry{name: strings.TrimPrefix(d, "/") + "/", dir: true})
	}
	for _, f := range files {
		entries = append(entries, entry{name: strings.TrimPrefix(f.Path, "/"), file: f})
	}
	slices.SortFunc(entries, func(a, b entry) int { return strings.Compare(a.name, b.name) })

	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		if e.dir {
			if err := writeEntry(tw, e.name, 0o755, nil); err != nil {
				return nil, err
			}
			continue
		}
		data := e.file.Data
		if e.file.Source != "" {
			var err error
			if data, err = os.ReadFile(e.file.Source); err != nil {
				return nil, fmt.Errorf("layer file %s: %w", e.file.Path, err)
			}
		}
		mode := e.file.Mode.Perm()
		if mode == 0 {
			mode = 0o755
		}
		if err := writeEntry(tw, e.name, mode, data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// writeEntry writes a directory (name ends in "/") or a regular file owned
// by root.
func writeEntry(tw *tar.Writer, name string, mode fs.FileMode, data []byte) error {
	hdr := &tar.Header{
		Name:    name,
		Mode:    int64(mode.Perm()),
		ModTime: epoch,
		Format:  tar.FormatPAX,
	}
	if strings.HasSuffix(name, "/") {
		hdr.Typeflag = tar.TypeDir
	} else {
		hdr.Typeflag = tar.TypeReg
		hdr.Size = int64(len(data))
	}
	if err := tw.WriteHeader(hdr); err != nil {
		return fmt.Errorf("write %s: %w", name, err)
	}
	if _, err := tw.Write(data); err != nil {
		return fmt.Errorf("write %s: %w", name, err)
	}
	return nil
}

// descriptor describes a blob.
func descriptor(mediaType string, blob []byte) Descriptor {
	return Descriptor{MediaType: mediaType, Digest: Digest(blob), Size: int64(len(blob))}
}

// Digest is the OCI digest of b: "sha256:" and the hex SHA-256.
func Digest(b []byte) string {
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// blobPath is where the layout keeps the blob of a digest.
func blobPath(digest string) string {
	return "blobs/sha256/" + strings.TrimPrefix(digest, "sha256:")
}
