//go:build tools

// Package helm pins the Helm command the test harness builds to lint and
// render cellium's chart (install/helm/cellium). Helm is not packaged in
// Debian, so it comes from the Go module proxy like the Kubernetes binaries.
package helm

import (
	_ "helm.sh/helm/v3/cmd/helm"
)
