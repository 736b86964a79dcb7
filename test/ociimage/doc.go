// Package ociimage writes container images without a registry or a
// container build tool: one layer of files (typically static binaries) and
// an image configuration, packed as an OCI image layout in a tar archive
// that `ctr -n k8s.io images import` loads into containerd under the
// image's name. The real test node (test/realnode) runs its pause image,
// the cellium image and the demo app from such archives.
//
// The output is deterministic: the same files and settings give the same
// bytes, and so the same image digest.
package ociimage
