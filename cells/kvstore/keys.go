package kvstore

import (
	"strings"

	"github.com/cellium/cellium/statedb/identity"
	"github.com/cellium/cellium/statedb/labels"
)

// Cilium's key layout under the etcd root (pkg/kvstore, pkg/allocator).
const (
	// StatePrefix holds every state key.
	StatePrefix = "cilium/state"
	// IdentitiesPrefix is the identity allocator's root.
	IdentitiesPrefix = StatePrefix + "/identities/v1"
	// IdentityIDPrefix + <ID> is an identity's master key; its value is
	// the labels key (labels.Labels.SortedList). Created only if absent,
	// without a lease: the operator's GC deletes it.
	IdentityIDPrefix = IdentitiesPrefix + "/id/"
	// IdentityValuePrefix + <labels key> + "/" + <node suffix> says that
	// a node uses the identity; its value is the decimal ID; leased.
	IdentityValuePrefix = IdentitiesPrefix + "/value/"
	// IdentityLocksPrefix + <labels key> is the lock agents take while
	// they allocate an identity for the labels.
	IdentityLocksPrefix = IdentitiesPrefix + "/locks/"
)

// IdentityIDKey is the master key of id.
func IdentityIDKey(id identity.NumericIdentity) string { return IdentityIDPrefix + id.StringID() }

// IdentityValueKey is the key saying that the node with suffix uses the
// identity of labelsKey.
func IdentityValueKey(labelsKey, suffix string) string {
	return IdentityValuePrefix + labelsKey + "/" + suffix
}

// IdentityValueKeysOf is the prefix of every node's value key of
// labelsKey.
func IdentityValueKeysOf(labelsKey string) string { return IdentityValuePrefix + labelsKey + "/" }

// ParseLabelsKey reads a master key's value. It returns false for
// anything that is not the canonical form Cilium writes
// ("source:key=value;" per label, sorted): garbage left by someone else.
func ParseLabelsKey(v []byte) (labels.Labels, bool) {
	s := string(v)
	if s == "" || !strings.HasSuffix(s, ";") {
		return labels.Labels{}, false
	}
	for part := range strings.SplitSeq(strings.TrimSuffix(s, ";"), ";") {
		if !strings.Contains(part, ":") || !strings.Contains(part, "=") {
			return labels.Labels{}, false
		}
	}
	l := labels.ParseSortedList(s)
	if l.Len() == 0 || l.SortedList() != s {
		return labels.Labels{}, false
	}
	return l, true
}

// ParseIdentityIDKey reads the number of a master key.
func ParseIdentityIDKey(key string) (identity.NumericIdentity, bool) {
	s, ok := strings.CutPrefix(key, IdentityIDPrefix)
	if !ok {
		return 0, false
	}
	id, err := identity.ParseNumericIdentity(s)
	if err != nil || id == identity.InvalidIdentity {
		return 0, false
	}
	return id, true
}

// NodesPrefix + "/" + <cluster> + "/" + <node name> is a node's key; its
// value is Cilium's pkg/node/types.Node as JSON; leased.
const NodesPrefix = StatePrefix + "/nodes/v1"

// NodeKey is the key of node name in cluster.
func NodeKey(cluster, name string) string {
	return NodesPrefix + "/" + strings.Trim(cluster+"/"+name, "/")
}
