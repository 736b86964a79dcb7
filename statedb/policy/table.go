package policy

import (
	"fmt"
	"net/netip"
	"strconv"
	"time"

	"github.com/cilium/statedb"
	"github.com/cilium/statedb/index"

	"github.com/cellium/cellium/statedb/identity"
)

// TableName is the name of the desired endpoint policy table.
const TableName = "endpoint-policies"

// EndpointPolicyRow is the desired policy of one local endpoint, written by
// the policy cell whenever the endpoint's computed policy changes. Rows are
// immutable: copy, then insert.
type EndpointPolicyRow struct {
	// EndpointID is the local endpoint.
	EndpointID uint16 `json:"endpoint-id"`
	// Identity is the endpoint's identity the policy was computed for.
	Identity identity.NumericIdentity `json:"identity"`
	// Policy is the computed policy; its Revision is the repository
	// revision it reflects.
	Policy *EndpointPolicy `json:"policy"`
	// PendingRevision is non-zero while the policy cell knows that a
	// change of the repository (at this revision) affects the endpoint and
	// has not recomputed its policy yet; Policy is then still the previous
	// computation. The endpoint manager shows such an endpoint as
	// waiting-to-regenerate.
	PendingRevision uint64 `json:"pending-revision,omitempty"`
	// Seen is when the policy cell took the change (of a policy, an
	// identity, a pod or the endpoint) that this computation answers: its
	// own clock, for measuring how long a change takes to reach the
	// datapath (make bench-datapath). The zero time: unknown.
	Seen time.Time `json:"seen,omitzero"`
}

// Computed reports whether the row holds the policy of identity id,
// computed and not waiting for a recomputation.
func (r *EndpointPolicyRow) Computed(id identity.NumericIdentity) bool {
	return r != nil && r.Policy != nil && r.PendingRevision == 0 && r.Identity == id && id != identity.InvalidIdentity
}

// WithPending returns a copy marked as waiting for a recomputation at
// repository revision rev.
func (r *EndpointPolicyRow) WithPending(rev uint64) *EndpointPolicyRow {
	c := *r
	c.PendingRevision = rev
	return &c
}

// TableHeader implements statedb.TableWritable.
func (r *EndpointPolicyRow) TableHeader() []string {
	return []string{"Endpoint", "Identity", "Revision", "Pending", "Ingress", "Egress"}
}

// TableRow implements statedb.TableWritable.
func (r *EndpointPolicyRow) TableRow() []string {
	dir := func(d *DirectionPolicy) string {
		s := "non-enforcing"
		if d.Enforcing {
			s = "enforcing"
		}
		return fmt.Sprintf("%s (%d entries)", s, len(d.Entries))
	}
	pending := ""
	if r.PendingRevision != 0 {
		pending = strconv.FormatUint(r.PendingRevision, 10)
	}
	return []string{strconv.Itoa(int(r.EndpointID)), r.Identity.StringID(), strconv.FormatUint(r.Policy.Revision, 10),
		pending, dir(&r.Policy.Ingress), dir(&r.Policy.Egress)}
}

// EndpointIDIndex is the table's primary index: the endpoint ID.
var EndpointIDIndex = statedb.Index[*EndpointPolicyRow, uint16]{
	Name:       "id",
	FromObject: func(r *EndpointPolicyRow) index.KeySet { return index.NewKeySet(index.Uint16(r.EndpointID)) },
	FromKey:    index.Uint16,
	FromString: index.Uint16String,
	Unique:     true,
}

// NewTable creates and registers the desired endpoint policy table.
func NewTable(db *statedb.DB) (statedb.RWTable[*EndpointPolicyRow], error) {
	t, err := statedb.NewTable(db, TableName, EndpointIDIndex)
	if err != nil {
		return nil, fmt.Errorf("create table %s: %w", TableName, err)
	}
	return t, nil
}

// CIDRTableName is the name of the table of prefixes that rules use.
const CIDRTableName = "policy-cidr-identities"

// CIDRIdentity is a prefix some rule names (in a CIDR, CIDR set or except)
// and the node-local identity the policy engine gave it. The datapath's
// ipcache maps addresses of the prefix to the identity (longest prefix
// wins), which is how CIDR rules and their exceptions take effect.
type CIDRIdentity struct {
	Prefix   netip.Prefix             `json:"prefix"`
	Identity identity.NumericIdentity `json:"identity"`
}

// TableHeader implements statedb.TableWritable.
func (c *CIDRIdentity) TableHeader() []string { return []string{"Prefix", "Identity"} }

// TableRow implements statedb.TableWritable.
func (c *CIDRIdentity) TableRow() []string {
	return []string{c.Prefix.String(), c.Identity.StringID()}
}

// CIDRPrefixIndex is the CIDR table's primary index: the prefix.
var CIDRPrefixIndex = statedb.Index[*CIDRIdentity, netip.Prefix]{
	Name:       "prefix",
	FromObject: func(c *CIDRIdentity) index.KeySet { return index.NewKeySet(index.NetIPPrefix(c.Prefix)) },
	FromKey:    index.NetIPPrefix,
	FromString: index.NetIPPrefixString,
	Unique:     true,
}

// NewCIDRTable creates and registers the CIDR identity table.
func NewCIDRTable(db *statedb.DB) (statedb.RWTable[*CIDRIdentity], error) {
	t, err := statedb.NewTable(db, CIDRTableName, CIDRPrefixIndex)
	if err != nil {
		return nil, fmt.Errorf("create table %s: %w", CIDRTableName, err)
	}
	return t, nil
}
