package endpointmanager

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/statedb/endpoints"
)

// Backoff of the retries of a stuck endpoint: the first retry comes
// RetryMin after the failure, each further one twice as late, at most
// RetryMax apart.
const (
	RetryMin = time.Second
	RetryMax = 2 * time.Minute
)

// PodsSyncWait bounds how long an endpoint create waits for the first list
// of this node's pods: without the API server (a reboot while the control
// plane is down) the create fails fast with ErrUnavailable, which the CNI
// plugin reports as "try again later" (code 11).
const PodsSyncWait = 2 * time.Second

// RegenerationWait bounds how long a create that asks for it
// (sync-build-endpoint, as the CNI plugin does) waits for the endpoint's
// first regeneration, within the plugin's 2-minute ADD timeout.
const RegenerationWait = time.Minute

// RestoreIdentityWait bounds how long restore waits for the identity of a
// restored endpoint's saved labels before its pod is known: the identity
// restored from the state file resolves at once; any other needs the API.
const RestoreIdentityWait = 2 * time.Second

// markFailed records in the endpoint's log why it is stuck (a failed entry,
// which Endpoint.Failure reports and the CEP mirrors), so that the retry
// job picks it up and health says so. Placeholders are never saved.
func (m *Manager) markFailed(id uint16, msg string) {
	err := m.modify(id, func(cur *endpoints.Endpoint) *endpoints.Endpoint {
		if isPlaceholder(cur) {
			return nil
		}
		next := cur.WithFailure(msg, m.now())
		if len(next.Log) == len(cur.Log) && next.Failure() == cur.Failure() {
			return nil // the same failure again: nothing to write
		}
		return next
	})
	if err != nil && !errors.Is(err, ErrNotFound) {
		m.log.Warn("record endpoint failure", "endpoint", id, "error", err)
	}
}

// retrier retries every stuck endpoint (Endpoint.Failure is set: a
// restored endpoint whose identity could not be resolved, a relabelled one
// whose new identity could not be allocated, ...) with exponential
// backoff, and reports the module degraded while any endpoint is stuck.
type retrier struct {
	m        *Manager
	min, max time.Duration
	// retry resolves one endpoint again; Manager.retryEndpoint outside
	// tests.
	retry func(ctx context.Context, ep *endpoints.Endpoint)
}

// retryEndpoint recomputes the endpoint's labels from its pod and
// resolves its identity again; a failure is recorded by relabel.
func (m *Manager) retryEndpoint(ctx context.Context, ep *endpoints.Endpoint) {
	if _, err := m.relabel(ctx, ep, nil, true); err != nil {
		m.log.Info("endpoint still stuck; retrying later", "endpoint", ep.ID, "pod", ep.PodKey(), "error", err)
	} else {
		m.log.Info("stuck endpoint recovered", "endpoint", ep.ID, "pod", ep.PodKey())
	}
}

type backoffState struct {
	next  time.Time
	delay time.Duration
}

func (r *retrier) run(ctx context.Context, h hive.Health) {
	m := r.m
	pending := map[uint16]*backoffState{}
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		txn := m.db.ReadTxn()
		all, watch := m.table.AllWatch(txn)
		var stuck []*endpoints.Endpoint
		for ep := range all {
			if ep.Failure() != "" {
				stuck = append(stuck, ep)
			}
		}
		report(h, stuck)

		now := time.Now()
		seen := map[uint16]bool{}
		var wake time.Time
		for _, ep := range stuck {
			seen[ep.ID] = true
			if isPlaceholder(ep) {
				continue // nothing to resolve; the operator decides
			}
			st := pending[ep.ID]
			if st == nil {
				st = &backoffState{next: now.Add(r.min), delay: r.min}
				pending[ep.ID] = st
			}
			if !now.Before(st.next) {
				r.retry(ctx, ep)
				if ctx.Err() != nil {
					return
				}
				st.delay = min(2*st.delay, r.max)
				st.next = time.Now().Add(st.delay)
			}
			if wake.IsZero() || st.next.Before(wake) {
				wake = st.next
			}
		}
		for id := range pending {
			if !seen[id] {
				delete(pending, id) // recovered or deleted
			}
		}
		var tick <-chan time.Time
		if !wake.IsZero() {
			timer.Reset(time.Until(wake))
			tick = timer.C
		}
		select {
		case <-ctx.Done():
			h.Stopped("stopped")
			return
		case <-watch:
		case <-tick:
		}
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
	}
}

// report sets the health: degraded, naming the stuck endpoints and why,
// while there are any.
func report(h hive.Health, stuck []*endpoints.Endpoint) {
	if len(stuck) == 0 {
		h.OK("no endpoint is stuck")
		return
	}
	var reasons []string
	for i, ep := range stuck {
		if i == 3 {
			reasons = append(reasons, fmt.Sprintf("and %d more (cellium endpoint list)", len(stuck)-i))
			break
		}
		who := ep.PodKey()
		if who == "" {
			who = "no pod known"
		}
		reasons = append(reasons, fmt.Sprintf("endpoint %d (%s): %s", ep.ID, who, ep.Failure()))
	}
	h.Degraded(fmt.Sprintf("%d endpoint(s) stuck; retrying with backoff", len(stuck)), errors.New(strings.Join(reasons, "; ")))
}
