package cesbatcher

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/cilium/statedb"
	"k8s.io/apimachinery/pkg/api/equality"
	k8serrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	"github.com/cellium/cellium/api/cilium.io/v2alpha1"
	ciliumclient "github.com/cellium/cellium/api/client/clientset/versioned/typed/cilium.io/v2alpha1"
	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/statedb/tables"
)

// Tables are what the syncer reads: the CiliumEndpoints (the truth), the
// slices in the cluster, and the CiliumNodes (their number picks the
// write rate's step).
type Tables struct {
	DB     *statedb.DB
	CEPs   statedb.Table[*ciliumv2.CiliumEndpoint]
	Slices statedb.Table[*v2alpha1.CiliumEndpointSlice]
	Nodes  statedb.Table[*ciliumv2.CiliumNode]
}

// Syncer runs a Batcher over the tables and writes its slices to the API
// server.
type Syncer struct {
	cfg     Config
	tables  Tables
	client  ciliumclient.CiliumEndpointSlicesGetter
	limiter *writeLimiter
	log     *slog.Logger
	health  hive.Health
	// workers is how many writes are in flight at once (writeWorkers).
	workers int

	// Delay and MaxDelay coalesce the changes of a burst into few rounds
	// of writes: a round starts once the CiliumEndpoints have been quiet
	// for Delay, or MaxDelay after the change that ended the last wait,
	// whichever comes first (so that endless churn is still written).
	// EchoTimeout bounds the wait for the slice table to show a round's
	// writes; RetryDelay follows a failed round. NewName names new
	// slices (nil: NewSliceName).
	Delay, MaxDelay, EchoTimeout, RetryDelay time.Duration
	NewName                                  func() string
}

// The coalescing defaults: a burst of 100 pods created (or deleted) on a
// node costs a few slice writes, not one per endpoint, and a remote pod's
// entry is in its slice at most about DefaultMaxDelay after its
// CiliumEndpoint (Documentation/operations/api-write-budget.md).
const (
	DefaultDelay    = 500 * time.Millisecond
	DefaultMaxDelay = 2 * time.Second
)

// NewSyncer returns a syncer with cfg's size limit and write rate; it
// fails if cfg's rate limits do not parse.
func NewSyncer(cfg Config, t Tables, client ciliumclient.CiliumEndpointSlicesGetter, log *slog.Logger, health hive.Health) (*Syncer, error) {
	steps, err := cfg.RateLimits()
	if err != nil {
		return nil, err
	}
	return &Syncer{cfg: cfg, tables: t, client: client, log: log, health: health,
		limiter: newWriteLimiter(steps, log), workers: writeWorkers,
		Delay: DefaultDelay, MaxDelay: DefaultMaxDelay, EchoTimeout: 10 * time.Second, RetryDelay: time.Second}, nil
}

// WriteLimit returns the step of the write rate in force.
func (s *Syncer) WriteLimit() RateLimit { return s.limiter.Current() }

// Run batches until ctx ends: it waits for both tables to be listed,
// adopts the slices there are, and then writes a round after every change
// of the CiliumEndpoints or the slices, coalesced (Delay, MaxDelay).
// Meanwhile the write rate follows the number of CiliumNodes. It returns
// nil.
func (s *Syncer) Run(ctx context.Context) error {
	defer s.health.Stopped("not leading")
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	wg.Go(func() { s.followNodes(ctx) })
	s.health.OK("waiting for the CiliumEndpoints and CiliumEndpointSlices tables")
	if err := tables.WaitInitialized(ctx, s.tables.DB, s.tables.CEPs, s.tables.Slices); err != nil {
		return nil
	}
	b := NewBatcher(s.cfg.CESMaxCiliumendpointsPerCES, s.NewName)
	for {
		planned := time.Now()
		rtxn := s.tables.DB.ReadTxn()
		cepIter, cepW := s.tables.CEPs.AllWatch(rtxn)
		cesIter, cesW := s.tables.Slices.AllWatch(rtxn)
		ceps := statedb.Collect(cepIter)
		cur := statedb.Collect(cesIter)
		b.Plan(ceps, cur)
		_, err := s.Round(ctx, b, cur)
		switch {
		case ctx.Err() != nil:
			return nil
		case err != nil:
			s.log.Error("Writing CiliumEndpointSlices failed; retrying", "error", err)
			s.health.Degraded("write CiliumEndpointSlices", err)
			if !sleep(ctx, s.RetryDelay) {
				return nil
			}
			continue
		default:
			s.health.OK(fmt.Sprintf("%d endpoints in %d slices", len(ceps), len(b.slices)))
		}
		// Our own writes (n > 0) changed the slice table: Round waited
		// until it shows them, so the next plan starts from them. The
		// endpoints that changed meanwhile wait for the next round like
		// any others, but their wait counts from the plan, not from the
		// round's end: under churn a round starts every MaxDelay (or
		// when the one before ends, if it took longer), however long the
		// writes took.
		since := planned
		select {
		case <-cepW:
		default:
			since = time.Time{} // no change during the round: from the next one
		}
		select {
		case <-ctx.Done():
			return nil
		case <-cepW:
		case <-cesW:
		}
		if since.IsZero() {
			since = time.Now()
		}
		if !s.coalesce(ctx, since) {
			return nil
		}
	}
}

