package ipam

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cilium/statedb"

	"github.com/cellium/cellium/cells/ipam/pool"
	ipamtables "github.com/cellium/cellium/statedb/ipam"
	"github.com/cellium/cellium/statedb/tables"
)

// allocator implements Allocator over a pool.Pool that exists
// once the node has pod CIDRs. Every change is written to the state file
// before the call returns, so that a restarted agent restores it.
type allocator struct {
	node  string
	log   *slog.Logger
	state *stateStore // nil: nothing is persisted
	now   func() time.Time

	// ready is closed when pool is set and every restorer registered with
	// HoldForRestore has handed over its addresses.
	ready chan struct{}

	// mu guards the fields below. Allocate takes it for reading (the pool
	// has its own lock); everything that replaces the pool or touches
	// restored or unclaimed takes it for writing.
	mu   sync.RWMutex
	pool *pool.Pool
	// restored holds the allocations read from the state file until the
	// pool exists; nil afterwards.
	restored map[netip.Addr]restoredEntry
	// restoredCIDRs are the CIDRs recorded in the state file, written back
	// as they were while the pool does not exist.
	restoredCIDRs []netip.Prefix
	// unclaimed are restored allocations that nobody has claimed again
	// with AllocateIP since the start (restoreGC may release them).
	unclaimed map[netip.Addr]string
	// meta is what the pool does not record about each allocated address
	// (the router's excepted): the container ID and since when.
	meta map[netip.Addr]allocMeta
	// holds counts the restorers (HoldForRestore) that have not handed
	// over their addresses yet; isReady is set once ready is closed.
	holds   int
	isReady bool
	// gcReleased are the last addresses the garbage collector freed,
	// oldest first, at most gcHistory.
	gcReleased []gcRelease
	// gcTotal counts the addresses the garbage collector freed.
	gcTotal atomic.Uint64
	// loaded is set once restore has read the state file: before, a write
	// would replace the file with an empty state.
	loaded bool

	// pub mirrors the allocations into the IPAM allocations table; nil
	// when the allocator has no table (unit tests of the plain logic).
	pub *publisher
}

// publisher mirrors the allocator's allocations into the IPAM allocations
// table, whose only writer it is.
type publisher struct {
	db    *statedb.DB
	table statedb.RWTable[*ipamtables.Allocation]
	// mu serializes publish: each takes its snapshot after the previous
	// one committed, so the table converges on the latest state.
	mu sync.Mutex
	// init marks the table initialized once the allocator can allocate.
	init tables.InitGate
}

// allocMeta is what the allocator records beside the pool's owner name.
type allocMeta struct {
	containerID string
	since       time.Time
}

// restoredEntry is an allocation read from the state file or handed over
// by a restorer, before the pool exists.
type restoredEntry struct {
	owner       string
	containerID string
}

// gcRelease is an address the IPAM garbage collector freed.
type gcRelease struct {
	Allocation
	// At is when it was freed.
	At time.Time
}

// gcHistory is how many garbage-collected addresses GET /v1/ipam/gc shows.
const gcHistory = 100

var (
	_ Allocator = (*allocator)(nil)
)

// newAllocatorCore creates an allocator for node; state may be nil.
func newAllocatorCore(node string, state *stateStore, log *slog.Logger) *allocator {
	return &allocator{
		node:      node,
		log:       log,
		state:     state,
		now:       time.Now,
		ready:     make(chan struct{}),
		restored:  map[netip.Addr]restoredEntry{},
		unclaimed: map[netip.Addr]string{},
		meta:      map[netip.Addr]allocMeta{},
	}
}

// attachTable makes the allocator the writer of table: every change of
// the allocations is mirrored into it, and the table is initialized once
// the allocator can allocate (the pool exists and every restorer has
// handed over its addresses). Call it before the allocator is used.
func (a *allocator) attachTable(db *statedb.DB, table statedb.RWTable[*ipamtables.Allocation]) {
	wtxn := db.WriteTxn(table)
	done := table.RegisterInitializer(wtxn, "ipam-pool")
	wtxn.Commit()
	a.pub = &publisher{db: db, table: table, init: tables.NewInitGate(done)}
}

