package identity

import (
	"context"
	"fmt"
	"log/slog"
	"sync"

	"github.com/cilium/statedb"

	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/statedb/identity"
	"github.com/cellium/cellium/statedb/labels"
)

// Responder answers the identity requests table (statedb/identity
// Request, written by the endpoint manager) with an Allocator: each
// request holds one reference to the identity granted to it, taken when
// its attempt is answered and dropped when the request asks for other
// labels or goes. It is part of Cell; hives that provide their own
// Allocator (tests) add it beside it. Without a requests table it does
// nothing.
var Responder = hive.Invoke(registerResponder)

type responderParams struct {
	hive.In
	DB        *statedb.DB
	Log       *slog.Logger
	Jobs      hive.Jobs
	Allocator Allocator
	// Answers is the requests table, provided by the endpoint manager.
	Answers identity.RequestAnswers `optional:"true"`
}

func registerResponder(p responderParams) {
	if p.Answers.RWTable == nil {
		return
	}
	r := newResponder(p.DB, p.Answers, p.Allocator, p.Log)
	p.Jobs.Add(hive.Service("identity-requests", r.subscribe, r.run))
}

// responder is the requests table's answering loop. Its maps are touched
// only by the loop's goroutine; allocations run in goroutines of their
// own and hand their results back over done.
type responder struct {
	db    *statedb.DB
	table statedb.RWTable[*identity.Request]
	alloc Allocator
	log   *slog.Logger

	changes statedb.ChangeIterator[*identity.Request]
	// started is the last attempt started for each endpoint, granted the
	// identity each endpoint's request holds a reference to.
	started map[uint16]uint64
	granted map[uint16]identity.NumericIdentity
	done    chan answer
	wg      sync.WaitGroup
}

// answer is the outcome of one attempt.
type answer struct {
	endpoint uint16
	attempt  uint64
	id       identity.NumericIdentity
	err      error
}

func newResponder(db *statedb.DB, answers identity.RequestAnswers, alloc Allocator, log *slog.Logger) *responder {
	return &responder{db: db, table: answers.RWTable, alloc: alloc, log: log,
		started: map[uint16]uint64{}, granted: map[uint16]identity.NumericIdentity{}, done: make(chan answer)}
}

func (r *responder) subscribe() error {
	wtxn := r.db.WriteTxn(r.table)
	defer wtxn.Commit()
	var err error
	if r.changes, err = r.table.Changes(wtxn); err != nil {
		return fmt.Errorf("subscribe to %s: %w", r.table.Name(), err)
	}
	return nil
}

func (r *responder) run(ctx context.Context, h hive.Health) {
	actx, cancel := context.WithCancel(ctx)
	defer func() {
		cancel()
		// Drain the running attempts; the process is stopping, so their
		// references are not dropped one by one.
		go func() { r.wg.Wait(); close(r.done) }()
		for range r.done {
		}
	}()
	h.OK("answering")
	for {
		changes, watch := r.changes.Next(r.db.ReadTxn())
		var asked []*identity.Request
		for ch := range changes {
			req := ch.Object
			if ch.Deleted {
				delete(r.started, req.Endpoint)
				r.release(ctx, req.Endpoint, "endpoint gone")
				continue
			}
			// Every restored number first, before any allocation the
			// same batch asks for.
			if req.Restored != identity.InvalidIdentity && req.Labels.Len() > 0 {
				r.alloc.Restore(req.Labels, req.Restored)
			}
			if req.Attempt != 0 && req.Attempt != r.started[req.Endpoint] && !req.Answered() {
				asked = append(asked, req)
			}
		}
		for _, req := range asked {
			r.started[req.Endpoint] = req.Attempt
			r.wg.Add(1)
			go func(ep uint16, attempt uint64, lbls labels.Labels) {
				defer r.wg.Done()
				id, err := r.alloc.Allocate(actx, lbls)
				select {
				case r.done <- answer{endpoint: ep, attempt: attempt, id: id.ID, err: err}:
				case <-actx.Done():
					// The loop is gone: the answer is dropped with the process.
				}
			}(req.Endpoint, req.Attempt, req.Labels)
		}
		select {
		case <-ctx.Done():
			return
		case <-watch:
		case a := <-r.done:
			if err := r.answer(ctx, a); err != nil {
				h.Degraded("answer identity request", err)
			} else {
				h.OK("answering")
			}
		}
	}
}

// answer writes a's outcome into its request if the request still asks
// that attempt; an identity granted to a request that moved on or went is
// released at once. On success the reference the request held before is
// dropped first, so that the requester, once it sees the answer, holds
// exactly one.
func (r *responder) answer(ctx context.Context, a answer) error {
	wtxn := r.db.WriteTxn(r.table)
	defer wtxn.Abort()
	req, _, ok := r.table.Get(wtxn, identity.RequestEndpointIndex.Query(a.endpoint))
	if !ok || req.Attempt != a.attempt {
		if a.err == nil {
			r.drop(ctx, a.endpoint, a.id, "request withdrawn")
		}
		return nil
	}
	if a.err == nil {
		r.release(ctx, a.endpoint, "labels changed")
		r.granted[a.endpoint] = a.id
	}
	if _, _, err := r.table.Insert(wtxn, req.WithResult(identity.RequestResult{Attempt: a.attempt, ID: a.id, Err: a.err})); err != nil {
		return fmt.Errorf("answer the identity request of endpoint %d: %w", a.endpoint, err)
	}
	wtxn.Commit()
	return nil
}

// release drops the reference the request of endpoint holds, if any.
func (r *responder) release(ctx context.Context, endpoint uint16, why string) {
	if id, ok := r.granted[endpoint]; ok {
		delete(r.granted, endpoint)
		r.drop(ctx, endpoint, id, why)
	}
}

func (r *responder) drop(ctx context.Context, endpoint uint16, id identity.NumericIdentity, why string) {
	if err := r.alloc.Release(ctx, id); err != nil {
		r.log.Warn("release identity", "endpoint", endpoint, "identity", id, "reason", why, "error", err)
	}
}
