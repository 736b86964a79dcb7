package identity

import (
	"fmt"
	"math/bits"
	"strconv"
)

// NumericIdentity is the number of a security identity.
//
// Bits 0-23 go on the wire (in packets and BPF maps). With the default
// layout (255 connected clusters) bits 0-15 are the cluster-local number
// and bits 16-23 the cluster ID; see Layout for the 511-cluster layout.
// Bits 24-31 are the scope (see Scope): 0 for cluster-wide and reserved
// identities, 1 for node-local ones (CIDR, FQDN), 2 for remote nodes.
type NumericIdentity uint32

// Numbers and masks of the layout.
const (
	// InvalidIdentity (0) is no identity: not yet determined, or unknown.
	InvalidIdentity NumericIdentity = 0

	// NumericIdentityBitlength is how many bits of an identity go on the
	// wire.
	NumericIdentityBitlength = 24

	// UserReservedNumericIdentity (128) is the first of the identities
	// 128-255 that are reserved for users to assign by name.
	UserReservedNumericIdentity NumericIdentity = 128
	// MinimalNumericIdentity (256) is the first number not reserved; cluster
	// 0's allocation range starts here.
	MinimalNumericIdentity NumericIdentity = 256

	// IdentityScopeMask selects the scope bits of an identity.
	IdentityScopeMask NumericIdentity = 0xFF000000
	// IdentityScopeGlobal is the scope of cluster-wide and reserved
	// identities.
	IdentityScopeGlobal NumericIdentity = 0
	// IdentityScopeLocal is the scope of node-local identities (CIDR, FQDN
	// and other identities a node allocates for itself and never shares).
	IdentityScopeLocal NumericIdentity = 1 << 24
	// IdentityScopeRemoteNode is the scope of per-node identities for remote
	// nodes, used only when nodes are selected by their labels.
	IdentityScopeRemoteNode NumericIdentity = 2 << 24

	// MinAllocatorLocalIdentity and MaxAllocatorLocalIdentity bound the
	// number a node-local allocator hands out before it is OR-ed with
	// IdentityScopeLocal.
	MinAllocatorLocalIdentity = 1
	MaxAllocatorLocalIdentity = 0xFFFFFF
	// MinLocalIdentity (16777217) and MaxLocalIdentity (33554431) bound the
	// node-local identities themselves.
	MinLocalIdentity = MinAllocatorLocalIdentity | IdentityScopeLocal
	MaxLocalIdentity = MaxAllocatorLocalIdentity | IdentityScopeLocal
)

// ParseNumericIdentity reads a decimal identity, such as the name of a
// CiliumIdentity object ("40321").
//
// Possible errors: not a decimal number, or larger than 2^32-1.
func ParseNumericIdentity(s string) (NumericIdentity, error) {
	n, err := strconv.ParseUint(s, 10, 32)
	if err != nil {
		return InvalidIdentity, fmt.Errorf("parse numeric identity %q: %w", s, err)
	}
	return NumericIdentity(n), nil
}

// StringID returns the identity in decimal, the form of CiliumIdentity
// names and kvstore keys.
func (id NumericIdentity) StringID() string {
	return strconv.FormatUint(uint64(id), 10)
}

// String returns the name of a reserved identity ("host", "world", ...;
// "unknown" for 0) and the decimal number of any other.
func (id NumericIdentity) String() string {
	if id == InvalidIdentity {
		return "unknown"
	}
	if name := reservedName(id); name != "" {
		return name
	}
	return id.StringID()
}

// Uint32 returns the identity as the BPF programs and maps see it.
func (id NumericIdentity) Uint32() uint32 { return uint32(id) }

// Scope returns the scope bits: IdentityScopeGlobal, IdentityScopeLocal or
// IdentityScopeRemoteNode.
func (id NumericIdentity) Scope() NumericIdentity { return id & IdentityScopeMask }

// HasLocalScope reports whether the identity is node-local.
func (id NumericIdentity) HasLocalScope() bool { return id.Scope() == IdentityScopeLocal }

