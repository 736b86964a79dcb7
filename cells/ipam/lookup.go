package ipam

import (
	"context"
	"net/netip"
)

// Lookup answers who holds which address. nodediscovery uses it to keep
// the health endpoint's address across restarts.
type Lookup interface {
	// OwnedBy waits (bounded by ctx) until the node has pod CIDRs, then
	// returns the addresses allocated to owner in ascending order.
	//
	// Possible errors: one wrapping ErrNoPodCIDR and ctx's error when ctx
	// ends first.
	OwnedBy(ctx context.Context, owner string) ([]netip.Addr, error)
}
