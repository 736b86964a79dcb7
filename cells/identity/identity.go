// Package identity allocates cluster-wide numeric security identities for
// sets of security-relevant labels, in CRD mode: each identity is a
// CiliumIdentity object named by its number whose security-labels are the
// labels. Several agents may allocate the same labels at once; they all end
// with the same number.
package identity

import (
	"context"

	"github.com/cellium/cellium/statedb/identity"
	"github.com/cellium/cellium/statedb/labels"
)

// Identity is a numeric identity and its labels.
type Identity struct {
	ID     identity.NumericIdentity
	Labels labels.Labels
}

// Allocator resolves label sets to identities and counts this agent's
// references to them. Safe for concurrent use. It has no lookup: readers
// of identities query the CiliumIdentity table (by name, or by labels with
// k8stables.CiliumIdentityLabelsIndex) and the identity-allocations table
// (statedb/identity).
type Allocator interface {
	// Allocate returns the identity of lbls, creating the CiliumIdentity if
	// none exists, and takes a reference. Reserved label sets (e.g.
	// reserved:health) resolve to reserved identities without any object.
	Allocate(ctx context.Context, lbls labels.Labels) (Identity, error)
	// Release drops a reference taken by Allocate. The object itself is
	// left to the operator's identity GC.
	Release(ctx context.Context, id identity.NumericIdentity) error
	// Restore records that lbls had identity id before the restart (an
	// endpoint restored from its state file): after a boot with the API
	// server unreachable, Allocate of a restored label set returns its
	// restored number at once instead of waiting for the API. The
	// reference is kept in the API as usual once it is reachable; a
	// conflict (the number was reused for other labels while the agent
	// was down) is reported by the allocator's health.
	Restore(lbls labels.Labels, id identity.NumericIdentity)
}
