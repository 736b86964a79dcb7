package nodes

import (
	"fmt"
	"net/netip"
	"strings"

	"github.com/cilium/statedb"
	"github.com/cilium/statedb/index"
)

// Table names, as shown by GET /v1/statedb/{table}.
const (
	// NodesTableName is the table of every node of the cluster.
	NodesTableName = "nodes"
	// LocalNodeTableName is the one-row table of this agent's own node.
	LocalNodeTableName = "local-node"
)

// Sources of a node row: where its information came from. The values are
// Cilium's (`cilium-dbg node list`, column Source).
const (
	// SourceLocal marks the node the agent runs on.
	SourceLocal = "local"
	// SourceCustomResource marks a node learnt from its CiliumNode.
	SourceCustomResource = "custom-resource"
	// SourceKVStore marks a node learnt from its kvstore key
	// (cilium/state/nodes/v1); it wins over the node's CiliumNode.
	SourceKVStore = "kvstore"
)

// Address kinds used in Address.Type; they are the CiliumNode address
// types (spec.addresses[].type).
const (
	AddressInternalIP       = "InternalIP"
	AddressExternalIP       = "ExternalIP"
	AddressCiliumInternalIP = "CiliumInternalIP"
)

// Address is one address of a node.
type Address struct {
	// Type is the kind of address: InternalIP, ExternalIP,
	// CiliumInternalIP (the router IP on cilium_host), ...
	Type string `json:"type"`
	// IP is the address.
	IP netip.Addr `json:"ip"`
}

// Node is one node of the cluster, from its CiliumNode.
type Node struct {
	// Name is the Kubernetes node name (= the CiliumNode's name).
	Name string `json:"name"`
	// Addresses are the CiliumNode's spec.addresses that parse as IPs,
	// in their order.
	Addresses []Address `json:"addresses,omitempty"`
	// PodCIDRs are spec.ipam.podCIDRs that parse as prefixes.
	PodCIDRs []netip.Prefix `json:"pod-cidrs,omitempty"`
	// HealthIPv4 is the node's health endpoint address (spec.health.ipv4);
	// invalid when unset.
	HealthIPv4 netip.Addr `json:"health-ipv4,omitzero"`
	// BootID is the node kernel's boot ID (spec.bootid).
	BootID string `json:"boot-id,omitempty"`
	// Local is true for the node this agent runs on.
	Local bool `json:"local,omitempty"`
	// Source is where the row came from: SourceLocal,
	// SourceCustomResource or SourceKVStore.
	Source string `json:"source"`
	// Refused lists what of the CiliumNode the agent leaves out of the
	// row (and so out of the ipcache, routes and health probes), and why:
	// a malformed address, or an address or pod CIDR an older node holds.
	Refused []Refusal `json:"refused,omitempty"`
}

// RefusalReason is why a part of a CiliumNode is left out of the nodes
// table; it is the reason label of the cellium_nodes_refused metric.
type RefusalReason string

// The reasons, in the order they are checked.
const (
	// RefusedMalformedAddress: a spec.addresses[].ip or spec.health.ipv4
	// that is not an IP address, or is one no node can have (unspecified,
	// loopback, multicast, link-local).
	RefusedMalformedAddress RefusalReason = "malformed-address"
	// RefusedMalformedPodCIDR: a spec.ipam.podCIDRs entry that is not a
	// prefix, or is a default route (/0).
	RefusedMalformedPodCIDR RefusalReason = "malformed-pod-cidr"
	// RefusedDuplicateNodeIP: another node (the local one, else the one
	// whose CiliumNode is older) has the same address.
	RefusedDuplicateNodeIP RefusalReason = "duplicate-node-ip"
	// RefusedDuplicatePodCIDR: the pod CIDR overlaps one of another node
	// (the local one, else the one whose CiliumNode is older).
	RefusedDuplicatePodCIDR RefusalReason = "duplicate-pod-cidr"
)

// RefusalReasons lists every RefusalReason, in the order they are checked.
var RefusalReasons = []RefusalReason{RefusedMalformedAddress, RefusedMalformedPodCIDR,
	RefusedDuplicateNodeIP, RefusedDuplicatePodCIDR}

