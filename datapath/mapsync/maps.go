package mapsync

import (
	"net/netip"

	"github.com/cellium/cellium/statedb/policy"
)

// Map is the part of one BPF map the reconcilers use, with Go keys and
// values. Implementations must make Delete idempotent.
type Map[K comparable, V comparable] interface {
	// Update writes every pair keys[i] -> values[i], in one batch when the
	// kernel allows. On error some pairs may have been written.
	Update(keys []K, values []V) error
	// Delete removes keys; a key that is not there is not an error.
	Delete(keys []K) error
	// Dump returns every entry of the map.
	Dump() (map[K]V, error)
}

// PolicyMap is one endpoint's open policy map. Close releases it (the
// pinned map stays).
type PolicyMap interface {
	Map[policy.Key, PolicyValue]
	// MaxEntries is the map's capacity.
	MaxEntries() int
	Close() error
}

// PolicyMaps are the per-endpoint policy maps pinned in the agent's bpffs
// directory.
type PolicyMaps interface {
	// Open opens the pinned policy map of endpoint id, creating and
	// pinning it when missing.
	Open(id uint16) (PolicyMap, error)
	// Remove unpins the policy map of endpoint id; a missing map is not
	// an error.
	Remove(id uint16) error
	// List returns the endpoint IDs that have a pinned policy map.
	List() ([]uint16, error)
}

// IPCacheValue is the value of a cellium_ipcache entry.
type IPCacheValue struct {
	// Identity is the prefix's security identity.
	Identity uint32
	// TunnelEndpoint is the node the addresses live on (invalid: none).
	TunnelEndpoint netip.Addr
	// CIDRIdentity is the identity of the policy CIDR that also holds the
	// prefix (0: none).
	CIDRIdentity uint32
	// ServiceFrontend marks a Service frontend address the socket load
	// balancer translates (the map's flag IPCACHE_F_SERVICE).
	ServiceFrontend bool
}

// EndpointInfo is the value of a cellium_lxc entry.
type EndpointInfo struct {
	IfIndex    uint32
	EndpointID uint16
	MAC        [6]byte
	NodeMAC    [6]byte
	Identity   uint32
}

// PolicyValue is the value of a policy map entry.
type PolicyValue struct {
	// Deny marks a deny entry.
	Deny bool
	// LPMPrefixLen is the entry's protocol and port prefix length
	// (policy.Key.LPMPrefixLen).
	LPMPrefixLen uint8
}
