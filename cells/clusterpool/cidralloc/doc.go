// Package cidralloc is the operator-side allocator of per-node pod CIDRs in
// cluster-pool IPAM mode: it carves node CIDRs of --cluster-pool-ipv4-mask-size
// bits out of the --cluster-pool-ipv4-cidr ranges, one per node, and restores
// the CIDRs already written to CiliumNode spec.ipam.podCIDRs when the
// operator starts.
//
// It is plain Go without goroutines or I/O; the cluster-pool cell watches
// CiliumNodes and calls it.
package cidralloc
