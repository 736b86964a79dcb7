// Package mapstate defines the tables of BPF map contents that the
// datapath derives itself, each row with its reconciliation status: the
// endpoints map (one row per local endpoint address) and the per-endpoint
// policy maps (one row per endpoint, with the policy revision the map
// holds). The datapath's map reconcilers (datapath/mapsync) write them;
// anyone may read them, the control plane included: "policy map of
// endpoint 12 at revision 7" is PolicyMap.Realized.
package mapstate

import (
	"fmt"
	"net/netip"
	"strconv"

	"github.com/cilium/statedb"
	"github.com/cilium/statedb/index"

	"github.com/cellium/cellium/statedb/identity"
	"github.com/cellium/cellium/statedb/policy"
	"github.com/cellium/cellium/statedb/reconciler"
)

// Table names (`cellium statedb <name>`).
const (
	EndpointsTableName = "lxc-map"
	PoliciesTableName  = "policy-maps"
)

// Endpoint is one entry of the endpoints map (cellium_lxc): a local
// endpoint's address and what the datapath needs to deliver to it. Rows
// are immutable: copy, then insert.
type Endpoint struct {
	// IP is the endpoint's address: the map key.
	IP netip.Addr `json:"ip"`
	// EndpointID is the endpoint.
	EndpointID uint16 `json:"endpoint-id"`
	// IfIndex is the host-side veth's ifindex.
	IfIndex uint32 `json:"ifindex"`
	// MAC is the pod side's MAC, NodeMAC the host side's ("" if unknown).
	MAC     string `json:"mac,omitempty"`
	NodeMAC string `json:"node-mac,omitempty"`
	// Identity is the endpoint's security identity (0 until resolved).
	Identity identity.NumericIdentity `json:"identity"`
	// Status is the reconciliation status of the map entry.
	Status reconciler.Status `json:"status"`
}

// SameAs reports whether e and o differ at most in Status.
func (e *Endpoint) SameAs(o *Endpoint) bool {
	return e.IP == o.IP && e.EndpointID == o.EndpointID && e.IfIndex == o.IfIndex && e.MAC == o.MAC &&
		e.NodeMAC == o.NodeMAC && e.Identity == o.Identity
}

// WithStatus returns a copy of e with status s.
func (e *Endpoint) WithStatus(s reconciler.Status) *Endpoint {
	c := *e
	c.Status = s
	return &c
}

// TableHeader implements statedb.TableWritable.
func (*Endpoint) TableHeader() []string {
	return []string{"IP", "Endpoint", "IfIndex", "MAC", "Identity", "Status"}
}

// TableRow implements statedb.TableWritable.
func (e *Endpoint) TableRow() []string {
	return []string{e.IP.String(), strconv.Itoa(int(e.EndpointID)), strconv.Itoa(int(e.IfIndex)), e.MAC,
		e.Identity.StringID(), e.Status.String()}
}

// EndpointIPIndex is the endpoints map table's primary index: the address.
var EndpointIPIndex = statedb.Index[*Endpoint, netip.Addr]{
	Name:       "ip",
	FromObject: func(e *Endpoint) index.KeySet { return index.NewKeySet(index.NetIPAddr(e.IP)) },
	FromKey:    index.NetIPAddr,
	FromString: index.NetIPAddrString,
	Unique:     true,
}

// NewEndpointsTable creates and registers the endpoints map table.
func NewEndpointsTable(db *statedb.DB) (statedb.RWTable[*Endpoint], error) {
	t, err := statedb.NewTable(db, EndpointsTableName, EndpointIPIndex)
	if err != nil {
		return nil, fmt.Errorf("create table %s: %w", EndpointsTableName, err)
	}
	return t, nil
}

// PolicyMap is the desired content of one endpoint's policy map
// (cellium_policy_<id>) and the revision the map holds. Rows are
// immutable: copy, then insert.
type PolicyMap struct {
	// EndpointID is the endpoint whose map this is.
	EndpointID uint16 `json:"endpoint-id"`
	// Identity is the identity the policy was computed for.
	Identity identity.NumericIdentity `json:"identity"`
	// Revision is the policy revision of Policy (desired).
	Revision uint64 `json:"revision"`
	// Entries is the number of map entries Policy asks for.
	Entries int `json:"entries"`
	// Policy is the desired policy (its entries, both directions).
	Policy *policy.EndpointPolicy `json:"-"`
	// Realized is the policy revision the map is known to hold: set when
	// a reconciliation of the row succeeds, kept while a newer revision is
	// pending. 0: the map has never been written.
	Realized uint64 `json:"realized-revision"`
	// Status is the reconciliation status of the map.
	Status reconciler.Status `json:"status"`
}

// NewPolicyMap returns the pending row for an endpoint's computed policy.
func NewPolicyMap(row *policy.EndpointPolicyRow) *PolicyMap {
	return &PolicyMap{EndpointID: row.EndpointID, Identity: row.Identity, Revision: row.Policy.Revision,
		Entries: len(row.Policy.Ingress.Entries) + len(row.Policy.Egress.Entries), Policy: row.Policy,
		Status: reconciler.Pending()}
}

// WithStatus returns a copy of p with status s; when s is Done the map
// holds Revision, which becomes Realized.
func (p *PolicyMap) WithStatus(s reconciler.Status) *PolicyMap {
	c := *p
	c.Status = s
	if s.Kind == reconciler.StatusDone {
		c.Realized = c.Revision
	}
	return &c
}

// RealizedAt reports whether the map holds policy revision rev or a
// newer one.
func (p *PolicyMap) RealizedAt(rev uint64) bool { return p.Realized >= rev && p.Realized != 0 }

// TableHeader implements statedb.TableWritable.
func (*PolicyMap) TableHeader() []string {
	return []string{"Endpoint", "Identity", "Revision", "Realized", "Entries", "Status"}
}

// TableRow implements statedb.TableWritable.
func (p *PolicyMap) TableRow() []string {
	return []string{strconv.Itoa(int(p.EndpointID)), p.Identity.StringID(), strconv.FormatUint(p.Revision, 10),
		strconv.FormatUint(p.Realized, 10), strconv.Itoa(p.Entries), p.Status.String()}
}

// PolicyEndpointIndex is the policy maps table's primary index: the
// endpoint ID.
var PolicyEndpointIndex = statedb.Index[*PolicyMap, uint16]{
	Name:       "endpoint",
	FromObject: func(p *PolicyMap) index.KeySet { return index.NewKeySet(index.Uint16(p.EndpointID)) },
	FromKey:    index.Uint16,
	FromString: index.Uint16String,
	Unique:     true,
}

// NewPoliciesTable creates and registers the policy maps table.
func NewPoliciesTable(db *statedb.DB) (statedb.RWTable[*PolicyMap], error) {
	t, err := statedb.NewTable(db, PoliciesTableName, PolicyEndpointIndex)
	if err != nil {
		return nil, fmt.Errorf("create table %s: %w", PoliciesTableName, err)
	}
	return t, nil
}
