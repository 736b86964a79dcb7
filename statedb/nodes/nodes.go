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
	// Source is where the row came from: SourceLocal or
	// SourceCustomResource.
	Source string `json:"source"`
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
	return []string{"Name", "InternalIP", "CiliumInternalIP", "PodCIDRs", "HealthIPv4", "Source"}
}

// TableRow implements statedb.TableWritable.
func (n *Node) TableRow() []string {
	internal, _ := n.Address(AddressInternalIP)
	router, _ := n.Address(AddressCiliumInternalIP)
	return []string{n.Name, addrString(internal), addrString(router), prefixesString(n.PodCIDRs), addrString(n.HealthIPv4), n.Source}
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
