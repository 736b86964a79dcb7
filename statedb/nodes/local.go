package nodes

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"

	"github.com/cilium/statedb"
	"github.com/cilium/statedb/index"

	"github.com/cellium/cellium/statedb/reconciler"
)

// LocalNode is what this agent knows and publishes about its own node: the
// single row of the local-node table. The fields the agent owns are
// mirrored into the node's CiliumNode; PodCIDRs are read from it (the
// operator writes them).
type LocalNode struct {
	// Name is the node name (K8S_NODE_NAME).
	Name string `json:"name"`
	// UID is the Node object's UID, for the CiliumNode's ownerReference.
	UID string `json:"uid,omitempty"`
	// Labels and Annotations are the Node object's; the CiliumNode
	// carries the same, as Cilium's does.
	Labels      map[string]string `json:"labels,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
	// NodeAddresses are the Node object's InternalIP and ExternalIP
	// addresses from status.addresses, in their order.
	NodeAddresses []Address `json:"node-addresses"`
	// InternalIP is the node's first IPv4 InternalIP (else its first
	// InternalIP): the node IP of the CiliumEndpoints of its pods.
	InternalIP netip.Addr `json:"internal-ip"`
	// RouterIP is the first address of the first pod CIDR, which the
	// datapath puts on cilium_host and pods route through; published as
	// the CiliumInternalIP. Invalid until IPAM has pod CIDRs.
	RouterIP netip.Addr `json:"router-ip,omitzero"`
	// PodCIDRs are the node's pod CIDRs as the operator published them in
	// the CiliumNode (spec.ipam.podCIDRs); never written back by the agent.
	PodCIDRs []netip.Prefix `json:"pod-cidrs,omitempty"`
	// HealthIPv4 is the address of the node's health endpoint, allocated
	// from IPAM with owner "health"; invalid until allocated.
	HealthIPv4 netip.Addr `json:"health-ipv4,omitzero"`
	// BootID is the kernel's boot ID (/proc/sys/kernel/random/boot_id).
	BootID string `json:"boot-id"`
	// Status is the reconciliation status of the CiliumNode.
	Status reconciler.Status `json:"status"`
}

// Addresses returns the CiliumNode spec.addresses the node should have:
// the Node's addresses followed by the CiliumInternalIP when known.
func (n *LocalNode) Addresses() []Address {
	out := slices.Clone(n.NodeAddresses)
	if n.RouterIP.IsValid() {
		out = append(out, Address{Type: AddressCiliumInternalIP, IP: n.RouterIP})
	}
	return out
}

// WithStatus returns a copy of n with the status s.
func (n *LocalNode) WithStatus(s reconciler.Status) *LocalNode {
	c := *n
	c.Status = s
	return &c
}

// SameContent reports whether n and o differ only in Status (nil and
// empty maps and slices are equal). A new field must be compared here.
func (n *LocalNode) SameContent(o *LocalNode) bool {
	if n == nil || o == nil {
		return n == o
	}
	return n.Name == o.Name && n.UID == o.UID &&
		maps.Equal(n.Labels, o.Labels) && maps.Equal(n.Annotations, o.Annotations) &&
		slices.Equal(n.NodeAddresses, o.NodeAddresses) &&
		n.InternalIP == o.InternalIP && n.RouterIP == o.RouterIP &&
		slices.Equal(n.PodCIDRs, o.PodCIDRs) && n.HealthIPv4 == o.HealthIPv4 &&
		n.BootID == o.BootID
}

// TableHeader implements statedb.TableWritable.
func (*LocalNode) TableHeader() []string {
	return []string{"Name", "InternalIP", "RouterIP", "PodCIDRs", "HealthIPv4", "BootID", "Status"}
}

// TableRow implements statedb.TableWritable.
func (n *LocalNode) TableRow() []string {
	return []string{n.Name, addrString(n.InternalIP), addrString(n.RouterIP), prefixesString(n.PodCIDRs),
		addrString(n.HealthIPv4), n.BootID, n.Status.String()}
}

// LocalInternalIP returns the InternalIP of the node named name from the
// local-node table ("" while unknown) and a channel closed when that row
// changes. Readers outside nodediscovery learn the node's IP this way.
func LocalInternalIP(txn statedb.ReadTxn, t statedb.Table[*LocalNode], name string) (string, <-chan struct{}) {
	n, _, watch, found := t.GetWatch(txn, LocalNodeNameIndex.Query(name))
	if !found || !n.InternalIP.IsValid() {
		return "", watch
	}
	return n.InternalIP.String(), watch
}

// LocalNodeNameIndex is the primary index of the local-node table.
var LocalNodeNameIndex = statedb.Index[*LocalNode, string]{
	Name:       "name",
	FromObject: func(n *LocalNode) index.KeySet { return index.NewKeySet(index.String(n.Name)) },
	FromKey:    index.String,
	FromString: index.FromString,
	Unique:     true,
}

// NewLocalNodeTable creates the local-node table. nodediscovery owns it.
func NewLocalNodeTable(db *statedb.DB) (statedb.RWTable[*LocalNode], error) {
	t, err := statedb.NewTable(db, LocalNodeTableName, LocalNodeNameIndex)
	if err != nil {
		return nil, fmt.Errorf("create table %s: %w", LocalNodeTableName, err)
	}
	return t, nil
}
