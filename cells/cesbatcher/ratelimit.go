package cesbatcher

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// RateLimit is one step of --ces-rate-limits: from Nodes CiliumNodes on,
// Limit slice writes a second with bursts of Burst.
type RateLimit struct {
	Nodes int     `json:"nodes"`
	Limit float64 `json:"limit"`
	Burst int     `json:"burst"`
}

// RateLimits are the steps, by Nodes ascending.
type RateLimits []RateLimit

// ParseRateLimits parses and checks a --ces-rate-limits value: a JSON
// list of at least one step with no other fields, each with nodes >= 0,
// 0 < limit <= MaxWriteQPS and 0 < burst <= MaxWriteBurst, no two with
// the same nodes. The steps are returned sorted by nodes.
func ParseRateLimits(s string) (RateLimits, error) {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("invalid --%s=%s: %s", FlagRateLimits, s, fmt.Sprintf(format, a...))
	}
	dec := json.NewDecoder(bytes.NewReader([]byte(s)))
	dec.DisallowUnknownFields()
	var rl RateLimits
	if err := dec.Decode(&rl); err != nil {
		return nil, bad(`want a JSON list of {"nodes":N,"limit":L,"burst":B}: %v`, err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, bad("want one JSON list, found more after it")
	}
	if len(rl) == 0 {
		return nil, bad("the list is empty: want at least one step")
	}
	slices.SortStableFunc(rl, func(x, y RateLimit) int { return x.Nodes - y.Nodes })
	for i, r := range rl {
		switch {
		case r.Nodes < 0:
			return nil, bad("nodes %d: must not be negative", r.Nodes)
		case i > 0 && rl[i-1].Nodes == r.Nodes:
			return nil, bad("two steps for %d nodes", r.Nodes)
		case r.Limit <= 0 || r.Limit > MaxWriteQPS:
			return nil, bad("step for %d nodes: limit %v must be greater than 0 and at most %d", r.Nodes, r.Limit, MaxWriteQPS)
		case r.Burst <= 0 || r.Burst > MaxWriteBurst:
			return nil, bad("step for %d nodes: burst %d must be greater than 0 and at most %d", r.Nodes, r.Burst, MaxWriteBurst)
		}
	}
	return rl, nil
}

// For returns the step for a cluster of nodes CiliumNodes: the last one
// whose Nodes is at most nodes, or the first one when nodes is below
// them all (as Cilium).
func (rl RateLimits) For(nodes int) RateLimit {
	i := 0
	for i < len(rl)-1 && rl[i+1].Nodes <= nodes {
		i++
	}
	return rl[i]
}

// writeLimiter is the token bucket slice writes pass, its rate and burst
// following the cluster's size.
type writeLimiter struct {
	steps RateLimits
	lim   *rate.Limiter
	log   *slog.Logger
	// now is the clock the bucket's changes are made at (tests set it).
	now func() time.Time

	mu  sync.Mutex
	cur RateLimit
}

// newWriteLimiter starts at the step for no nodes (the cluster's size is
// not known yet).
func newWriteLimiter(steps RateLimits, log *slog.Logger) *writeLimiter {
	cur := steps.For(0)
	return &writeLimiter{steps: steps, cur: cur, log: log, now: time.Now, lim: rate.NewLimiter(rateOf(cur), cur.Burst)}
}

// SetNodes picks the step for nodes CiliumNodes and, when it is another
// step, gives the bucket its rate and burst. It reports whether the step
// changed.
func (w *writeLimiter) SetNodes(nodes int) bool {
	next := w.steps.For(nodes)
	w.mu.Lock()
	defer w.mu.Unlock()
	if next == w.cur {
		return false
	}
	w.cur = next
	now := w.now()
	w.lim.SetBurstAt(now, next.Burst)
	w.lim.SetLimitAt(now, rateOf(next))
	w.log.Info("Updating rate limit", "nodes", nodes, "workQueueQPSLimit", next.Limit, "workQueueBurstLimit", next.Burst)
	return true
}

// Current returns the step in force.
func (w *writeLimiter) Current() RateLimit {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.cur
}

// rateOf is a step's rate as the bucket takes it.
func rateOf(r RateLimit) rate.Limit { return rate.Limit(r.Limit) }
