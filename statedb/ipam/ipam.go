// Package ipam defines the IPAM allocations table: one row per address the
// node's IPAM has handed out (the router's and the health endpoint's
// included), with who holds it. The IPAM cell (cells/ipam) is its only
// writer; node discovery, the CNI configuration writer, the endpoint
// manager's health endpoint and the doctor read it.
//
// The table is initialized once the node has pod CIDRs and every restorer
// has handed over its addresses, that is once IPAM can allocate: before,
// it is empty and a reader waits (tables.WaitInitialized).
package ipam

import (
	"net/netip"

	"github.com/cilium/statedb"
	"github.com/cilium/statedb/index"
)

// TableName is the IPAM allocations table's name (`cellium statedb
// ipam-allocations`).
const TableName = "ipam-allocations"

// Owners the agent itself uses; a pod's allocation is owned by
// "namespace/name".
const (
	// RouterOwner owns the router (gateway) IP, the first address of the
	// node's first pod CIDR.
	RouterOwner = "router"
	// HealthOwner owns the address of the node's health endpoint.
	HealthOwner = "health"
)

// Allocation is one row: an allocated address and its holder. Rows are
// immutable: copy, then insert.
type Allocation struct {
	// IP is the allocated IPv4 address.
	IP netip.Addr `json:"ip"`
	// Owner is "namespace/pod" for a pod, RouterOwner or HealthOwner.
	Owner string `json:"owner"`
	// ContainerID is the CNI container ID of the attachment the address
	// was allocated for; empty for the agent's own addresses and for
	// callers that sent none.
	ContainerID string `json:"container-id,omitempty"`
}

// TableHeader implements statedb.TableWritable.
func (*Allocation) TableHeader() []string {
	return []string{"IP", "Owner", "ContainerID"}
}

// TableRow implements statedb.TableWritable.
func (a *Allocation) TableRow() []string {
	return []string{a.IP.String(), a.Owner, shortID(a.ContainerID)}
}

func shortID(s string) string {
	if len(s) > 12 {
		return s[:12]
	}
	return s
}

// Indexes of the IPAM allocations table.
var (
	// IPIndex is the primary index: the address. Iterating the table in
	// this index lists the allocations in address order.
	IPIndex = statedb.Index[*Allocation, netip.Addr]{
		Name:       "ip",
		FromObject: func(a *Allocation) index.KeySet { return index.NewKeySet(index.NetIPAddr(a.IP)) },
		FromKey:    index.NetIPAddr,
		FromString: index.NetIPAddrString,
		Unique:     true,
	}
	// OwnerIndex finds the addresses of an owner ("namespace/pod",
	// RouterOwner, HealthOwner), in address order.
	OwnerIndex = statedb.Index[*Allocation, string]{
		Name:       "owner",
		FromObject: func(a *Allocation) index.KeySet { return index.NewKeySet(index.String(a.Owner)) },
		FromKey:    index.String,
		FromString: index.FromString,
	}
	// ContainerIndex finds the addresses allocated for a CNI container ID;
	// allocations without one are not in it.
	ContainerIndex = statedb.Index[*Allocation, string]{
		Name: "container",
		FromObject: func(a *Allocation) index.KeySet {
			if a.ContainerID == "" {
				return index.KeySet{}
			}
			return index.NewKeySet(index.String(a.ContainerID))
		},
		FromKey:    index.String,
		FromString: index.FromString,
	}
)

// NewTable creates the IPAM allocations table.
//
// Possible errors: statedb's, when a table of that name is already
// registered with db.
func NewTable(db *statedb.DB) (statedb.RWTable[*Allocation], error) {
	return statedb.NewTable(db, TableName, IPIndex, OwnerIndex, ContainerIndex)
}

// RouterIP returns the router IP from the table, if IPAM has one.
func RouterIP(txn statedb.ReadTxn, t statedb.Table[*Allocation]) (netip.Addr, bool) {
	a, _, found := t.Get(txn, OwnerIndex.Query(RouterOwner))
	if !found {
		return netip.Addr{}, false
	}
	return a.IP, true
}

// OwnedBy returns the addresses allocated to owner, in ascending order.
func OwnedBy(txn statedb.ReadTxn, t statedb.Table[*Allocation], owner string) []netip.Addr {
	var out []netip.Addr
	for a := range t.List(txn, OwnerIndex.Query(owner)) {
		out = append(out, a.IP)
	}
	return out
}
