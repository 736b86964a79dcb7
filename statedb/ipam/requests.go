package ipam

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/cilium/statedb"
	"github.com/cilium/statedb/index"
)

// RequestsTableName is the name of the IPAM requests table (`cellium
// statedb ipam-requests`).
const RequestsTableName = "ipam-requests"

// RequestOp is what a request asks of IPAM.
type RequestOp string

// The operations.
const (
	// OpClaim: IP must be allocated to Owner (same name, and the same
	// container ID when both sides have one); IPAM marks it used by an
	// endpoint (cells/ipam Allocator.Claim).
	OpClaim RequestOp = "claim"
	// OpReleaseOwned: free IP only if Owner holds it (with a container
	// ID, the allocation must carry the same one; without, the names must
	// match).
	OpReleaseOwned RequestOp = "release"
	// OpReleaseContainer: free every address allocated with ContainerID.
	OpReleaseContainer RequestOp = "release-container"
	// OpHold: a restored endpoint held IP for Owner before the restart.
	// IPAM hands out no address before the requests table is initialized,
	// and then holds every OpHold address (restore).
	OpHold RequestOp = "hold"
)

// Request is a row of the IPAM requests table: a question of the
// endpoint manager (the CNI API's claims and releases, and the addresses
// of restored endpoints) that the IPAM cell answers in Result, the only
// field it writes. The endpoint manager inserts a request, waits for its
// answer and deletes it; a request deleted before it is answered is
// withdrawn. Rows are immutable: copy, then insert.
type Request struct {
	// ID numbers the request, unique for the process.
	ID uint64 `json:"id"`
	// Op is what is asked.
	Op RequestOp `json:"op"`
	// IP is the address (OpClaim, OpReleaseOwned, OpHold).
	IP netip.Addr `json:"ip,omitzero"`
	// Owner is "namespace/pod" (empty: any, for OpReleaseOwned with a
	// ContainerID).
	Owner string `json:"owner,omitempty"`
	// ContainerID is the CNI container ID, if the caller has one.
	ContainerID string `json:"container-id,omitempty"`
	// Deadline bounds the work (a claim waits for the pool until then);
	// zero: none.
	Deadline time.Time `json:"deadline,omitzero"`
	// Result is IPAM's answer.
	Result RequestResult `json:"result"`
}

// RequestResult is IPAM's answer to a request.
type RequestResult struct {
	// Done is set with the answer.
	Done bool `json:"done"`
	// Err is why the request failed (errors.Is works on the IPAM cell's
	// sentinel errors); nil on success.
	Err error `json:"-"`
	// Error is Err's text, for the CLI.
	Error string `json:"error,omitempty"`
	// Released are the addresses a release freed, with their holders.
	Released []Allocation `json:"released,omitempty"`
}

// WithResult returns a copy of r answered with res.
func (r *Request) WithResult(res RequestResult) *Request {
	c := *r
	res.Done = true
	if res.Err != nil {
		res.Error = res.Err.Error()
	}
	c.Result = res
	return &c
}

// TableHeader implements statedb.TableWritable.
func (*Request) TableHeader() []string {
	return []string{"ID", "Op", "IP", "Owner", "ContainerID", "Done", "Error"}
}

// TableRow implements statedb.TableWritable.
func (r *Request) TableRow() []string {
	ip := ""
	if r.IP.IsValid() {
		ip = r.IP.String()
	}
	return []string{strconv.FormatUint(r.ID, 10), string(r.Op), ip, r.Owner, r.ContainerID,
		strconv.FormatBool(r.Result.Done), strings.TrimSpace(r.Result.Error)}
}

// Indexes of the requests table.
var (
	// RequestIDIndex is the primary index: the request's number.
	RequestIDIndex = statedb.Index[*Request, uint64]{
		Name:       "id",
		FromObject: func(r *Request) index.KeySet { return index.NewKeySet(index.Uint64(r.ID)) },
		FromKey:    index.Uint64,
		FromString: index.Uint64String,
		Unique:     true,
	}
	// RequestOpIndex finds the requests of one operation (the OpHold rows).
	RequestOpIndex = statedb.Index[*Request, RequestOp]{
		Name:       "op",
		FromObject: func(r *Request) index.KeySet { return index.NewKeySet(index.String(string(r.Op))) },
		FromKey:    func(op RequestOp) index.Key { return index.String(string(op)) },
		FromString: index.FromString,
	}
)

// NewRequestsTable creates the IPAM requests table.
func NewRequestsTable(db *statedb.DB) (statedb.RWTable[*Request], error) {
	t, err := statedb.NewTable(db, RequestsTableName, RequestIDIndex, RequestOpIndex)
	if err != nil {
		return nil, fmt.Errorf("create table %s: %w", RequestsTableName, err)
	}
	return t, nil
}

// RequestAnswers is the requests table as the IPAM cell gets it:
// writable, for the rows' Result only. The endpoint manager, which owns
// the table, provides it; nobody else writes the table.
type RequestAnswers struct {
	statedb.RWTable[*Request]
}
