//go:build tools

// Module cniplugins pins the reference CNI plugins (ptp and host-local of
// containernetworking/plugins) that `devkubelet bench` runs beside cellium
// for comparison, and portmap, which cellium's image carries for
// --cni-chaining-mode=portmap. test/harness.EnsureReferenceCNIPlugins and
// EnsureImageCNIPlugins build them with `go build` into the harness's
// binary cache.
package cniplugins

import (
	_ "github.com/containernetworking/plugins/plugins/ipam/host-local"
	_ "github.com/containernetworking/plugins/plugins/main/ptp"
	_ "github.com/containernetworking/plugins/plugins/meta/portmap"
)
