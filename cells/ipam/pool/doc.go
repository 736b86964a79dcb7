// Package pool is the agent-side IPv4 address allocator over the node's pod
// CIDRs (CiliumNode spec.ipam.podCIDRs in cluster-pool mode, the Node's
// podCIDRs in kubernetes mode).
//
// A Pool reserves the router IP for cilium_host, hands out pod addresses
// one at a time, restores allocations after an agent restart, and reports
// who holds what for status.ipam.used. It is plain Go without goroutines or
// I/O; the IPAM cell wraps it.
package pool
