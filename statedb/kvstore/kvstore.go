// Package kvstore defines the tables of what the agent reads from the etcd
// kvstore (--kvstore=etcd) besides identities:
//
//   - "kvstore-nodes": the other nodes' keys under cilium/state/nodes/v1,
//     parsed. nodediscovery merges them into the nodes table (a node's
//     key wins over its CiliumNode).
//   - "kvstore-ipcache": the ipcache entries under cilium/state/ip/v1,
//     written by the agents for their endpoints, parsed. The ipcache cell
//     turns them into rows of source "kvstore".
//
// cells/kvstoresync fills both (only it writes them); without --kvstore
// they stay empty and are initialized at once. Keys that do not parse are
// never rows. Rows are immutable.
package kvstore

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	"github.com/cilium/statedb"
	"github.com/cilium/statedb/index"

	"github.com/cellium/cellium/statedb/identity"
	"github.com/cellium/cellium/statedb/nodes"
)

// Table names (`cellium statedb <name>`).
const (
	NodesTableName   = "kvstore-nodes"
	IPCacheTableName = "kvstore-ipcache"
)

// Node is another node as its kvstore key describes it.
type Node struct {
	// Key is the etcd key (cilium/state/nodes/v1/<cluster>/<name>).
	Key string `json:"key"`
	// Name and Cluster are the node's (the key's last two parts).
	Name    string `json:"name"`
	Cluster string `json:"cluster"`
	// Addresses are the node's IPAddresses (InternalIP, ExternalIP,
	// CiliumInternalIP), in their order.
	Addresses []nodes.Address `json:"addresses,omitempty"`
	// PodCIDRs are IPv4AllocCIDR, IPv6AllocCIDR and the secondary ones.
	PodCIDRs []netip.Prefix `json:"pod-cidrs,omitempty"`
	// HealthIPv4 is IPv4HealthIP; invalid when unset.
	HealthIPv4 netip.Addr `json:"health-ipv4,omitzero"`
	// BootID is the node kernel's boot ID.
	BootID string `json:"boot-id,omitempty"`
	// ModRevision is the key's etcd revision.
	ModRevision int64 `json:"mod-revision"`
}

// TableHeader implements statedb.TableWritable.
func (*Node) TableHeader() []string {
	return []string{"Name", "Cluster", "Addresses", "PodCIDRs", "HealthIPv4", "BootID", "Revision"}
}

// TableRow implements statedb.TableWritable.
func (n *Node) TableRow() []string {
	addrs := make([]string, len(n.Addresses))
	for i, a := range n.Addresses {
		addrs[i] = a.Type + "=" + a.IP.String()
	}
	cidrs := make([]string, len(n.PodCIDRs))
	for i, p := range n.PodCIDRs {
		cidrs[i] = p.String()
	}
	health := ""
	if n.HealthIPv4.IsValid() {
		health = n.HealthIPv4.String()
	}
	return []string{n.Name, n.Cluster, strings.Join(addrs, ","), strings.Join(cidrs, ","), health, n.BootID,
		strconv.FormatInt(n.ModRevision, 10)}
}

// NodeNameIndex is the kvstore-nodes table's primary index: the node name.
var NodeNameIndex = statedb.Index[*Node, string]{
	Name:       "name",
	FromObject: func(n *Node) index.KeySet { return index.NewKeySet(index.String(n.Name)) },
	FromKey:    index.String,
	FromString: index.FromString,
	Unique:     true,
}

// NewNodesTable creates and registers the kvstore-nodes table.
func NewNodesTable(db *statedb.DB) (statedb.RWTable[*Node], error) {
	t, err := statedb.NewTable(db, NodesTableName, NodeNameIndex)
	if err != nil {
		return nil, fmt.Errorf("create table %s: %w", NodesTableName, err)
	}
	return t, nil
}

// IPEntry is one ipcache key of the kvstore: an address (or prefix) of an
// endpoint of some node, its identity and the node it lives on.
type IPEntry struct {
	// Prefix is the address (a /32 or /128) or prefix of the key.
	Prefix netip.Prefix `json:"prefix"`
	// Identity is the value's ID, with host (1) read as remote-node (6),
	// as Cilium reads it.
	Identity identity.NumericIdentity `json:"identity"`
	// HostIP is the node the address lives on (the tunnel endpoint);
	// invalid when the value has none.
	HostIP netip.Addr `json:"host-ip,omitzero"`
	// EncryptKey is the value's Key (the IPsec key index).
	EncryptKey uint8 `json:"encrypt-key,omitempty"`
	// Metadata is the value's Metadata ("cilium-global:default:<node>:<endpoint ID>").
	Metadata string `json:"metadata,omitempty"`
	// Namespace and PodName are K8sNamespace and K8sPodName.
	Namespace string `json:"namespace,omitempty"`
	PodName   string `json:"pod-name,omitempty"`
	// ModRevision is the key's etcd revision.
	ModRevision int64 `json:"mod-revision"`
}

// TableHeader implements statedb.TableWritable.
func (*IPEntry) TableHeader() []string {
	return []string{"Prefix", "Identity", "HostIP", "Pod", "Metadata", "Revision"}
}

// TableRow implements statedb.TableWritable.
func (e *IPEntry) TableRow() []string {
	host, pod := "", ""
	if e.HostIP.IsValid() {
		host = e.HostIP.String()
	}
	if e.PodName != "" {
		pod = e.Namespace + "/" + e.PodName
	}
	return []string{e.Prefix.String(), e.Identity.String(), host, pod, e.Metadata, strconv.FormatInt(e.ModRevision, 10)}
}

// IPPrefixIndex is the kvstore-ipcache table's primary index: the prefix.
var IPPrefixIndex = statedb.Index[*IPEntry, netip.Prefix]{
	Name:       "prefix",
	FromObject: func(e *IPEntry) index.KeySet { return index.NewKeySet(index.NetIPPrefix(e.Prefix)) },
	FromKey:    index.NetIPPrefix,
	FromString: index.NetIPPrefixString,
	Unique:     true,
}

// NewIPCacheTable creates and registers the kvstore-ipcache table.
func NewIPCacheTable(db *statedb.DB) (statedb.RWTable[*IPEntry], error) {
	t, err := statedb.NewTable(db, IPCacheTableName, IPPrefixIndex)
	if err != nil {
		return nil, fmt.Errorf("create table %s: %w", IPCacheTableName, err)
	}
	return t, nil
}