// publish writes the current allocations into the table (if any): rows
// of freed addresses are deleted, new and changed ones inserted.
func (a *allocator) publish() {
	p := a.pub
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	a.mu.RLock()
	want := map[netip.Addr]ipamtables.Allocation{}
	if a.pool != nil {
		for ip, owner := range a.pool.Dump() {
			want[ip] = ipamtables.Allocation{IP: ip, Owner: owner, ContainerID: a.meta[ip].containerID}
		}
	}
	ready := a.isReady
	a.mu.RUnlock()

	wtxn := p.db.WriteTxn(p.table)
	defer wtxn.Abort()
	for _, row := range statedb.Collect(p.table.All(wtxn)) {
		w, ok := want[row.IP]
		switch {
		case !ok:
			if _, _, err := p.table.Delete(wtxn, row); err != nil {
				a.log.Error("delete a row of the IPAM allocations table", "ip", row.IP, "error", err)
			}
		case w == *row:
			delete(want, row.IP)
		}
	}
	for _, w := range want {
		if _, _, err := p.table.Insert(wtxn, &w); err != nil {
			a.log.Error("insert a row into the IPAM allocations table", "ip", w.IP, "error", err)
		}
	}
	if ready {
		p.init.Open(wtxn)
	}
	wtxn.Commit()
}

