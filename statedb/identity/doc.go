// Package identity owns the numbering of security identities: the
// NumericIdentity type, how its bits are laid out (scope, cluster ID,
// cluster-local number), the reserved identities with their fixed numbers
// and "reserved:" labels, and the range a cluster-wide allocator may hand
// out (Layout).
//
// The numbers are the compatibility surface with Cilium: they are the names
// of CiliumIdentity objects, the values in kvstore identity keys and the
// identities carried in packets and BPF maps, so they match Cilium's exactly.
//
// It also defines the identity-allocations table (Allocation): the
// identities this agent holds references to, written only by the identity
// allocator (cells/identity) and read by the doctor. Otherwise the package
// is pure data and functions: it allocates nothing and keeps no state. The
// allocators live in the identity cell.
package identity