// Refusal is one part of a CiliumNode left out of its nodes row.
type Refusal struct {
	// Field is where in the CiliumNode it is: "spec.addresses[1]",
	// "spec.ipam.podCIDRs[0]", "spec.health.ipv4".
	Field string `json:"field"`
	// Value is the text found there.
	Value string `json:"value"`
	// Reason says why it is refused.
	Reason RefusalReason `json:"reason"`
	// Holder names the node that keeps the address or CIDR (duplicates
	// only).
	Holder string `json:"holder,omitempty"`
}

// String says what was refused and why, for logs and the doctor.
func (r Refusal) String() string {
	s := fmt.Sprintf("%s %q: %s", r.Field, r.Value, r.Reason)
	if r.Holder != "" {
		s += " (held by node " + r.Holder + ")"
	}
	return s
}

// Address returns the first address of the given type and IPv4 family if
// there is one, else the first of that type.
func (n *Node) Address(typ string) (netip.Addr, bool) {
	return firstAddress(n.Addresses, typ)
}

func firstAddress(addrs []Address, typ string) (netip.Addr, bool) {
	var other netip.Addr
	for _, a := range addrs {
		if a.Type != typ {
			continue
		}
		if a.IP.Is4() {
			return a.IP, true
		}
		if !other.IsValid() {
			other = a.IP
		}
	}
	return other, other.IsValid()
}

// TableHeader implements statedb.TableWritable.
func (*Node) TableHeader() []string {
	return []string{"Name", "InternalIP", "CiliumInternalIP", "PodCIDRs", "HealthIPv4", "BootID", "Source", "Refused"}
}

// TableRow implements statedb.TableWritable.
func (n *Node) TableRow() []string {
	internal, _ := n.Address(AddressInternalIP)
	router, _ := n.Address(AddressCiliumInternalIP)
	refused := make([]string, len(n.Refused))
	for i, r := range n.Refused {
		refused[i] = r.String()
	}
	return []string{n.Name, addrString(internal), addrString(router), prefixesString(n.PodCIDRs), addrString(n.HealthIPv4),
		n.BootID, n.Source, strings.Join(refused, "; ")}
}

func addrString(a netip.Addr) string {
	if !a.IsValid() {
		return ""
	}
	return a.String()
}

func prefixesString(ps []netip.Prefix) string {
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = p.String()
	}
	return strings.Join(s, ",")
}

// NodeNameIndex is the primary index of the nodes table: the node name.
var NodeNameIndex = statedb.Index[*Node, string]{
	Name:       "name",
	FromObject: func(n *Node) index.KeySet { return index.NewKeySet(index.String(n.Name)) },
	FromKey:    index.String,
	FromString: index.FromString,
	Unique:     true,
}

// NodeInternalIPIndex indexes nodes by their InternalIP addresses: a
// CiliumEndpoint names its node by one (status.networking.node).
var NodeInternalIPIndex = statedb.Index[*Node, netip.Addr]{
	Name: "internal-ip",
	FromObject: func(n *Node) index.KeySet {
		var keys []index.Key
		for _, a := range n.Addresses {
			if a.Type == AddressInternalIP && a.IP.IsValid() {
				keys = append(keys, index.NetIPAddr(a.IP.Unmap()))
			}
		}
		if len(keys) == 0 {
			return index.KeySet{}
		}
		return index.NewKeySet(keys[0], keys[1:]...)
	},
	FromKey:    index.NetIPAddr,
	FromString: index.NetIPAddrString,
}

// NewNodesTable creates the nodes table (indexed also by InternalIP).
// nodediscovery owns it.
func NewNodesTable(db *statedb.DB) (statedb.RWTable[*Node], error) {
	t, err := statedb.NewTable(db, NodesTableName, NodeNameIndex, NodeInternalIPIndex)
	if err != nil {
		return nil, fmt.Errorf("create table %s: %w", NodesTableName, err)
	}
	return t, nil
}
