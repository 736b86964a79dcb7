// Command cellium-cni is cellium's CNI plugin: container runtimes run it
// from /opt/cni/bin as the plugin of type "cellium-cni" in
// /etc/cni/net.d/05-cellium.conflist. It is a thin client of the local
// cellium agent's API; see Documentation/operations/cni.md.
package main

import (
	"github.com/containernetworking/cni/pkg/skel"

	"github.com/cellium/cellium/cni/plugin"
)

func main() {
	// PluginMainFuncs dispatches on CNI_COMMAND, prints errors as CNI error
	// results and exits non-zero on failure.
	skel.PluginMainFuncs(plugin.New().Funcs(), plugin.SupportedVersions(), plugin.About)
}