// IsReserved reports whether id is one of the reserved identities 1-10
// (see Reserved). 0 is not reserved but invalid.
func (id NumericIdentity) IsReserved() bool { return reservedName(id) != "" }

// IsUserReserved reports whether id is in 128-255, the range set aside for
// identities users assign by name.
func (id NumericIdentity) IsUserReserved() bool {
	return id >= UserReservedNumericIdentity && id < MinimalNumericIdentity
}

// Allowed values of max-connected-clusters.
const (
	// DefaultMaxConnectedClusters leaves 8 bits for the cluster ID and 16
	// for the cluster-local number.
	DefaultMaxConnectedClusters = 255
	// ExtendedMaxConnectedClusters leaves 9 bits for the cluster ID and 15
	// for the cluster-local number.
	ExtendedMaxConnectedClusters = 511
)

// Layout is the split of the 24 wire bits between cluster ID and
// cluster-local number for one cluster, and the range of identities that
// cluster's allocator hands out. It is the same for CRD and kvstore modes.
type Layout struct {
	clusterID uint32
	shift     uint // bits of the cluster-local number
}

// NewLayout returns the layout of the cluster with the given --cluster-id
// in a mesh of --max-connected-clusters clusters.
//
// Possible errors: maxConnectedClusters other than 255 or 511; clusterID
// larger than maxConnectedClusters. Both name the flag.
func NewLayout(clusterID, maxConnectedClusters uint32) (Layout, error) {
	if maxConnectedClusters != DefaultMaxConnectedClusters && maxConnectedClusters != ExtendedMaxConnectedClusters {
		return Layout{}, fmt.Errorf("--max-connected-clusters=%d: must be %d or %d",
			maxConnectedClusters, DefaultMaxConnectedClusters, ExtendedMaxConnectedClusters)
	}
	if clusterID > maxConnectedClusters {
		return Layout{}, fmt.Errorf("--cluster-id=%d: must be between 0 and %d (--max-connected-clusters)",
			clusterID, maxConnectedClusters)
	}
	clusterIDBits := uint(bits.Len32(maxConnectedClusters))
	return Layout{clusterID: clusterID, shift: NumericIdentityBitlength - clusterIDBits}, nil
}

// DefaultLayout is the layout of a single cluster: cluster ID 0, 255
// connected clusters, allocation range 256-65535.
func DefaultLayout() Layout {
	return Layout{clusterID: 0, shift: 16}
}

// ClusterID returns the cluster ID the layout was made for.
func (l Layout) ClusterID() uint32 { return l.clusterID }

// MinAllocation returns the smallest identity the cluster's allocator may
// hand out: 256 for cluster 0 (below are reserved identities), else
// clusterID<<shift (65536 for cluster 1 with 255 clusters).
func (l Layout) MinAllocation() NumericIdentity {
	if l.clusterID == 0 {
		return MinimalNumericIdentity
	}
	return NumericIdentity(l.clusterID << l.shift)
}

// MaxAllocation returns the largest identity the cluster's allocator may
// hand out: ((clusterID+1)<<shift)-1 (65535 for cluster 0 with 255
// clusters, 32767 with 511).
func (l Layout) MaxAllocation() NumericIdentity {
	return NumericIdentity((l.clusterID+1)<<l.shift - 1)
}

// InAllocationRange reports whether id is in [MinAllocation, MaxAllocation],
// that is whether this cluster's allocator could have handed it out.
func (l Layout) InAllocationRange(id NumericIdentity) bool {
	return id >= l.MinAllocation() && id <= l.MaxAllocation()
}

// ClusterIDOf returns the cluster ID bits of id under this layout (the
// cluster that allocated a global identity).
func (l Layout) ClusterIDOf(id NumericIdentity) uint32 {
	clusterIDBits := NumericIdentityBitlength - l.shift
	return (uint32(id) >> l.shift) & (1<<clusterIDBits - 1)
}
