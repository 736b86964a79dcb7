//go:build tools

// Package hubble pins the upstream Hubble commands cellium's tests use as
// clients of its Hubble API: the hubble CLI and hubble-relay, both main
// packages of github.com/cilium/cilium. Cilium's own go.mod carries a replace
// directive, which only applies when Cilium is the main module, so they are
// built from this small module of their own, like the Kubernetes binaries.
package hubble

import (
	_ "github.com/cilium/cilium/hubble"
	_ "github.com/cilium/cilium/hubble-relay"
)
