package ipam

import (
	"context"
	"errors"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/cilium/statedb"

	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/cells/hive/hivetest"
	ipamtables "github.com/cellium/cellium/statedb/ipam"
)

// requestEnv is a responder over a test allocator and a fresh requests
// table, whose initializer (the endpoint manager's restore) the test
// completes with done.
type requestEnv struct {
	db    *statedb.DB
	table statedb.RWTable[*ipamtables.Request]
	a     *allocator
	done  func(statedb.WriteTxn)
	next  uint64
}

func startRequests(t *testing.T) *requestEnv {
	t.Helper()
	e := &requestEnv{db: statedb.New(), a: newTestAllocator(t, t.TempDir(), "")}
	var err error
	if e.table, err = ipamtables.NewRequestsTable(e.db); err != nil {
		t.Fatal(err)
	}
	txn := e.db.WriteTxn(e.table)
	e.done = e.table.RegisterInitializer(txn, "test-restore")
	txn.Commit()
	r := &responder{db: e.db, table: e.table, alloc: e.a, log: hivetest.Logger(t),
		handOver: e.a.HoldForRestore("test"), running: map[uint64]context.CancelFunc{}, done: make(chan answered)}
	if err := r.subscribe(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan struct{})
	go func() { defer close(stopped); r.run(ctx, nopHealthOf{}) }()
	t.Cleanup(func() { cancel(); <-stopped })
	return e
}

type nopHealthOf struct{}

func (nopHealthOf) OK(string)                  {}
func (nopHealthOf) Degraded(string, error)     {}
func (nopHealthOf) Stopped(string)             {}
func (h nopHealthOf) Scope(string) hive.Health { return h }

// insert writes req with a new ID (and, in holds, with the table's
// initialization) and returns the ID.
func (e *requestEnv) insert(t *testing.T, req *ipamtables.Request, initialize bool) uint64 {
	t.Helper()
	e.next++
	req.ID = e.next
	txn := e.db.WriteTxn(e.table)
	if _, _, err := e.table.Insert(txn, req); err != nil {
		t.Fatal(err)
	}
	if initialize {
		e.done(txn)
	}
	txn.Commit()
	return req.ID
}

// answer waits for the answer to request id.
func (e *requestEnv) answer(t *testing.T, id uint64) ipamtables.RequestResult {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		row, _, watch, ok := e.table.GetWatch(e.db.ReadTxn(), ipamtables.RequestIDIndex.Query(id))
		if ok && row.Result.Done {
			return row.Result
		}
		select {
		case <-watch:
		case <-timeout:
			t.Fatalf("request %d not answered", id)
		}
	}
}

var (
	live    = netip.MustParseAddr("10.0.1.2")
	claimed = netip.MustParseAddr("10.0.1.3")
)

// IPAM hands out nothing before the requests table is initialized, and
// then never a restored endpoint's address (the hold rows); the claims and
// releases of the CNI API come back with IPAM's errors (errors.Is holds);
// an address has one owner however many containers claim it at once.
func TestResponderHoldsClaimsAndReleases(t *testing.T) {
	e := startRequests(t)
	if err := e.a.setPodCIDRs(prefixes("10.0.1.0/29")); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	if _, err := e.a.AllocateNext(ctx, Owner{Name: "ns/early"}); !errors.Is(err, ErrNoPodCIDR) {
		t.Errorf("AllocateNext before the requests table is initialized = %v, want to wait", err)
	}
	cancel()
	hold := e.insert(t, &ipamtables.Request{Op: ipamtables.OpHold, IP: live, Owner: "ns/live", ContainerID: "c-live"}, true)
	if res := e.answer(t, hold); res.Err != nil {
		t.Fatalf("hold answered %v", res.Err)
	}
	al, err := e.a.AllocateNext(context.Background(), Owner{Name: "ns/new", ContainerID: "c-new"})
	if err != nil || al.IP == live {
		t.Fatalf("AllocateNext after the hand-over = %v, %v: want an address other than the restored %v", al.IP, err, live)
	}
	if al.IP != claimed {
		t.Fatalf("allocated %v, the test expects %v", al.IP, claimed)
	}

	// Two containers claim the address at once: one owns it.
	var wg sync.WaitGroup
	results := make([]error, 2)
	for i, cid := range []string{"c-new", "c-other"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id := e.insertLocked(t, &ipamtables.Request{Op: ipamtables.OpClaim, IP: claimed, Owner: "ns/new", ContainerID: cid})
			results[i] = e.answer(t, id).Err
		}()
	}
	wg.Wait()
	if results[0] != nil || !errors.Is(results[1], ErrNotOwner) {
		t.Fatalf("claims of c-new and c-other: %v, %v; want success and ErrNotOwner", results[0], results[1])
	}
	if res := e.answer(t, e.insert(t, &ipamtables.Request{Op: ipamtables.OpClaim, IP: netip.MustParseAddr("10.0.1.5"), Owner: "ns/x"}, false)); !errors.Is(res.Err, ErrNotAllocated) {
		t.Fatalf("claim of a free address: %v, want ErrNotAllocated", res.Err)
	}

	// Releases: not by another container; by the owner's container.
	if res := e.answer(t, e.insert(t, &ipamtables.Request{Op: ipamtables.OpReleaseOwned, IP: claimed, ContainerID: "c-other"}, false)); !errors.Is(res.Err, ErrNotOwner) || len(res.Released) != 0 {
		t.Fatalf("release by another container: %+v", res)
	}
	res := e.answer(t, e.insert(t, &ipamtables.Request{Op: ipamtables.OpReleaseContainer, ContainerID: "c-new"}, false))
	if res.Err != nil || len(res.Released) != 1 || res.Released[0].IP != claimed || res.Released[0].Owner != "ns/new" {
		t.Fatalf("release of container c-new: %+v", res)
	}
	if _, held := e.a.pool.Owner(claimed); held {
		t.Fatalf("%v still allocated after its container's release", claimed)
	}
	if res := e.answer(t, e.insert(t, &ipamtables.Request{Op: ipamtables.OpReleaseOwned, IP: claimed, ContainerID: "c-new"}, false)); res.Err != nil || len(res.Released) != 0 {
		t.Fatalf("second release: %+v, want nothing released and no error", res)
	}
}

// insertLocked is insert for concurrent callers.
func (e *requestEnv) insertLocked(t *testing.T, req *ipamtables.Request) uint64 {
	t.Helper()
	txn := e.db.WriteTxn(e.table)
	e.next++
	req.ID = e.next
	if _, _, err := e.table.Insert(txn, req); err != nil {
		t.Error(err)
	}
	txn.Commit()
	return req.ID
}

// A claim withdrawn while it waits for the pool ends (goleak would find
// it) and is not answered into a row again.
func TestResponderWithdrawnClaim(t *testing.T) {
	e := startRequests(t)
	id := e.insert(t, &ipamtables.Request{Op: ipamtables.OpClaim, IP: claimed, Owner: "ns/a"}, true)
	time.Sleep(20 * time.Millisecond) // let the claim start waiting
	txn := e.db.WriteTxn(e.table)
	if _, _, err := e.table.Delete(txn, &ipamtables.Request{ID: id}); err != nil {
		t.Fatal(err)
	}
	txn.Commit()
	time.Sleep(50 * time.Millisecond)
	if _, _, ok := e.table.Get(e.db.ReadTxn(), ipamtables.RequestIDIndex.Query(id)); ok {
		t.Fatal("a withdrawn request came back")
	}
}
