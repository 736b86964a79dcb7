// Package clusterpool is the operator side of cluster-pool IPAM: while this
// replica leads, it gives every CiliumNode one IPv4 pod CIDR carved out of
// --cluster-pool-ipv4-cidr (prefix length --cluster-pool-ipv4-mask-size),
// written to the node's spec.ipam.podCIDRs, and frees the CIDR when the
// CiliumNode is deleted. The CIDRs already written are restored when
// leadership starts, so a new leader never hands one out twice. The agent
// on each node allocates pod addresses from its CIDR.
//
// The carving itself is the plain allocator in the cidralloc subpackage;
// this package watches the CiliumNodes table and writes to the API server.
package clusterpool
