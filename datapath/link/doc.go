// Package link gives a pod its network interface: it creates the veth pair
// between the node and the pod's network namespace, configures the pod side
// (name, MTU, MAC, address, routes) and the host side (sysctls), checks and
// removes what it made, lists the host-side links for restore and garbage
// collection, and installs the host route to each pod.
//
// The package is plain Go: no cells, no background work, no package-level
// state. Every netlink operation uses a handle bound to the network namespace
// it acts on; code that must run inside a namespace (opening those handles,
// sysctl files) runs on a locked OS thread through the Do method of
// containernetworking/plugins' ns.NetNS, so a thread never goes back to the
// Go scheduler in the wrong namespace.
//
// The host side lives in the namespace named by a [Host]; the package-level
// functions act on the namespace of the calling process, which is what the
// agent wants. Tests and multi-node harnesses use a Host whose NetnsPath
// names a namespace they made to play the node.
//
// The addressing model is Cilium's: the pod gets its IPv4 address as a /32,
// a scope-link route to the node's router IP (the gateway) and a default
// route via that gateway; the node reaches the pod through a /32 route on
// the host-side veth ([Host.EnsurePodRoute]).
package link
