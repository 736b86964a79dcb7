// Package routing applies the node's desired host networking (the tables
// of statedb/routes) to the kernel: the host device cilium_host with the
// router IP, a /32 route per endpoint through its host veth, the
// forwarding sysctls and the masquerade rules. It has the operations the
// generic reconciler (statedb/reconciler) calls for each table, and the
// Deriver that fills the tables from the endpoints and local-node tables.
//
// Everything the package writes is marked as its own, and pruning removes
// only what is so marked: routes carry protocol routes.Protocol (201),
// devices the alias "cellium-host-device", masquerade rules live in the
// nftables table "ip cellium" with a tag in their user data.
//
// The package is plain Go (no cells); daemon/hostrouting composes it into
// the agent. Every operation acts on the network namespace named by a
// Netns (the zero Netns is the caller's), so tests run it against a
// namespace they made to play the node.
package routing
