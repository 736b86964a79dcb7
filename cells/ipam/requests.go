package ipam

import (
	"context"
	"fmt"
	"log/slog"
	"sync"

	"github.com/cilium/statedb"

	"github.com/cellium/cellium/cells/hive"
	ipamtables "github.com/cellium/cellium/statedb/ipam"
)

// Responder answers the IPAM requests table (statedb/ipam Request, written
// by the endpoint manager) with an Allocator: claims and releases of the
// CNI API, and, once the table is initialized, the addresses restored
// endpoints held (until then the Allocator hands out nothing: the
// responder registers as a restorer when the hive is built). It is part
// of Cell; hives that provide their own Allocator (tests) add it beside
// it. Without a requests table it does nothing.
var Responder = hive.Invoke(registerResponder)

type responderParams struct {
	hive.In
	DB        *statedb.DB
	Log       *slog.Logger
	Jobs      hive.Jobs
	Allocator Allocator
	// Answers is the requests table, provided by the endpoint manager.
	Answers ipamtables.RequestAnswers `optional:"true"`
}

func registerResponder(p responderParams) {
	if p.Answers.RWTable == nil {
		return
	}
	r := &responder{db: p.DB, table: p.Answers.RWTable, alloc: p.Allocator, log: p.Log,
		handOver: p.Allocator.HoldForRestore("endpoint-manager"), running: map[uint64]context.CancelFunc{}, done: make(chan answered)}
	p.Jobs.Add(hive.Service("ipam-requests", r.subscribe, r.run))
}

// responder is the requests table's answering loop. running is touched
// only by the loop's goroutine; each request is answered by a goroutine
// of its own (a claim may wait for the pool), which hands the answer back
// over done.
type responder struct {
	db    *statedb.DB
	table statedb.RWTable[*ipamtables.Request]
	alloc Allocator
	log   *slog.Logger

	// handOver gives the allocator the restored addresses; nil once
	// called.
	handOver func([]Claim)
	changes  statedb.ChangeIterator[*ipamtables.Request]
	running  map[uint64]context.CancelFunc
	done     chan answered
	wg       sync.WaitGroup
}

// answered is the answer to request id.
type answered struct {
	id  uint64
	res ipamtables.RequestResult
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
	defer func() {
		for _, cancel := range r.running {
			cancel()
		}
		go func() { r.wg.Wait(); close(r.done) }()
		for range r.done {
		}
	}()
	h.OK("answering")
	for {
		txn := r.db.ReadTxn()
		changes, watch := r.changes.Next(txn)
		for ch := range changes {
			req := ch.Object
			switch {
			case ch.Deleted:
				if cancel, ok := r.running[req.ID]; ok {
					cancel() // withdrawn
					delete(r.running, req.ID)
				}
			case req.Result.Done || req.Op == ipamtables.OpHold:
			case r.running[req.ID] == nil:
				r.start(ctx, req)
			}
		}
		var initWatch <-chan struct{}
		if r.handOver != nil {
			var ok bool
			if ok, initWatch = r.table.Initialized(txn); ok {
				if err := r.hold(txn); err != nil {
					h.Degraded("answer IPAM request", err)
				}
				initWatch = nil
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-watch:
		case <-initWatch:
		case a := <-r.done:
			if _, ok := r.running[a.id]; !ok {
				continue // withdrawn meanwhile
			}
			delete(r.running, a.id)
			if err := r.answer(a.id, a.res); err != nil {
				h.Degraded("answer IPAM request", err)
			} else {
				h.OK("answering")
			}
		}
	}
}

// start answers req in a goroutine of its own.
func (r *responder) start(ctx context.Context, req *ipamtables.Request) {
	rctx, cancel := context.WithCancel(ctx)
	if !req.Deadline.IsZero() {
		rctx, cancel = context.WithDeadline(ctx, req.Deadline)
	}
	r.running[req.ID] = cancel
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		defer cancel()
		res := r.do(rctx, req)
		select {
		case r.done <- answered{id: req.ID, res: res}:
		case <-ctx.Done():
		}
	}()
}

// do carries out req with the allocator.
func (r *responder) do(ctx context.Context, req *ipamtables.Request) ipamtables.RequestResult {
	owner := Owner{Name: req.Owner, ContainerID: req.ContainerID}
	var res ipamtables.RequestResult
	switch req.Op {
	case ipamtables.OpClaim:
		res.Err = r.alloc.Claim(ctx, req.IP, owner)
	case ipamtables.OpReleaseOwned:
		var released bool
		released, res.Err = r.alloc.ReleaseOwned(req.IP, owner)
		if released {
			res.Released = []ipamtables.Allocation{{IP: req.IP, Owner: req.Owner, ContainerID: req.ContainerID}}
		}
	case ipamtables.OpReleaseContainer:
		var released []Allocation
		released, res.Err = r.alloc.ReleaseContainer(req.ContainerID)
		for _, al := range released {
			res.Released = append(res.Released, ipamtables.Allocation{IP: al.IP, Owner: al.Owner, ContainerID: al.ContainerID})
		}
	default:
		res.Err = fmt.Errorf("unknown IPAM request %q", req.Op)
	}
	return res
}

// answer writes res into request id, if it is still there.
func (r *responder) answer(id uint64, res ipamtables.RequestResult) error {
	wtxn := r.db.WriteTxn(r.table)
	defer wtxn.Abort()
	req, _, ok := r.table.Get(wtxn, ipamtables.RequestIDIndex.Query(id))
	if !ok {
		return nil
	}
	if _, _, err := r.table.Insert(wtxn, req.WithResult(res)); err != nil {
		return fmt.Errorf("answer IPAM request %d: %w", id, err)
	}
	wtxn.Commit()
	return nil
}

// hold hands the addresses of the OpHold rows over to the allocator (once:
// the table is initialized) and answers them.
func (r *responder) hold(txn statedb.ReadTxn) error {
	var claims []Claim
	var ids []uint64
	for req := range r.table.List(txn, ipamtables.RequestOpIndex.Query(ipamtables.OpHold)) {
		claims = append(claims, Claim{IP: req.IP, Owner: Owner{Name: req.Owner, ContainerID: req.ContainerID}})
		ids = append(ids, req.ID)
	}
	r.handOver(claims)
	r.handOver = nil
	r.log.Debug("restored endpoints' addresses held", "count", len(claims))
	for _, id := range ids {
		if err := r.answer(id, ipamtables.RequestResult{}); err != nil {
			return err
		}
	}
	return nil
}
