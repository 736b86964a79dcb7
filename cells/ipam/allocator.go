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

	"github.com/cellium/cellium/cells/ipam/pool"
)

// allocator implements Allocator and Lookup over a pool.Pool that exists
// once the node has pod CIDRs. Every change is written to the state file
// before the call returns, so that a restarted agent restores it.
type allocator struct {
	node  string
	log   *slog.Logger
	state *stateStore // nil: nothing is persisted

	// ready is closed when pool is set.
	ready chan struct{}

	// mu guards the fields below. Allocate takes it for reading (the pool
	// has its own lock); everything that replaces the pool or touches
	// restored or unclaimed takes it for writing.
	mu   sync.RWMutex
	pool *pool.Pool
	// restored holds the allocations read from the state file until the
	// pool exists; nil afterwards.
	restored map[netip.Addr]string
	// restoredCIDRs are the CIDRs recorded in the state file, written back
	// as they were while the pool does not exist.
	restoredCIDRs []netip.Prefix
	// unclaimed are restored allocations that nobody has claimed again
	// with AllocateIP since the start (restoreGC may release them).
	unclaimed map[netip.Addr]string
	// loaded is set once restore has read the state file: before, a write
	// would replace the file with an empty state.
	loaded bool
}

var (
	_ Allocator = (*allocator)(nil)
	_ Lookup    = (*allocator)(nil)
)

// newAllocatorCore creates an allocator for node; state may be nil.
func newAllocatorCore(node string, state *stateStore, log *slog.Logger) *allocator {
	return &allocator{
		node:      node,
		log:       log,
		state:     state,
		ready:     make(chan struct{}),
		restored:  map[netip.Addr]string{},
		unclaimed: map[netip.Addr]string{},
	}
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
		a.log.Warn("IPAM state file lists an address twice; keeping the first owner", "ip", ip, "owner", prev, "ignored", e.Owner)
		return
	}
	a.restored[ip] = e.Owner
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
		close(a.ready)
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
	for _, ip := range ips {
		owner := a.restored[ip]
		if ip == p.RouterIP() {
			continue // the router is reserved by the pool itself
		}
		if err := p.AllocateIP(ip, owner); err != nil {
			a.log.Warn("dropping a restored address: it does not fit the node's pod CIDRs", "ip", ip, "owner", owner, "error", err)
			continue
		}
		a.unclaimed[ip] = owner
	}
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
func allocation(p *pool.Pool, ip netip.Addr, owner string) Allocation {
	return Allocation{IP: ip, Gateway: p.RouterIP(), CIDRs: p.CIDRs(), Owner: owner}
}

// AllocateNext implements Allocator.
//
// Possible errors: pool.ErrEmptyOwner; ErrNoPodCIDR when ctx ends before
// the node has pod CIDRs; pool.ErrPoolExhausted naming the CIDRs; a
// failure to write the state file (the address is then not allocated).
func (a *allocator) AllocateNext(ctx context.Context, owner string) (Allocation, error) {
	if owner == "" {
		return Allocation{}, fmt.Errorf("allocate IP: %w", pool.ErrEmptyOwner)
	}
	if err := a.wait(ctx); err != nil {
		return Allocation{}, fmt.Errorf("allocate IP for %s: %w", owner, err)
	}
	a.mu.RLock()
	p := a.pool
	ip, err := p.Allocate(owner)
	a.mu.RUnlock()
	if err != nil {
		return Allocation{}, fmt.Errorf("allocate IP for %s: %w", owner, err)
	}
	if err := a.persist(); err != nil {
		a.undo(ip, owner)
		return Allocation{}, fmt.Errorf("allocate IP for %s: %w", owner, err)
	}
	return allocation(p, ip, owner), nil
}

// undo releases ip if owner still holds it.
func (a *allocator) undo(ip netip.Addr, owner string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if cur, ok := a.pool.Owner(ip); ok && cur == owner {
		_ = a.pool.Release(ip)
	}
}

// AllocateIP implements Allocator. Claiming a restored address with its
// recorded owner marks it as in use (see restoreGC).
//
// Possible errors: pool.ErrEmptyOwner; ErrNoPodCIDR when ctx ends before
// the node has pod CIDRs; pool.ErrNotInPool; pool.ErrInUse naming the
// current owner; a failure to write the state file.
func (a *allocator) AllocateIP(ctx context.Context, ip netip.Addr, owner string) (Allocation, error) {
	if owner == "" {
		return Allocation{}, fmt.Errorf("allocate %v: %w", ip, pool.ErrEmptyOwner)
	}
	if err := a.wait(ctx); err != nil {
		return Allocation{}, fmt.Errorf("allocate %v for %s: %w", ip, owner, err)
	}
	ip = ip.Unmap()
	a.mu.Lock()
	p := a.pool
	cur, held := p.Owner(ip)
	err := p.AllocateIP(ip, owner)
	if err == nil && a.unclaimed[ip] == owner {
		delete(a.unclaimed, ip)
	}
	a.mu.Unlock()
	if err != nil {
		return Allocation{}, err
	}
	if !held || cur != owner {
		if err := a.persist(); err != nil {
			a.undo(ip, owner)
			return Allocation{}, fmt.Errorf("allocate %v for %s: %w", ip, owner, err)
		}
	}
	return allocation(p, ip, owner), nil
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

// RouterIP implements Allocator.
func (a *allocator) RouterIP() (netip.Addr, bool) {
	a.mu.RLock()
	defer a.mu.RUnlock()
	if a.pool == nil {
		return netip.Addr{}, false
	}
	return a.pool.RouterIP(), true
}

// OwnedBy implements Lookup.
func (a *allocator) OwnedBy(ctx context.Context, owner string) ([]netip.Addr, error) {
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
	a.mu.RUnlock()
	if p == nil {
		return nil
	}
	dump := p.Dump()
	out := make([]Allocation, 0, len(dump))
	for ip, owner := range dump {
		out = append(out, allocation(p, ip, owner))
	}
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
		for ip, owner := range a.restored {
			st.Allocations = append(st.Allocations, stateEntry{IP: ip, Owner: owner})
		}
	} else {
		st.CIDRs = a.pool.CIDRs()
		for ip, owner := range a.pool.Dump() {
			if owner == pool.RouterOwner && ip == a.pool.RouterIP() {
				continue
			}
			st.Allocations = append(st.Allocations, stateEntry{IP: ip, Owner: owner})
		}
	}
	slices.SortFunc(st.Allocations, func(x, y stateEntry) int { return x.IP.Compare(y.IP) })
	return st
}

// persist writes the current state (unless persistence is off) and waits
// until a write that includes every change made before the call is done.
func (a *allocator) persist() error {
	if a.state == nil {
		return nil
	}
	return a.state.commit(a.snapshot)
}
