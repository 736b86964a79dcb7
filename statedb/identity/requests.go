package identity

import (
	"fmt"
	"strconv"

	"github.com/cilium/statedb"
	"github.com/cilium/statedb/index"

	"github.com/cellium/cellium/statedb/labels"
)

// RequestsTable is the name of the identity requests table
// (`cellium statedb identity-requests`).
const RequestsTable = "identity-requests"

// Request is a row of the identity requests table: local endpoint
// Endpoint wants a reference to the identity of Labels. The endpoint
// manager writes the request (it inserts the row, changes its labels,
// asks again after a failure and deletes the row with its endpoint); the
// identity allocator answers in Result, the only field it writes, and
// holds one reference per row on the identity it granted, which it drops
// when the row asks for other labels or goes. Rows are immutable: copy,
// then insert.
type Request struct {
	// Endpoint is the local endpoint's ID: one request per endpoint.
	Endpoint uint16 `json:"endpoint"`
	// Labels are the security labels the endpoint wants an identity for.
	// Empty in a row that only carries Restored.
	Labels labels.Labels `json:"labels"`
	// Restored is the identity the endpoint had before the agent
	// restarted (0: none): the allocator may grant it again for Labels
	// while the cluster's CiliumIdentities are not listed yet (booted
	// with the API server unreachable).
	Restored NumericIdentity `json:"restored,omitzero"`
	// Attempt numbers the question: the requester sets a new one (unique
	// for the process) each time it asks, for new labels or again after a
	// failure; 0 asks nothing (a restored row before its endpoint is
	// resolved).
	Attempt uint64 `json:"attempt"`
	// Result is the allocator's answer.
	Result RequestResult `json:"result"`
}

// RequestResult is the identity allocator's answer to a request.
type RequestResult struct {
	// Attempt is the attempt answered; the answer is current when it
	// equals the request's Attempt.
	Attempt uint64 `json:"attempt,omitzero"`
	// ID is the identity granted (when Err is nil).
	ID NumericIdentity `json:"id,omitzero"`
	// Err is why the attempt failed; nil on success.
	Err error `json:"-"`
	// Error is Err's text, for the CLI.
	Error string `json:"error,omitempty"`
}

// Answered reports whether r holds the answer to its current attempt.
func (r *Request) Answered() bool { return r.Attempt != 0 && r.Result.Attempt == r.Attempt }

// WithResult returns a copy of r answered with res.
func (r *Request) WithResult(res RequestResult) *Request {
	c := *r
	if res.Err != nil {
		res.Error = res.Err.Error()
	}
	c.Result = res
	return &c
}

// TableHeader implements statedb.TableWritable.
func (*Request) TableHeader() []string {
	return []string{"Endpoint", "Labels", "Restored", "Attempt", "Identity", "Error"}
}

// TableRow implements statedb.TableWritable.
func (r *Request) TableRow() []string {
	id := ""
	if r.Answered() && r.Result.Err == nil {
		id = r.Result.ID.StringID()
	}
	restored := ""
	if r.Restored != InvalidIdentity {
		restored = r.Restored.StringID()
	}
	errText := ""
	if r.Answered() {
		errText = r.Result.Error
	}
	return []string{strconv.FormatUint(uint64(r.Endpoint), 10), r.Labels.String(), restored,
		strconv.FormatUint(r.Attempt, 10), id, errText}
}

// RequestEndpointIndex is the requests table's primary index: the
// endpoint ID.
var RequestEndpointIndex = statedb.Index[*Request, uint16]{
	Name:       "endpoint",
	FromObject: func(r *Request) index.KeySet { return index.NewKeySet(index.Uint16(r.Endpoint)) },
	FromKey:    index.Uint16,
	FromString: index.Uint16String,
	Unique:     true,
}

// NewRequestsTable creates the identity requests table.
//
// Possible errors: statedb's, when a table of that name is already
// registered with db.
func NewRequestsTable(db *statedb.DB) (statedb.RWTable[*Request], error) {
	t, err := statedb.NewTable(db, RequestsTable, RequestEndpointIndex)
	if err != nil {
		return nil, fmt.Errorf("create table %s: %w", RequestsTable, err)
	}
	return t, nil
}

// RequestAnswers is the requests table as the identity allocator gets
// it: writable, for the rows' Result only. The endpoint manager, which
// owns the table, provides it; nobody else writes the table.
type RequestAnswers struct {
	statedb.RWTable[*Request]
}
