package identity

import "errors"

var (
	// ErrNoLabels is returned by Allocate for an empty label set: an
	// endpoint without labels has no identity to share (use the reserved
	// init identity until its labels are known).
	ErrNoLabels = errors.New("no labels: an identity needs at least one label")

	// ErrUnsupportedScope is returned by Allocate for label sets that need
	// a node-local identity (only cidr:, cidrgroup:, fqdn: and reserved:
	// labels). This allocator hands out cluster-wide identities only.
	ErrUnsupportedScope = errors.New("labels need a node-local (CIDR/FQDN) identity, which this allocator does not hand out")

	// ErrNoFreeIdentity is returned by Allocate when every number of the
	// cluster's identity range is taken. Unused identities are deleted by
	// the operator's identity GC; check that it runs.
	ErrNoFreeIdentity = errors.New("no free identity left in the cluster's range")

	// ErrNotAllocated is returned by Release for an identity this agent
	// holds no reference to.
	ErrNotAllocated = errors.New("identity not allocated by this agent")

	// ErrIdentityConflict means a CiliumIdentity this agent uses was
	// deleted and its number was taken by other labels before the agent
	// could create it again. The endpoints using it need a new identity.
	ErrIdentityConflict = errors.New("identity number now belongs to other labels")
)
