//go:build tools

// Module cniplugins pins the reference CNI plugins (ptp and host-local of
// containernetworking/plugins) that `devkubelet bench` runs beside cellium
// for comparison. test/harness.EnsureReferenceCNIPlugins builds them with
// `go build` into the harness's binary cache.
package cniplugins

import (
	_ "github.com/containernetworking/plugins/plugins/ipam/host-local"
	_ "github.com/containernetworking/plugins/plugins/main/ptp"
)
