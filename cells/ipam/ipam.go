// Package ipam is the agent's IP address management in cluster-pool mode:
// it waits for the operator to give this node pod CIDRs (in its
// CiliumNode), hands out pod addresses from them, persists allocations so a
// restarted agent restores them, and serves POST/DELETE /v1/ipam.
package ipam

import (
	"context"
	"net/netip"
)

// Allocation is one allocated pod address.
type Allocation struct {
	IP      netip.Addr
	Gateway netip.Addr     // the node's router IP
	CIDRs   []netip.Prefix // the node's pod CIDRs
	Owner   string         // "namespace/pod" or another owner name
}

// Allocator hands out pod addresses. Safe for concurrent use.
type Allocator interface {
	// AllocateNext allocates the next free address to owner. It waits
	// (bounded by ctx) until the node has pod CIDRs.
	AllocateNext(ctx context.Context, owner string) (Allocation, error)
	// AllocateIP claims a specific address for owner (restore). Claiming
	// an address already held by the same owner succeeds.
	AllocateIP(ctx context.Context, ip netip.Addr, owner string) (Allocation, error)
	// Release frees an address; releasing a free address is not an error.
	Release(ip netip.Addr) error
	// RouterIP is the node's router (gateway) IP, once known.
	RouterIP() (netip.Addr, bool)
}