// restore loads the state file (start hook). Pod addresses written before
// a reboot (another boot ID) are dropped, since no pod survives one.
func (a *allocator) restore() error {
	var st *stateFile
	if a.state != nil {
		var err error
		if st, err = a.state.load(); err != nil {
			return err
		}
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.loaded = true
	if st == nil {
		return nil
	}
	bootID := a.state.bootID
	switch {
	case st.Node != a.node:
		a.log.Warn("IPAM state file belongs to another node; starting without its allocations",
			"file", a.state.path, "node", st.Node, "thisNode", a.node)
		return nil
	case st.BootID != "" && bootID != "" && st.BootID != bootID:
		dropped := 0
		for _, e := range st.Allocations {
			if isPodOwner(e.Owner) {
				dropped++
				continue
			}
			a.restoreEntry(e)
		}
		a.log.Info("node rebooted since the IPAM state was written; dropping the addresses of pods",
			"dropped", dropped, "kept", len(a.restored))
	default:
		for _, e := range st.Allocations {
			a.restoreEntry(e)
		}
		a.log.Info("restored IPAM allocations", "file", a.state.path, "allocations", len(a.restored))
	}
	a.restoredCIDRs = st.CIDRs
	return nil
}

func (a *allocator) restoreEntry(e stateEntry) {
	ip := e.IP.Unmap()
	if !ip.Is4() || e.Owner == "" {
		a.log.Warn("ignoring an invalid entry of the IPAM state file", "ip", e.IP, "owner", e.Owner)
		return
	}
	if prev, dup := a.restored[ip]; dup {
		if prev.owner != e.Owner {
			a.log.Warn("IPAM state file and a restored endpoint disagree on an address, or the file lists it twice; keeping the first owner",
				"ip", ip, "owner", prev.owner, "ignored", e.Owner)
		}
		return
	}
	a.restored[ip] = restoredEntry{owner: e.Owner, containerID: e.ContainerID}
}

// isPodOwner reports whether owner names a pod ("namespace/name").
func isPodOwner(owner string) bool {
	ns, name, ok := strings.Cut(owner, "/")
	return ok && ns != "" && name != ""
}

// errNotStarted is returned by changes made before the state file is
// read: written then, the file would lose the saved allocations. The
// allocator's start hook runs before those of everyone who uses it, so no
// caller should see it.
var errNotStarted = errors.New("IPAM has not restored its state yet; retry")

// setPodCIDRs builds the pool from the node's IPv4 pod CIDRs, or follows a
// change of them. The first call restores the allocations read from the
// state file and unblocks the waiting calls.
//
// Possible errors: the CIDRs are unusable (pool.New's errors);
// ErrCIDRsChanged.
func (a *allocator) setPodCIDRs(cidrs []netip.Prefix) error {
	a.mu.Lock()
	if !a.loaded {
		a.mu.Unlock()
		return fmt.Errorf("pod CIDRs %v: %w", cidrs, errNotStarted)
	}
	if a.pool == nil {
		p, err := pool.New(cidrs...)
		if err != nil {
			a.mu.Unlock()
			return fmt.Errorf("pod CIDRs %v of node %s: %w", cidrs, a.node, err)
		}
		a.restoreInto(p)
		a.pool = p
		a.restored, a.restoredCIDRs = nil, nil
		restored := len(a.unclaimed)
		a.maybeReady()
		a.mu.Unlock()
		a.log.Info("IPAM ready", "podCIDRs", cidrs, "routerIP", p.RouterIP(), "restored", restored)
		return a.persist()
	}
	old := a.pool.CIDRs()
	if slices.Equal(old, cidrs) {
		a.mu.Unlock()
		return nil
	}
	p, err := a.regrow(old, cidrs)
	if err != nil {
		a.mu.Unlock()
		return err
	}
	a.pool = p
	a.mu.Unlock()
	a.log.Info("pod CIDRs changed", "old", old, "new", cidrs)
	return a.persist()
}

// restoreInto claims the restored allocations in p, dropping (with a
// warning) those it cannot hold.
func (a *allocator) restoreInto(p *pool.Pool) {
	ips := slices.SortedFunc(maps.Keys(a.restored), netip.Addr.Compare)
	now := a.now()
	for _, ip := range ips {
		e := a.restored[ip]
		if ip == p.RouterIP() {
			continue // the router is reserved by the pool itself
		}
		if err := p.AllocateIP(ip, e.owner); err != nil {
			a.log.Warn("dropping a restored address: it does not fit the node's pod CIDRs", "ip", ip, "owner", e.owner, "error", err)
			continue
		}
		a.unclaimed[ip] = e.owner
		a.meta[ip] = allocMeta{containerID: e.containerID, since: now}
	}
}

// maybeReady closes ready once the pool exists and no restorer is
// pending. a.mu must be held for writing.
func (a *allocator) maybeReady() {
	if a.pool != nil && a.holds == 0 && !a.isReady {
		a.isReady = true
		close(a.ready)
	}
}

// HoldForRestore implements Allocator.
func (a *allocator) HoldForRestore(name string) func([]Claim) {
	a.mu.Lock()
	a.holds++
	a.mu.Unlock()
	var once sync.Once
	return func(claims []Claim) {
		once.Do(func() { a.takeRestored(name, claims) })
	}
}

// takeRestored holds the addresses of a restorer's claims and releases
// its hold on ready. A claim wins over the state file's owner: the
// restorer (the endpoint manager) knows the address is on a pod's
// interface.
func (a *allocator) takeRestored(name string, claims []Claim) {
	a.mu.Lock()
	now := a.now()
	changed := false
	for _, c := range claims {
		ip := c.IP.Unmap()
		if !ip.Is4() || c.Owner.Name == "" {
			a.log.Warn("ignoring an invalid restored address", "restorer", name, "ip", c.IP, "owner", c.Owner)
			continue
		}
		if a.pool == nil {
			if prev, ok := a.restored[ip]; ok && prev.owner != c.Owner.Name {
				a.log.Warn("restored endpoint holds an address the IPAM state gives to another owner; the endpoint keeps it",
					"restorer", name, "ip", ip, "owner", c.Owner, "stateOwner", prev.owner)
			}
			a.restored[ip] = restoredEntry{owner: c.Owner.Name, containerID: c.Owner.ContainerID}
			continue
		}
		cur, held := a.pool.Owner(ip)
		if held && cur != c.Owner.Name {
			if ip == a.pool.RouterIP() {
				a.log.Warn("restored endpoint holds the router IP; not restored", "restorer", name, "ip", ip, "owner", c.Owner)
				continue
			}
			a.log.Warn("restored endpoint holds an address the IPAM state gives to another owner; the endpoint keeps it",
				"restorer", name, "ip", ip, "owner", c.Owner, "stateOwner", cur)
			_ = a.pool.Release(ip)
			held = false
		}
		if !held {
			if err := a.pool.AllocateIP(ip, c.Owner.Name); err != nil {
				a.log.Warn("dropping a restored address: it does not fit the node's pod CIDRs", "restorer", name, "ip", ip, "owner", c.Owner, "error", err)
				continue
			}
			changed = true
		}
		a.unclaimed[ip] = c.Owner.Name
		if m := a.meta[ip]; m.containerID != c.Owner.ContainerID {
			changed = true
		}
		a.meta[ip] = allocMeta{containerID: c.Owner.ContainerID, since: now}
	}
	a.holds--
	a.maybeReady()
	loaded := a.loaded
	a.mu.Unlock()
	a.log.Info("restored addresses handed over", "restorer", name, "addresses", len(claims))
	if changed && loaded {
		if err := a.persist(); err != nil {
			a.log.Warn("persist restored addresses", "error", err)
		}
		return
	}
	a.publish() // the table may now be initialized
}

// regrow makes a pool over cidrs holding every current allocation, if the
// router IP stays the same and every allocated address fits.
func (a *allocator) regrow(old, cidrs []netip.Prefix) (*pool.Pool, error) {
	if len(cidrs) == 0 || cidrs[0] != old[0] {
		return nil, fmt.Errorf("%w: node %s: first pod CIDR moved from %v to %v; keeping %v until the agent restarts",
			ErrCIDRsChanged, a.node, old, cidrs, old)
	}
	p, err := pool.New(cidrs...)
	if err != nil {
		return nil, fmt.Errorf("pod CIDRs %v of node %s: %w", cidrs, a.node, err)
	}
	for ip, owner := range a.pool.Dump() {
		if ip == p.RouterIP() {
			continue
		}
		if err := p.AllocateIP(ip, owner); err != nil {
			return nil, fmt.Errorf("%w: node %s: %v is in use by %q but not in the new pod CIDRs %v; keeping %v until the agent restarts",
				ErrCIDRsChanged, a.node, ip, owner, cidrs, old)
		}
	}
	return p, nil
}

// wait blocks until the pool exists or ctx ends.
func (a *allocator) wait(ctx context.Context) error {
	select {
	case <-a.ready:
		return nil
	default:
	}
	select {
	case <-a.ready:
		return nil
	case <-ctx.Done():
		return noPodCIDRError(a.node, ctx.Err())
	}
}

// allocation describes ip in p.
func allocation(p *pool.Pool, ip netip.Addr, owner string, m allocMeta) Allocation {
	return Allocation{IP: ip, Gateway: p.RouterIP(), CIDRs: p.CIDRs(), Owner: owner, ContainerID: m.containerID, Since: m.since}
}

// heldBy reports whether an address held by name with meta m is owner's:
// with a container ID it must be the allocation's; without, the names
// must match.
func heldBy(name string, m allocMeta, owner Owner) bool {
	if owner.ContainerID != "" {
		return m.containerID == owner.ContainerID && (owner.Name == "" || owner.Name == name)
	}
	return owner.Name == name
}

// AllocateNext implements Allocator.
//
// Possible errors: pool.ErrEmptyOwner; ErrNoPodCIDR when ctx ends before
// the node has pod CIDRs; pool.ErrPoolExhausted naming the CIDRs; a
// failure to write the state file (the address is then not allocated).
func (a *allocator) AllocateNext(ctx context.Context, owner Owner) (Allocation, error) {
	if owner.Name == "" {
		return Allocation{}, fmt.Errorf("allocate IP: %w", pool.ErrEmptyOwner)
	}
	if err := a.wait(ctx); err != nil {
		return Allocation{}, fmt.Errorf("allocate IP for %s: %w", owner, err)
	}
	a.mu.Lock()
	p := a.pool
	ip, err := p.Allocate(owner.Name)
	m := allocMeta{containerID: owner.ContainerID, since: a.now()}
	if err == nil {
		a.meta[ip] = m
	}
	a.mu.Unlock()
	if err != nil {
		return Allocation{}, fmt.Errorf("allocate IP for %s: %w", owner, err)
	}
	if err := a.persist(); err != nil {
		a.undo(ip, owner.Name)
		return Allocation{}, fmt.Errorf("allocate IP for %s: %w", owner, err)
	}
	return allocation(p, ip, owner.Name, m), nil
}

// undo releases ip if owner still holds it.
func (a *allocator) undo(ip netip.Addr, owner string) {
	a.mu.Lock()
	if cur, ok := a.pool.Owner(ip); ok && cur == owner {
		_ = a.pool.Release(ip)
		delete(a.meta, ip)
	}
	a.mu.Unlock()
	a.publish()
}

// AllocateIP implements Allocator. Claiming a restored address with its
// recorded owner marks it as in use (see restoreGC).
//
// Possible errors: pool.ErrEmptyOwner; ErrNoPodCIDR when ctx ends before
// the node has pod CIDRs; pool.ErrNotInPool; pool.ErrInUse naming the
// current owner (also the same pod's other container); a failure to write
// the state file.
func (a *allocator) AllocateIP(ctx context.Context, ip netip.Addr, owner Owner) (Allocation, error) {
	if owner.Name == "" {
		return Allocation{}, fmt.Errorf("allocate %v: %w", ip, pool.ErrEmptyOwner)
	}
	if err := a.wait(ctx); err != nil {
		return Allocation{}, fmt.Errorf("allocate %v for %s: %w", ip, owner, err)
	}
	ip = ip.Unmap()
	a.mu.Lock()
	p := a.pool
	cur, held := p.Owner(ip)
	m := a.meta[ip]
	if held && cur == owner.Name && m.containerID != "" && owner.ContainerID != "" && m.containerID != owner.ContainerID {
		a.mu.Unlock()
		return Allocation{}, fmt.Errorf("allocate %v for %s: %w: held by %s", ip, owner, pool.ErrInUse, Owner{Name: cur, ContainerID: m.containerID})
	}
	err := p.AllocateIP(ip, owner.Name)
	changed := false
	if err == nil {
		if a.unclaimed[ip] == owner.Name {
			delete(a.unclaimed, ip)
		}
		switch {
		case !held || cur != owner.Name:
			m = allocMeta{containerID: owner.ContainerID}
			changed = true
		case m.containerID == "" && owner.ContainerID != "":
			m.containerID = owner.ContainerID
			changed = true
		}
		m.since = a.now()
		a.meta[ip] = m
	}
	a.mu.Unlock()
	if err != nil {
		return Allocation{}, err
	}
	if changed {
		if err := a.persist(); err != nil {
			if !held || cur != owner.Name {
				a.undo(ip, owner.Name)
			}
			return Allocation{}, fmt.Errorf("allocate %v for %s: %w", ip, owner, err)
		}
	}
	return allocation(p, ip, owner.Name, m), nil
}

// Claim implements Allocator.
func (a *allocator) Claim(ctx context.Context, ip netip.Addr, owner Owner) error {
	if err := a.wait(ctx); err != nil {
		return fmt.Errorf("claim %v for %s: %w", ip, owner, err)
	}
	ip = ip.Unmap()
	a.mu.Lock()
	cur, held := a.pool.Owner(ip)
	m := a.meta[ip]
	switch {
	case !held:
		a.mu.Unlock()
		return fmt.Errorf("%w: %v is free: an endpoint can only use an address allocated to its container (POST /v1/ipam?owner=%s&container-id=%s)",
			ErrNotAllocated, ip, owner.Name, owner.ContainerID)
	case cur != owner.Name || m.containerID != "" && owner.ContainerID != "" && m.containerID != owner.ContainerID:
		a.mu.Unlock()
		return fmt.Errorf("%w: %v is allocated to %s, not to %s", ErrNotOwner, ip, Owner{Name: cur, ContainerID: m.containerID}, owner)
	}
	adopted := m.containerID == "" && owner.ContainerID != ""
	if adopted {
		m.containerID = owner.ContainerID
	}
	m.since = a.now()
	a.meta[ip] = m
	delete(a.unclaimed, ip)
	a.mu.Unlock()
	if adopted {
		if err := a.persist(); err != nil {
			return fmt.Errorf("claim %v for %s: %w", ip, owner, err)
		}
	}
	return nil
}

// Release implements Allocator. Before the node has pod CIDRs it forgets
// a restored allocation.
//
// Possible errors: pool.ErrNotInPool; pool.ErrReserved for the router IP;
// a failure to write the state file (the address is released in memory).
func (a *allocator) Release(ip netip.Addr) error {
	ip = ip.Unmap()
	a.mu.Lock()
	if !a.loaded {
		a.mu.Unlock()
		return fmt.Errorf("release %v: %w", ip, errNotStarted)
	}
	changed := false
	if a.pool == nil {
		_, changed = a.restored[ip]
		delete(a.restored, ip)
	} else {
		_, changed = a.pool.Owner(ip)
		if err := a.pool.Release(ip); err != nil {
			a.mu.Unlock()
			return err
		}
		delete(a.unclaimed, ip)
		delete(a.meta, ip)
	}
	a.mu.Unlock()
	if !changed {
		return nil
	}
	if err := a.persist(); err != nil {
		return fmt.Errorf("release %v: %w", ip, err)
	}
	return nil
}

// ReleaseOwned implements Allocator.
func (a *allocator) ReleaseOwned(ip netip.Addr, owner Owner) (bool, error) {
	ip = ip.Unmap()
	a.mu.Lock()
	if !a.loaded {
		a.mu.Unlock()
		return false, fmt.Errorf("release %v: %w", ip, errNotStarted)
	}
	if a.pool == nil {
		e, ok := a.restored[ip]
		if !ok {
			a.mu.Unlock()
			return false, nil
		}
		if !heldBy(e.owner, allocMeta{containerID: e.containerID}, owner) {
			a.mu.Unlock()
			return false, fmt.Errorf("release %v for %s: %w: held by %s", ip, owner, ErrNotOwner, Owner{Name: e.owner, ContainerID: e.containerID})
		}
		delete(a.restored, ip)
	} else {
		cur, held := a.pool.Owner(ip)
		if !held {
			a.mu.Unlock()
			return false, nil
		}
		m := a.meta[ip]
		if !heldBy(cur, m, owner) {
			a.mu.Unlock()
			return false, fmt.Errorf("release %v for %s: %w: held by %s", ip, owner, ErrNotOwner, Owner{Name: cur, ContainerID: m.containerID})
		}
		if err := a.pool.Release(ip); err != nil {
			a.mu.Unlock()
			return false, fmt.Errorf("release %v: %w", ip, err)
		}
		delete(a.unclaimed, ip)
		delete(a.meta, ip)
	}
	a.mu.Unlock()
	if err := a.persist(); err != nil {
		return true, fmt.Errorf("release %v: %w", ip, err)
	}
	return true, nil
}

// ReleaseContainer implements Allocator.
func (a *allocator) ReleaseContainer(containerID string) ([]Allocation, error) {
	if containerID == "" {
		return nil, nil
	}
	a.mu.Lock()
	if !a.loaded {
		a.mu.Unlock()
		return nil, fmt.Errorf("release addresses of container %s: %w", containerID, errNotStarted)
	}
	var out []Allocation
	if a.pool == nil {
		for ip, e := range a.restored {
			if e.containerID == containerID {
				delete(a.restored, ip)
				out = append(out, Allocation{IP: ip, Owner: e.owner, ContainerID: containerID})
			}
		}
	} else {
		for ip, m := range a.meta {
			if m.containerID != containerID {
				continue
			}
			cur, held := a.pool.Owner(ip)
			if held && a.pool.Release(ip) == nil {
				out = append(out, allocation(a.pool, ip, cur, m))
			}
			delete(a.meta, ip)
			delete(a.unclaimed, ip)
		}
	}
	a.mu.Unlock()
	if len(out) == 0 {
		return nil, nil
	}
	slices.SortFunc(out, func(x, y Allocation) int { return x.IP.Compare(y.IP) })
	if err := a.persist(); err != nil {
		return out, fmt.Errorf("release addresses of container %s: %w", containerID, err)
	}
	return out, nil
}

// collect frees the pod addresses allocated (or last claimed) more than
// grace ago that inUse reports unused, and returns them. The caller reads
// inUse's source (the endpoints table) before calling: an endpoint created
// after that read claimed its address less than grace ago.
func (a *allocator) collect(grace time.Duration, inUse func(netip.Addr) bool) ([]Allocation, error) {
	a.mu.Lock()
	if a.pool == nil || !a.isReady {
		a.mu.Unlock()
		return nil, nil
	}
	now := a.now()
	var out []Allocation
	for ip, owner := range a.pool.Dump() {
		if !isPodOwner(owner) {
			continue
		}
		m, ok := a.meta[ip]
		if !ok {
			a.meta[ip] = allocMeta{since: now} // unknown age: count from now
			continue
		}
		if now.Sub(m.since) < grace || inUse(ip) {
			continue
		}
		if err := a.pool.Release(ip); err != nil {
			continue
		}
		delete(a.meta, ip)
		delete(a.unclaimed, ip)
		al := allocation(a.pool, ip, owner, m)
		out = append(out, al)
		a.gcReleased = append(a.gcReleased, gcRelease{Allocation: al, At: now})
	}
	a.gcTotal.Add(uint64(len(out)))
	if n := len(a.gcReleased) - gcHistory; n > 0 {
		a.gcReleased = slices.Delete(a.gcReleased, 0, n)
	}
	a.mu.Unlock()
	if len(out) == 0 {
		return nil, nil
	}
	slices.SortFunc(out, func(x, y Allocation) int { return x.IP.Compare(y.IP) })
	return out, a.persist()
}

// collected returns the last addresses the garbage collector freed.
func (a *allocator) collected() []gcRelease {
	a.mu.RLock()
	defer a.mu.RUnlock()
	return slices.Clone(a.gcReleased)
}

// RouterIP implements Allocator.
func (a *allocator) RouterIP() (netip.Addr, bool) {
	a.mu.RLock()
	defer a.mu.RUnlock()
	if a.pool == nil {
		return netip.Addr{}, false
	}
	return a.pool.RouterIP(), true
}

// ownedBy waits (bounded by ctx) until the pool exists, then returns the
// addresses allocated to owner in ascending order.
func (a *allocator) ownedBy(ctx context.Context, owner string) ([]netip.Addr, error) {
	if err := a.wait(ctx); err != nil {
		return nil, err
	}
	var out []netip.Addr
	for _, al := range a.list() {
		if al.Owner == owner {
			out = append(out, al.IP)
		}
	}
	return out, nil
}

// list returns every allocation, the router's included, by address; nil
// before the node has pod CIDRs.
func (a *allocator) list() []Allocation {
	a.mu.RLock()
	p := a.pool
	if p == nil {
		a.mu.RUnlock()
		return nil
	}
	dump := p.Dump()
	out := make([]Allocation, 0, len(dump))
	for ip, owner := range dump {
		out = append(out, allocation(p, ip, owner, a.meta[ip]))
	}
	a.mu.RUnlock()
	slices.SortFunc(out, func(x, y Allocation) int { return x.IP.Compare(y.IP) })
	return out
}

// stats returns the used and total addresses (router included); 0, 0
// before the node has pod CIDRs.
func (a *allocator) stats() (used, capacity int) {
	a.mu.RLock()
	defer a.mu.RUnlock()
	if a.pool == nil {
		return 0, 0
	}
	return a.pool.Used(), a.pool.Capacity()
}

// unclaimedOwners returns the restored allocations nobody has claimed yet.
func (a *allocator) unclaimedOwners() map[netip.Addr]string {
	a.mu.RLock()
	defer a.mu.RUnlock()
	return maps.Clone(a.unclaimed)
}

// releaseUnclaimed releases the restored, still unclaimed allocations
// whose owner stale reports as gone, and returns them.
func (a *allocator) releaseUnclaimed(stale func(owner string) bool) ([]Allocation, error) {
	a.mu.Lock()
	var released []Allocation
	for ip, owner := range a.unclaimed {
		if !stale(owner) {
			continue
		}
		delete(a.unclaimed, ip)
		if cur, ok := a.pool.Owner(ip); !ok || cur != owner {
			continue
		}
		if err := a.pool.Release(ip); err != nil {
			continue
		}
		delete(a.meta, ip)
		released = append(released, Allocation{IP: ip, Owner: owner})
	}
	a.mu.Unlock()
	slices.SortFunc(released, func(x, y Allocation) int { return x.IP.Compare(y.IP) })
	if len(released) == 0 {
		return nil, nil
	}
	return released, a.persist()
}

// snapshot is what the state file should contain now.
func (a *allocator) snapshot() *stateFile {
	a.mu.RLock()
	defer a.mu.RUnlock()
	st := &stateFile{Version: stateVersion, Node: a.node, Allocations: []stateEntry{}}
	if a.pool == nil {
		st.CIDRs = a.restoredCIDRs
		for ip, e := range a.restored {
			st.Allocations = append(st.Allocations, stateEntry{IP: ip, Owner: e.owner, ContainerID: e.containerID})
		}
	} else {
		st.CIDRs = a.pool.CIDRs()
		for ip, owner := range a.pool.Dump() {
			if owner == pool.RouterOwner && ip == a.pool.RouterIP() {
				continue
			}
			st.Allocations = append(st.Allocations, stateEntry{IP: ip, Owner: owner, ContainerID: a.meta[ip].containerID})
		}
	}
	slices.SortFunc(st.Allocations, func(x, y stateEntry) int { return x.IP.Compare(y.IP) })
	return st
}

// persist writes the current state (unless persistence is off) and waits
// until a write that includes every change made before the call is done.
func (a *allocator) persist() error {
	a.publish()
	if a.state == nil {
		return nil
	}
	return a.state.commit(a.snapshot)
}
