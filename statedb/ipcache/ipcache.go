// Package ipcache defines the ipcache table: which security identity each
// IP prefix has, as the datapath's LPM-trie ipcache map must hold it. The
// control plane (cells/ipcache) derives the rows from the endpoints, nodes,
// CiliumEndpoint and policy CIDR tables; the datapath reconciles them into
// the BPF map and writes each row's status back.
//
// A prefix that is in no row is "world" (identity 2): the map's miss, not a
// row. When several sources claim one prefix, the one of highest
// precedence (Source.Precedence) wins and is the row; the others are not
// shown.
package ipcache

import (
	"fmt"
	"net/netip"

	"github.com/cilium/statedb"
	"github.com/cilium/statedb/index"

	"github.com/cellium/cellium/statedb/identity"
	"github.com/cellium/cellium/statedb/reconciler"
)

// TableName is the ipcache table's name (`cellium statedb ipcache`).
const TableName = "ipcache"

// Source is where an ipcache entry came from.
type Source string

// The sources, from the highest precedence to the lowest.
const (
	// SourceHost is the node's own addresses (its InternalIPs, the
	// router IP on cilium_host): identity host (1).
	SourceHost Source = "host"
	// SourceEndpoint is a local endpoint's address and its identity.
	SourceEndpoint Source = "endpoint"
	// SourceHealth is a health endpoint's address: identity health (4).
	SourceHealth Source = "health"
	// SourceRemoteNode is another node's addresses: identity
	// remote-node (6).
	SourceRemoteNode Source = "remote-node"
	// SourceKVStore is a pod of another node, from its ipcache key in the
	// etcd kvstore (cilium/state/ip/v1/default/<IP>, --kvstore=etcd). It
	// wins over the pod's CiliumEndpoint, as Cilium's kvstore source wins
	// over custom-resource.
	SourceKVStore Source = "kvstore"
	// SourceCiliumEndpoint is a pod of another node, from its
	// CiliumEndpoint.
	SourceCiliumEndpoint Source = "cilium-endpoint"
	// SourceServiceFrontend is a Service frontend address (a ClusterIP)
	// while the socket load balancer translates it: identity world (2),
	// with ServiceFrontend set, so that the datapath drops what a pod
	// sends to it untranslated.
	SourceServiceFrontend Source = "service-frontend"
	// SourceNodeCIDR is a pod CIDR of another node: identity world (2),
	// with the node's InternalIP as HostIP, so that the datapath knows
	// where an address of that node's pods lives before (or without) its
	// CiliumEndpoint; a pod's own /32 row is more specific and wins the
	// map's longest-prefix match.
	SourceNodeCIDR Source = "node-cidr"
	// SourcePolicyCIDR is a prefix a policy rule names, with the local
	// CIDR identity the policy engine gave it.
	SourcePolicyCIDR Source = "policy-cidr"
)

// Precedence orders sources when two claim the same prefix: the higher
// wins. What the agent knows first-hand (its node, its endpoints) beats
// what it learns from the cluster (other nodes, CiliumEndpoints), which
// beats what policy rules merely name. Between the two sources of other
// nodes' pods, the kvstore's key (written by the pod's agent itself) beats
// the CiliumEndpoint. A Service frontend address ranks
// just above a policy CIDR: nothing else should hold a ClusterIP, and a
// rule naming it (toCIDR: ClusterIP/32) must not lift the guard; a pod or
// node that does hold it keeps it unguarded. A remote node's pod CIDR
// ranks above a policy CIDR of the same prefix, which then becomes the
// row's CIDRIdentity, so that the row keeps its host IP. An unknown source
// has 0.
func (s Source) Precedence() int {
	switch s {
	case SourceHost:
		return 60
	case SourceEndpoint:
		return 50
	case SourceHealth:
		return 40
	case SourceRemoteNode:
		return 30
	case SourceKVStore:
		return 25
	case SourceCiliumEndpoint:
		return 20
	case SourceServiceFrontend:
		return 15
	case SourceNodeCIDR:
		return 12
	case SourcePolicyCIDR:
		return 10
	}
	return 0
}

