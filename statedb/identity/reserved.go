package identity

import (
	"github.com/cellium/cellium/statedb/labels"
)

// The reserved identities. Their numbers are fixed and the same on every
// node and in every cluster.
const (
	// ReservedIdentityHost (1) is the local node, including host-network pods.
	ReservedIdentityHost NumericIdentity = 1
	// ReservedIdentityWorld (2) is everything outside the cluster.
	ReservedIdentityWorld NumericIdentity = 2
	// ReservedIdentityUnmanaged (3) is a pod the agent does not manage.
	ReservedIdentityUnmanaged NumericIdentity = 3
	// ReservedIdentityHealth (4) is the node's cilium-health endpoint.
	ReservedIdentityHealth NumericIdentity = 4
	// ReservedIdentityInit (5) is an endpoint whose labels are not known yet.
	ReservedIdentityInit NumericIdentity = 5
	// ReservedIdentityRemoteNode (6) is any other node of the cluster (or of
	// a connected cluster).
	ReservedIdentityRemoteNode NumericIdentity = 6
	// ReservedIdentityKubeAPIServer (7) is a remote node that runs a
	// kube-apiserver backend.
	ReservedIdentityKubeAPIServer NumericIdentity = 7
	// ReservedIdentityIngress (8) is the source address of Ingress proxies.
	ReservedIdentityIngress NumericIdentity = 8
	// ReservedIdentityWorldIPv4 (9) is the IPv4 part of world, used when
	// world is split by address family (dual stack).
	ReservedIdentityWorldIPv4 NumericIdentity = 9
	// ReservedIdentityWorldIPv6 (10) is the IPv6 part of world.
	ReservedIdentityWorldIPv6 NumericIdentity = 10
)

// Reserved describes one reserved identity.
type Reserved struct {
	// ID is the fixed number.
	ID NumericIdentity
	// Name is the reserved label key and the identity's printed name.
	Name string
	// Labels are the identity's labels: "reserved:<Name>", and for
	// kube-apiserver also "reserved:remote-node".
	Labels labels.Labels
}

// reservedName returns the name of a reserved identity, "" for any other.
func reservedName(id NumericIdentity) string {
	switch id {
	case ReservedIdentityHost:
		return labels.IDNameHost
	case ReservedIdentityWorld:
		return labels.IDNameWorld
	case ReservedIdentityUnmanaged:
		return labels.IDNameUnmanaged
	case ReservedIdentityHealth:
		return labels.IDNameHealth
	case ReservedIdentityInit:
		return labels.IDNameInit
	case ReservedIdentityRemoteNode:
		return labels.IDNameRemoteNode
	case ReservedIdentityKubeAPIServer:
		return labels.IDNameKubeAPIServer
	case ReservedIdentityIngress:
		return labels.IDNameIngress
	case ReservedIdentityWorldIPv4:
		return labels.IDNameWorldIPv4
	case ReservedIdentityWorldIPv6:
		return labels.IDNameWorldIPv6
	}
	return ""
}

// AllReserved returns the reserved identities in ascending order.
func AllReserved() []Reserved {
	out := make([]Reserved, 0, ReservedIdentityWorldIPv6)
	for id := ReservedIdentityHost; id <= ReservedIdentityWorldIPv6; id++ {
		r, _ := LookupReserved(id)
		out = append(out, r)
	}
	return out
}

// LookupReserved returns the reserved identity with the given number.
func LookupReserved(id NumericIdentity) (Reserved, bool) {
	name := reservedName(id)
	if name == "" {
		return Reserved{}, false
	}
	lbls := labels.New(labels.Reserved(name))
	if id == ReservedIdentityKubeAPIServer {
		lbls = labels.New(labels.Reserved(name), labels.Reserved(labels.IDNameRemoteNode))
	}
	return Reserved{ID: id, Name: name, Labels: lbls}, true
}

// LookupReservedByName returns the number of the reserved identity with the
// given name ("host" -> 1).
func LookupReservedByName(name string) (NumericIdentity, bool) {
	for id := ReservedIdentityHost; id <= ReservedIdentityWorldIPv6; id++ {
		if reservedName(id) == name {
			return id, true
		}
	}
	return InvalidIdentity, false
}

// LookupReservedByLabels returns the reserved identity a label set resolves
// to without any allocation, following Cilium's rules:
//
//   - a set with the fixed-identity label (io.cilium.fixed-identity) never
//     resolves here (user-reserved identities are not supported);
//   - a set with "reserved:host" is the host (1), whatever else it holds
//     (the local node keeps its identity when its labels change);
//   - otherwise a set with "reserved:remote-node" is kube-apiserver (7) if
//     it also has "reserved:kube-apiserver", else remote-node (6);
//   - otherwise a set of exactly one reserved label resolves to the identity
//     of that name ("reserved:world" -> 2, "reserved:kube-apiserver" -> 7);
//   - anything else does not resolve: workloads cannot claim a reserved
//     identity by adding a reserved label to other labels.
//
// Cilium skips the remote-node rule when nodes get per-node identities
// (policy-cidr-match-mode=nodes or per-node labels); cellium does not
// support those modes.
func LookupReservedByLabels(lbls labels.Labels) (NumericIdentity, bool) {
	if _, ok := lbls.Get(labels.FixedIdentityLabel); ok {
		return InvalidIdentity, false
	}
	if !lbls.HasSource(labels.SourceReserved) {
		return InvalidIdentity, false
	}
	switch {
	case lbls.Has(labels.Reserved(labels.IDNameHost)):
		return ReservedIdentityHost, true
	case lbls.Has(labels.Reserved(labels.IDNameRemoteNode)):
		if lbls.Has(labels.Reserved(labels.IDNameKubeAPIServer)) {
			return ReservedIdentityKubeAPIServer, true
		}
		return ReservedIdentityRemoteNode, true
	case lbls.Len() == 1:
		return LookupReservedByName(lbls.List()[0].Key)
	}
	return InvalidIdentity, false
}

// ScopeForLabels returns the scope an identity for lbls is allocated in:
// IdentityScopeRemoteNode if lbls has "reserved:remote-node";
// IdentityScopeLocal if every label has source cidr, cidrgroup, fqdn or
// reserved (identities a node allocates for itself); IdentityScopeGlobal
// otherwise, including for the empty set. Call LookupReservedByLabels
// first: reserved identities are not allocated at all.
func ScopeForLabels(lbls labels.Labels) NumericIdentity {
	if lbls.Has(labels.Reserved(labels.IDNameRemoteNode)) {
		return IdentityScopeRemoteNode
	}
	if lbls.OnlySources(labels.SourceCIDR, labels.SourceCIDRGroup, labels.SourceFQDN, labels.SourceReserved) {
		return IdentityScopeLocal
	}
	return IdentityScopeGlobal
}
