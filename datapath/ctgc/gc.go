package ctgc

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/cellium/cellium/datapath/maps"
)

// Table is the conntrack map a GC walks; *maps.CT4 implements it.
type Table interface {
	// Iterate calls yield for every entry until it returns false.
	Iterate(yield func(maps.CTKey, maps.CTEntry) bool) error
	// Lookup returns the entry of k, or an error wrapping
	// ebpf.ErrKeyNotExist.
	Lookup(k maps.CTKey) (maps.CTEntry, error)
	// Delete removes k; a missing entry is not an error.
	Delete(k maps.CTKey) error
}

// Clock returns the current time of the clock the programs stamp entries
// with (bpf_ktime_get_ns: CLOCK_MONOTONIC), in nanoseconds.
type Clock func() (uint64, error)

// Monotonic is the programs' clock, CLOCK_MONOTONIC.
func Monotonic() (uint64, error) {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return 0, fmt.Errorf("read CLOCK_MONOTONIC: %w", err)
	}
	return uint64(ts.Nano()), nil
}

// Family is the address family label of the conntrack metrics; cellium
// has an IPv4 conntrack map only.
const Family = "ipv4"

// ExpiringTable is any map of entries with a deadline on the programs'
// clock, keyed by K: the NodePort NAT maps (datapath/maps
// NodePortCT4Expiry, NodePortRev4Expiry).
type ExpiringTable[K comparable] interface {
	// Iterate calls yield with every entry's key and deadline until it
	// returns false.
	Iterate(yield func(k K, expires uint64) bool) error
	// Expires returns k's deadline, or an error wrapping
	// ebpf.ErrKeyNotExist.
	Expires(k K) (uint64, error)
	// Delete removes k; a missing entry is not an error.
	Delete(k K) error
}

// ctTable is a Table seen as an ExpiringTable.
type ctTable struct{ Table }

func (t ctTable) Iterate(yield func(maps.CTKey, uint64) bool) error {
	return t.Table.Iterate(func(k maps.CTKey, e maps.CTEntry) bool { return yield(k, e.Expires) })
}

func (t ctTable) Expires(k maps.CTKey) (uint64, error) {
	e, err := t.Lookup(k)
	return e.Expires, err
}

// GC deletes a conntrack map's expired entries. Create it with New.
type GC struct {
	pass     func(ctx context.Context, now uint64) (Result, error)
	name     string
	capacity int
	now      Clock
	metrics  *Metrics
	// conntrack: the passes are the conntrack map's (all metrics);
	// otherwise only the map's pressure is recorded.
	conntrack bool
}

// New collects ct, the map called name with room for capacity entries,
// with the time of now (Monotonic outside tests), recording each pass in
// m (nil: nowhere).
func New(ct Table, name string, capacity int, now Clock, m *Metrics) *GC {
	return &GC{pass: passOf[maps.CTKey](ctTable{ct}), name: name, capacity: capacity, now: now, metrics: m, conntrack: true}
}

// NewExpiring collects another map of expiring entries (the NodePort NAT
// maps, which evict nothing either) the same way; only the map's pressure
// goes into m (cellium_bpf_map_pressure with the map's name).
func NewExpiring[K comparable](t ExpiringTable[K], name string, capacity int, now Clock, m *Metrics) *GC {
	return &GC{pass: passOf(t), name: name, capacity: capacity, now: now, metrics: m}
}

// Result is what one pass found.
type Result struct {
	// Alive is the number of entries left in the map (those the pass
	// found alive or saw refreshed).
	Alive int
	// Deleted is the number of expired entries it deleted.
	Deleted int
	// Duration is how long the pass took.
	Duration time.Duration
}

// Pressure is the fraction of the map's capacity the entries left use,
// 0 to 1: near 1, new connections are about to be dropped (reason 155).
func (r Result) Pressure(capacity int) float64 {
	if capacity <= 0 {
		return 0
	}
	return float64(r.Alive) / float64(capacity)
}

// Run makes one pass: it lists the map, taking the entries whose deadline
// is not after the pass's start as expired (the programs only use an
// entry whose deadline is later than their clock), then looks each of
// those up again and deletes it unless its deadline moved past the
// start: a connection refreshed between the listing and the deletion
// keeps its entry. A refresh in the few microseconds between that lookup
// and the deletion is lost: the connection's next packet is checked
// against the policy again and opens a new entry if it is allowed. Entries
// that vanish meanwhile are fine. It stops early, with ctx's error, when
// ctx ends.
func (g *GC) Run(ctx context.Context) (res Result, err error) {
	start := time.Now()
	defer func() {
		res.Duration = time.Since(start)
		g.metrics.record(g.name, g.capacity, g.conntrack, res, err)
	}()
	now, err := g.now()
	if err != nil {
		return res, err
	}
	res, err = g.pass(ctx, now)
	if err != nil && ctx.Err() == nil {
		err = fmt.Errorf("%s: %w", g.name, err)
	}
	return res, err
}

// passOf is Run's pass over t at now.
func passOf[K comparable](t ExpiringTable[K]) func(ctx context.Context, now uint64) (Result, error) {
	return func(ctx context.Context, now uint64) (res Result, err error) {
		var expired []K
		seen := 0
		if err := t.Iterate(func(k K, expires uint64) bool {
			seen++
			if expires <= now {
				expired = append(expired, k)
			}
			return seen%4096 != 0 || ctx.Err() == nil
		}); err != nil {
			return res, fmt.Errorf("list: %w", err)
		}
		if err := ctx.Err(); err != nil {
			return res, err
		}
		res.Alive = seen
		for i, k := range expired {
			if i%4096 == 4095 && ctx.Err() != nil {
				return res, ctx.Err()
			}
			expires, err := t.Expires(k)
			switch {
			case errors.Is(err, ebpf.ErrKeyNotExist):
				res.Alive-- // gone meanwhile
				continue
			case err != nil:
				return res, fmt.Errorf("look up entry %v: %w", k, err)
			case expires > now:
				continue // refreshed since the listing
			}
			if err := t.Delete(k); err != nil {
				return res, fmt.Errorf("delete entry %v: %w", k, err)
			}
			res.Alive--
			res.Deleted++
		}
		return res, nil
	}
}
