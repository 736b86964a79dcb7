package identity

import (
	"fmt"
	"strconv"

	"github.com/cilium/statedb"
	"github.com/cilium/statedb/index"

	"github.com/cellium/cellium/statedb/labels"
	"github.com/cellium/cellium/statedb/reconciler"
)

// AllocationsTable is the name of the table of identities this agent holds
// references to (GET /v1/statedb/identity-allocations).
const AllocationsTable = "identity-allocations"

// Allocation is one identity this agent uses: a row of the allocations
// table, written only by the identity allocator (cells/identity), whose
// reconciler keeps its CiliumIdentity in the API (it creates the object
// again when it disappears and removes the operator's heartbeat mark).
// The doctor reads the references. Rows are immutable; writers insert
// copies (With).
type Allocation struct {
	// ID is the identity's number.
	ID NumericIdentity `json:"id"`
	// Labels are its security labels.
	Labels labels.Labels `json:"labels"`
	// Refs counts this agent's users of the identity (endpoints).
	Refs int `json:"refs"`
	// Status is the reconciler's: is the CiliumIdentity in the API?
	Status reconciler.Status `json:"status"`
}

// TableHeader implements statedb.TableWritable.
func (a *Allocation) TableHeader() []string { return []string{"ID", "Labels", "Refs", "Status"} }

// TableRow implements statedb.TableWritable.
func (a *Allocation) TableRow() []string {
	return []string{a.ID.StringID(), a.Labels.String(), strconv.Itoa(a.Refs), a.Status.String()}
}

// With returns a copy of a with refs and status.
func (a *Allocation) With(refs int, status reconciler.Status) *Allocation {
	c := *a
	c.Refs, c.Status = refs, status
	return &c
}

// Indexes of the allocations table.
var (
	// AllocationIDIndex is the primary index: the identity's number.
	AllocationIDIndex = statedb.Index[*Allocation, NumericIdentity]{
		Name:       "id",
		FromObject: func(a *Allocation) index.KeySet { return index.NewKeySet(index.Uint32(uint32(a.ID))) },
		FromKey:    func(id NumericIdentity) index.Key { return index.Uint32(uint32(id)) },
		FromString: index.Uint32String,
		Unique:     true,
	}
	// AllocationLabelsIndex finds the identity of a label set; the key is
	// labels.SortedList().
	AllocationLabelsIndex = statedb.Index[*Allocation, string]{
		Name:       "labels",
		FromObject: func(a *Allocation) index.KeySet { return index.NewKeySet(index.String(a.Labels.SortedList())) },
		FromKey:    index.String,
		FromString: index.FromString,
	}
)

// NewAllocationsTable creates the allocations table.
//
// Possible errors: statedb's, when a table of that name is already
// registered with db.
func NewAllocationsTable(db *statedb.DB) (statedb.RWTable[*Allocation], error) {
	t, err := statedb.NewTable(db, AllocationsTable, AllocationIDIndex, AllocationLabelsIndex)
	if err != nil {
		return nil, fmt.Errorf("create table %s: %w", AllocationsTable, err)
	}
	return t, nil
}