// followNodes sets the write rate's step from the number of CiliumNodes,
// once they are listed and after every change, until ctx ends.
func (s *Syncer) followNodes(ctx context.Context) {
	if err := tables.WaitInitialized(ctx, s.tables.DB, s.tables.Nodes); err != nil {
		return
	}
	for {
		txn := s.tables.DB.ReadTxn()
		_, changed := s.tables.Nodes.AllWatch(txn)
		s.limiter.SetNodes(s.tables.Nodes.NumObjects(txn))
		select {
		case <-ctx.Done():
			return
		case <-changed:
		}
	}
}

// coalesce waits until the CiliumEndpoints have not changed for Delay,
// but no longer than until MaxDelay (at least Delay) after since, the
// first change it waits for. It returns false when ctx ends.
func (s *Syncer) coalesce(ctx context.Context, since time.Time) bool {
	deadline := since.Add(max(s.MaxDelay, s.Delay))
	for {
		wait := min(s.Delay, time.Until(deadline))
		if wait <= 0 {
			return true
		}
		_, changed := s.tables.CEPs.AllWatch(s.tables.DB.ReadTxn())
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return false
		case <-t.C:
			if wait == s.Delay {
				return true // quiet for Delay
			}
		case <-changed:
			t.Stop()
		}
	}
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// write is one API write of a round.
type write struct {
	op   int // opCreate, opUpdate, opDelete
	want *v2alpha1.CiliumEndpointSlice
	cur  *v2alpha1.CiliumEndpointSlice
	// adds: the write adds or changes an entry (it goes before those that
	// only remove, so that a moving endpoint is never in no slice).
	adds bool
}

const (
	opCreate = iota
	opUpdate
	opDelete
)

// Round writes what differs between the batcher's desired slices and
// cur, the slices in the cluster, in three phases: creates and updates
// that add entries, then updates that only remove entries, then
// deletions of slices no longer desired. A phase starts once every write
// of the one before has returned without error, so that a moving
// endpoint is in its new slice before it leaves the old one (a failed
// write ends the round; the retry plans again). Within a phase up to
// writeWorkers writes are in flight at once (a write's latency does not
// bound the rate); each waits for the rate limiter first. Round then
// waits (up to EchoTimeout) until the slice table shows the writes, and
// returns how many it made.
func (s *Syncer) Round(ctx context.Context, b *Batcher, cur []*v2alpha1.CiliumEndpointSlice) (int, error) {
	ws := plan(b.Desired(), cur)
	r := &round{}
	for len(ws) > 0 {
		n := 1
		for n < len(ws) && rank(ws[n]) == rank(ws[0]) {
			n++
		}
		if err := s.writePhase(ctx, ws[:n], r); err != nil {
			return len(r.echoes), err
		}
		// A failed write holds back the later phases: were it an add,
		// the remove that follows would leave its endpoint in no slice
		// until the retry.
		if r.failed() {
			break
		}
		ws = ws[n:]
	}
	// Someone else's objects took these names: ours get others.
	for _, name := range r.renames {
		b.Rename(name)
	}
	if len(r.echoes) > 0 {
		s.waitEcho(ctx, func(txn statedb.ReadTxn) bool {
			for _, e := range r.echoes {
				got, _, ok := s.tables.Slices.Get(txn, sliceName(e.name))
				if e.deleted && ok || !e.deleted && (!ok || olderRV(got.ResourceVersion, e.rv)) {
					return false
				}
			}
			return true
		})
	}
	return len(r.echoes), errors.Join(r.errs...)
}

// writeWorkers is how many slice writes are in flight at once: enough
// for the largest write rate (MaxWriteQPS) with writes that take up to
// 160 ms each. The rate limiter, not this, paces the writes.
const writeWorkers = 8

// round is what a round's writes returned.
type round struct {
	mu      sync.Mutex
	echoes  []echo
	errs    []error
	renames []string
}

// echo is a write the slice table should show.
type echo struct {
	name    string
	rv      string
	deleted bool
}

// failed reports whether a write of the round failed.
func (r *round) failed() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.errs) > 0
}

func (r *round) add(e *echo, rename string, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if e != nil {
		r.echoes = append(r.echoes, *e)
	}
	if err != nil {
		r.errs = append(r.errs, err)
	}
	if rename != "" {
		r.renames = append(r.renames, rename)
	}
}

