package identity

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/cilium/statedb"

	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/statedb/identity"
	"github.com/cellium/cellium/statedb/labels"
)

// countingAllocator gives each label set a number from 1000 and counts
// references; labels in fail fail, and an allocation of labels in hold
// waits for release to close.
type countingAllocator struct {
	mu       sync.Mutex
	ids      map[string]identity.NumericIdentity
	refs     map[identity.NumericIdentity]int
	restored map[string]identity.NumericIdentity
	fail     string
	hold     string
	entered  chan struct{}
	release  chan struct{}
}

var errDenied = errors.New("denied by admission policy")

func (c *countingAllocator) Allocate(ctx context.Context, l labels.Labels) (Identity, error) {
	if c.hold != "" && l.String() == c.hold {
		c.entered <- struct{}{}
		select {
		case <-c.release:
		case <-ctx.Done():
			return Identity{}, ctx.Err()
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if l.String() == c.fail {
		return Identity{}, errDenied
	}
	id, ok := c.restored[l.SortedList()]
	if !ok {
		if id, ok = c.ids[l.String()]; !ok {
			id = identity.NumericIdentity(1000 + len(c.ids))
		}
	}
	c.ids[l.String()] = id
	c.refs[id]++
	return Identity{ID: id, Labels: l}, nil
}

func (c *countingAllocator) Release(_ context.Context, id identity.NumericIdentity) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.refs[id] <= 0 {
		return ErrNotAllocated
	}
	c.refs[id]--
	return nil
}

func (c *countingAllocator) Restore(l labels.Labels, id identity.NumericIdentity) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.restored[l.SortedList()] = id
}

func (c *countingAllocator) refsOf(l labels.Labels) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	id, ok := c.ids[l.String()]
	if !ok {
		return 0
	}
	return c.refs[id]
}

type okHealth struct{}

func (okHealth) OK(string)                  {}
func (okHealth) Degraded(string, error)     {}
func (okHealth) Stopped(string)             {}
func (h okHealth) Scope(string) hive.Health { return h }

var _ hive.Health = okHealth{}

// startResponder runs a responder over a fresh requests table.
func startResponder(t *testing.T, alloc *countingAllocator) (*statedb.DB, statedb.RWTable[*identity.Request]) {
	t.Helper()
	db := statedb.New()
	table, err := identity.NewRequestsTable(db)
	if err != nil {
		t.Fatal(err)
	}
	r := newResponder(db, identity.RequestAnswers{RWTable: table}, alloc, slog.New(slog.DiscardHandler))
	if err := r.subscribe(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); r.run(ctx, okHealth{}) }()
	t.Cleanup(func() { cancel(); <-done })
	return db, table
}

func ask(t *testing.T, db *statedb.DB, table statedb.RWTable[*identity.Request], req *identity.Request) {
	t.Helper()
	txn := db.WriteTxn(table)
	if _, _, err := table.Insert(txn, req); err != nil {
		t.Fatal(err)
	}
	txn.Commit()
}

func withdraw(t *testing.T, db *statedb.DB, table statedb.RWTable[*identity.Request], ep uint16) {
	t.Helper()
	txn := db.WriteTxn(table)
	if _, _, err := table.Delete(txn, &identity.Request{Endpoint: ep}); err != nil {
		t.Fatal(err)
	}
	txn.Commit()
}

// answered waits for the answer to the request of ep's current attempt.
func answered(t *testing.T, db *statedb.DB, table statedb.RWTable[*identity.Request], ep uint16) *identity.Request {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		req, _, watch, ok := table.GetWatch(db.ReadTxn(), identity.RequestEndpointIndex.Query(ep))
		if ok && req.Answered() {
			return req
		}
		select {
		case <-watch:
		case <-timeout:
			t.Fatalf("the request of endpoint %d is not answered", ep)
		}
	}
}

