// Package ipam is the agent's IP address management in cluster-pool mode:
// it waits for the operator to give this node pod CIDRs (in its
// CiliumNode), hands out pod addresses from them, records who holds each
// (the pod and the CNI container ID), persists allocations so a restarted
// agent restores them, frees allocations that no endpoint ever claimed,
// and serves POST/DELETE/GET /v1/ipam.
package ipam

import (
	"context"
	"net/netip"
	"time"
)

// Owner is who holds an address.
type Owner struct {
	// Name is "namespace/pod" for a pod, or another owner name
	// (HealthOwner).
	Name string
	// ContainerID is the CNI container ID of the attachment the address
	// was allocated for; empty for the agent's own addresses and for
	// callers that do not send one.
	ContainerID string
}

// String is the owner as the logs and error messages show it.
func (o Owner) String() string {
	if o.ContainerID == "" {
		return o.Name
	}
	return o.Name + " (container " + o.ContainerID + ")"
}

// Allocation is one allocated pod address.
type Allocation struct {
	IP          netip.Addr
	Gateway     netip.Addr     // the node's router IP
	CIDRs       []netip.Prefix // the node's pod CIDRs
	Owner       string         // "namespace/pod" or another owner name
	ContainerID string         // the CNI container ID, if the owner sent one
	// Since is when the address was allocated, restored or last claimed by
	// an endpoint; the IPAM garbage collector counts its grace from it.
	Since time.Time
}

// Claim is an address a restored endpoint holds.
type Claim struct {
	IP    netip.Addr
	Owner Owner
}

// Allocator hands out pod addresses. Safe for concurrent use.
type Allocator interface {
	// AllocateNext allocates the next free address to owner. It waits
	// (bounded by ctx) until the node has pod CIDRs and every registered
	// restorer (HoldForRestore) has handed over its addresses.
	AllocateNext(ctx context.Context, owner Owner) (Allocation, error)
	// AllocateIP claims a specific address for owner (restore). Claiming
	// an address already held by the same owner succeeds.
	AllocateIP(ctx context.Context, ip netip.Addr, owner Owner) (Allocation, error)
	// Claim checks that ip is allocated to owner (same name, and same
	// container ID when both sides have one) and marks it as used by an
	// endpoint. An allocation without a container ID takes owner's.
	//
	// Possible errors: ErrNotAllocated; ErrNotOwner naming the holder;
	// ErrNoPodCIDR when ctx ends before the pool exists.
	Claim(ctx context.Context, ip netip.Addr, owner Owner) error
	// Release frees an address whoever holds it (the admin's DELETE
	// /v1/ipam/{ip}); releasing a free address is not an error.
	Release(ip netip.Addr) error
	// ReleaseOwned frees ip only if owner holds it: with a container ID,
	// the allocation must carry the same one; without, the names must
	// match. released is false, with no error, when ip is free.
	//
	// Possible errors: ErrNotOwner naming the holder; a failure to write
	// the state file (the address is released in memory).
	ReleaseOwned(ip netip.Addr, owner Owner) (released bool, err error)
	// ReleaseContainer frees every address allocated with containerID and
	// returns them (none: nil, nil).
	ReleaseContainer(containerID string) ([]Allocation, error)
	// HoldForRestore registers a source of restored addresses (the
	// endpoint manager's saved endpoints). Call it before the hive starts.
	// AllocateNext serves nothing until the returned function has been
	// called, with the addresses to hold, so no restored address is handed
	// out to a new pod.
	HoldForRestore(name string) (done func([]Claim))
	// RouterIP is the node's router (gateway) IP, once known.
	RouterIP() (netip.Addr, bool)
}