// writePhase makes the writes ws, up to s.workers at once, each after a
// token of the rate limiter, and returns once all have returned. The
// writes' results go into r; the error is the rate limiter's (ctx
// ended).
func (s *Syncer) writePhase(ctx context.Context, ws []write, r *round) error {
	next := make(chan write)
	var wg sync.WaitGroup
	for range min(s.workers, len(ws)) {
		wg.Go(func() {
			for w := range next {
				r.add(s.write(ctx, w))
			}
		})
	}
	var err error
	for _, w := range ws {
		// The token is taken here, in order: a write waits for its
		// turn, not for a free worker's.
		if err = s.limiter.lim.Wait(ctx); err != nil {
			break
		}
		next <- w
	}
	close(next)
	wg.Wait()
	return err
}

// write makes one API write. It returns what the slice table should then
// show (nil if the write failed), the name of a slice to rename (its
// create found the name taken) and the error.
func (s *Syncer) write(ctx context.Context, w write) (*echo, string, error) {
	api := s.client.CiliumEndpointSlices()
	switch w.op {
	case opCreate:
		got, err := api.Create(ctx, w.want, metav1.CreateOptions{})
		if k8serrors.IsAlreadyExists(err) {
			return nil, w.want.Name, fmt.Errorf("create CiliumEndpointSlice %s: %w (renamed)", w.want.Name, err)
		}
		if err != nil {
			return nil, "", fmt.Errorf("create CiliumEndpointSlice %s: %w", w.want.Name, err)
		}
		return &echo{name: got.Name, rv: got.ResourceVersion}, "", nil
	case opUpdate:
		obj := w.cur.DeepCopy()
		obj.Namespace, obj.Endpoints = w.want.Namespace, w.want.Endpoints
		got, err := api.Update(ctx, obj, metav1.UpdateOptions{})
		if err != nil {
			return nil, "", fmt.Errorf("update CiliumEndpointSlice %s: %w", w.want.Name, err)
		}
		return &echo{name: got.Name, rv: got.ResourceVersion}, "", nil
	default: // opDelete
		err := api.Delete(ctx, w.cur.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &w.cur.UID}})
		if err != nil && !k8serrors.IsNotFound(err) {
			return nil, "", fmt.Errorf("delete CiliumEndpointSlice %s: %w", w.cur.Name, err)
		}
		return &echo{name: w.cur.Name, deleted: true}, "", nil
	}
}

// waitEcho waits until shown is true of the slice table, EchoTimeout
// passes or ctx ends.
func (s *Syncer) waitEcho(ctx context.Context, shown func(statedb.ReadTxn) bool) {
	timeout := time.NewTimer(s.EchoTimeout)
	defer timeout.Stop()
	for {
		txn := s.tables.DB.ReadTxn()
		_, w := s.tables.Slices.AllWatch(txn)
		if shown(txn) {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-timeout.C:
			s.log.Warn("The CiliumEndpointSlice watch did not show this operator's writes in time; going on", "timeout", s.EchoTimeout)
			return
		case <-w:
		}
	}
}

// olderRV reports whether resourceVersion a is older than b (numbers,
// as etcd-backed API servers hand out; anything else counts as not older).
func olderRV(a, b string) bool {
	x, errA := strconv.ParseUint(a, 10, 64)
	y, errB := strconv.ParseUint(b, 10, 64)
	return errA == nil && errB == nil && x < y
}

// plan lists the writes that turn cur into desired, in order.
func plan(desired map[string]*v2alpha1.CiliumEndpointSlice, cur []*v2alpha1.CiliumEndpointSlice) []write {
	byName := make(map[string]*v2alpha1.CiliumEndpointSlice, len(cur))
	for _, c := range cur {
		byName[c.Name] = c
	}
	var ws []write
	for name, want := range desired {
		c, ok := byName[name]
		switch {
		case !ok:
			ws = append(ws, write{op: opCreate, want: want, adds: true})
		case !SameContent(want, c):
			ws = append(ws, write{op: opUpdate, want: want, cur: c, adds: addsEntries(want, c)})
		}
	}
	for _, c := range cur {
		if _, ok := desired[c.Name]; !ok {
			ws = append(ws, write{op: opDelete, cur: c})
		}
	}
	slices.SortFunc(ws, func(x, y write) int {
		if r := rank(x) - rank(y); r != 0 {
			return r
		}
		return cmp.Compare(name(x), name(y))
	})
	return ws
}

func rank(w write) int {
	switch {
	case w.op == opDelete:
		return 2
	case w.adds:
		return 0
	}
	return 1
}

func name(w write) string {
	if w.want != nil {
		return w.want.Name
	}
	return w.cur.Name
}

// addsEntries reports whether want has an entry cur lacks or has
// otherwise.
func addsEntries(want, cur *v2alpha1.CiliumEndpointSlice) bool {
	if want.Namespace != cur.Namespace {
		return true
	}
	have := make(map[string]v2alpha1.CoreCiliumEndpoint, len(cur.Endpoints))
	for _, e := range cur.Endpoints {
		have[e.Name] = e
	}
	for _, e := range want.Endpoints {
		if h, ok := have[e.Name]; !ok || !equality.Semantic.DeepEqual(e, h) {
			return true
		}
	}
	return false
}