func until(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("never: %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// Each request holds exactly one reference to the identity it was
// granted: a second endpoint with the same labels takes another, a label
// change moves it (the old one is dropped before the answer is seen), a
// withdrawn request drops it.
func TestResponderReferencesFollowRequests(t *testing.T) {
	alloc := &countingAllocator{ids: map[string]identity.NumericIdentity{}, refs: map[identity.NumericIdentity]int{}, restored: map[string]identity.NumericIdentity{}}
	db, table := startResponder(t, alloc)
	a := labels.ParseLabels("k8s:app=a")
	b := labels.ParseLabels("k8s:app=b")

	ask(t, db, table, &identity.Request{Endpoint: 1, Labels: a, Attempt: 1})
	ask(t, db, table, &identity.Request{Endpoint: 2, Labels: a, Attempt: 2})
	r1, r2 := answered(t, db, table, 1), answered(t, db, table, 2)
	if r1.Result.Err != nil || r1.Result.ID != r2.Result.ID || r1.Result.ID == identity.InvalidIdentity {
		t.Fatalf("answers %+v and %+v, want the same identity for the same labels", r1.Result, r2.Result)
	}
	if n := alloc.refsOf(a); n != 2 {
		t.Fatalf("%d references to %s, want 2", n, a)
	}

	ask(t, db, table, &identity.Request{Endpoint: 1, Labels: b, Attempt: 3})
	if r := answered(t, db, table, 1); r.Result.Err != nil || r.Result.ID == r1.Result.ID {
		t.Fatalf("after the label change: %+v", r.Result)
	}
	if na, nb := alloc.refsOf(a), alloc.refsOf(b); na != 1 || nb != 1 {
		t.Fatalf("after the label change: %d references to a, %d to b, want 1 and 1", na, nb)
	}

	withdraw(t, db, table, 1)
	withdraw(t, db, table, 2)
	until(t, "every reference dropped once the requests are gone", func() bool { return alloc.refsOf(a) == 0 && alloc.refsOf(b) == 0 })
}

// A failed attempt is answered with the allocator's error (errors.Is
// holds) and holds nothing; asking again retries. A request withdrawn
// while its allocation runs gets nothing: the late identity is dropped.
func TestResponderFailuresAndWithdrawals(t *testing.T) {
	bad := labels.ParseLabels("k8s:app=bad")
	slow := labels.ParseLabels("k8s:app=slow")
	alloc := &countingAllocator{ids: map[string]identity.NumericIdentity{}, refs: map[identity.NumericIdentity]int{}, restored: map[string]identity.NumericIdentity{},
		fail: bad.String(), hold: slow.String(), entered: make(chan struct{}, 1), release: make(chan struct{})}
	db, table := startResponder(t, alloc)

	ask(t, db, table, &identity.Request{Endpoint: 1, Labels: bad, Attempt: 1})
	if r := answered(t, db, table, 1); !errors.Is(r.Result.Err, errDenied) || r.Result.Error == "" {
		t.Fatalf("answer %+v, want the allocator's error", r.Result)
	}
	alloc.mu.Lock()
	alloc.fail = ""
	alloc.mu.Unlock()
	ask(t, db, table, &identity.Request{Endpoint: 1, Labels: bad, Attempt: 2})
	if r := answered(t, db, table, 1); r.Result.Err != nil || r.Result.Attempt != 2 {
		t.Fatalf("retry answered %+v", r.Result)
	}

	ask(t, db, table, &identity.Request{Endpoint: 2, Labels: slow, Attempt: 3})
	<-alloc.entered
	withdraw(t, db, table, 2)
	// Let the withdrawal be seen before the allocation ends.
	time.Sleep(50 * time.Millisecond)
	close(alloc.release)
	until(t, "the late identity of a withdrawn request dropped", func() bool {
		alloc.mu.Lock()
		defer alloc.mu.Unlock()
		_, allocated := alloc.ids[slow.String()]
		return allocated && alloc.refs[alloc.ids[slow.String()]] == 0
	})
	if _, _, ok := table.Get(db.ReadTxn(), identity.RequestEndpointIndex.Query(2)); ok {
		t.Fatal("the answer re-created a withdrawn request")
	}
}

// A restored request (attempt 0) asks nothing but hands its number to the
// allocator before any allocation of the same batch.
func TestResponderRestoredNumbers(t *testing.T) {
	alloc := &countingAllocator{ids: map[string]identity.NumericIdentity{}, refs: map[identity.NumericIdentity]int{}, restored: map[string]identity.NumericIdentity{}}
	db, table := startResponder(t, alloc)
	l := labels.ParseLabels("k8s:app=r")
	txn := db.WriteTxn(table)
	_, _, _ = table.Insert(txn, &identity.Request{Endpoint: 7, Labels: l, Restored: 4242})
	_, _, _ = table.Insert(txn, &identity.Request{Endpoint: 8, Labels: l, Attempt: 1})
	txn.Commit()
	if r := answered(t, db, table, 8); r.Result.ID != 4242 {
		t.Fatalf("answer %+v, want the restored identity 4242", r.Result)
	}
	if n := alloc.refsOf(l); n != 1 {
		t.Fatalf("%d references, want 1 (the restored row asks nothing)", n)
	}
}