// Entry is one row: the identity of the addresses of Prefix. Rows are
// immutable: copy, then insert.
type Entry struct {
	// Prefix is the address range (a /32 for a single IPv4 address).
	Prefix netip.Prefix `json:"prefix"`
	// Identity is the security identity of the addresses.
	Identity identity.NumericIdentity `json:"identity"`
	// Source is where the winning claim came from.
	Source Source `json:"source"`
	// Owner names the object that made the claim: "endpoint 12",
	// "node kind-worker", "cep default/web-1", "cidr".
	Owner string `json:"owner"`
	// HostIP is the node the addresses live on (the tunnel endpoint for
	// remote pods); invalid for the local node's own addresses and
	// endpoints and for CIDR prefixes.
	HostIP netip.Addr `json:"host-ip,omitzero"`
	// CIDRIdentity is the identity of the most specific prefix a policy
	// CIDR rule names that holds this one, when another source won it (a
	// pod's address inside an ipBlock): the datapath matches a policy on
	// it as well as on Identity, so that ipBlock selects pod addresses as
	// Kubernetes' NetworkPolicy conformance expects. 0: none.
	CIDRIdentity identity.NumericIdentity `json:"cidr-identity,omitzero"`
	// ServiceFrontend marks the address of a Service frontend the socket
	// load balancer translates (Source is SourceServiceFrontend): a packet
	// a pod sends to it has escaped the socket hooks, and the datapath
	// drops it (174 "Is a ClusterIP") before conntrack and policy.
	ServiceFrontend bool `json:"service-frontend,omitempty"`
	// NodeBootID is the boot ID of the other node whose CiliumNode gave
	// the row (its addresses, health IP and pod CIDRs): a node that
	// rebooted (a new boot ID) is treated as new, its rows and map entries
	// written again. Empty for every other row.
	NodeBootID string `json:"node-boot-id,omitempty"`
	// Status is the reconciliation status of the BPF map entry.
	Status reconciler.Status `json:"status"`
}

// SameAs reports whether e and o differ at most in Status.
func (e *Entry) SameAs(o *Entry) bool {
	return e.Prefix == o.Prefix && e.Identity == o.Identity && e.Source == o.Source &&
		e.Owner == o.Owner && e.HostIP == o.HostIP && e.CIDRIdentity == o.CIDRIdentity &&
		e.ServiceFrontend == o.ServiceFrontend && e.NodeBootID == o.NodeBootID
}

// WithStatus returns a copy of e with status s.
func (e *Entry) WithStatus(s reconciler.Status) *Entry {
	c := *e
	c.Status = s
	return &c
}

// GetStatus returns e's status (for reconciler.Config).
func GetStatus(e *Entry) reconciler.Status { return e.Status }

// TableHeader implements statedb.TableWritable.
func (*Entry) TableHeader() []string {
	return []string{"Prefix", "Identity", "Source", "Owner", "HostIP", "Status"}
}

// TableRow implements statedb.TableWritable.
func (e *Entry) TableRow() []string {
	host := ""
	if e.HostIP.IsValid() {
		host = e.HostIP.String()
	}
	return []string{e.Prefix.String(), e.Identity.String(), string(e.Source), e.Owner, host, e.Status.String()}
}

// PrefixIndex is the primary index: the prefix.
var PrefixIndex = statedb.Index[*Entry, netip.Prefix]{
	Name:       "prefix",
	FromObject: func(e *Entry) index.KeySet { return index.NewKeySet(index.NetIPPrefix(e.Prefix)) },
	FromKey:    index.NetIPPrefix,
	FromString: index.NetIPPrefixString,
	Unique:     true,
}

// NewTable creates and registers the ipcache table, indexed by prefix
// only: it has a row per pod of the cluster, and an index is a radix tree
// with a leaf per row (a source index, which nobody queried, cost 126
// bytes per remote endpoint).
func NewTable(db *statedb.DB) (statedb.RWTable[*Entry], error) {
	t, err := statedb.NewTable(db, TableName, PrefixIndex)
	if err != nil {
		return nil, fmt.Errorf("create table %s: %w", TableName, err)
	}
	return t, nil
}

// StatusTable is the ipcache table as its reconciler gets it: writable,
// for the rows' Status only. The control-plane cell that owns the table
// provides it for the datapath's reconciler; nobody else may write rows.
type StatusTable struct {
	statedb.RWTable[*Entry]
}
