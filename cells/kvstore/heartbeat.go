package kvstore

import (
	"context"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/cellium/cellium/cells/hive"
)

// Heartbeat key and timing (Cilium's pkg/kvstore).
const (
	// HeartbeatPath is the key the operator's leader writes the current
	// time to (RFC 3339), attached to its session lease.
	HeartbeatPath = "cilium/.heartbeat"
	// HeartbeatWriteInterval is how often the operator writes it.
	HeartbeatWriteInterval = time.Minute
	// HeartbeatTimeout is how long without a heartbeat the session counts
	// as stale: two write intervals, as Cilium's status checker.
	HeartbeatTimeout = 2 * HeartbeatWriteInterval
)

// QuorumErrorNoHeartbeat is the "error" label of
// cellium_kvstore_quorum_errors_total counted at each check that finds
// the heartbeat stale (Cilium's label value).
const QuorumErrorNoHeartbeat = "no event received"

// WatchHeartbeat watches HeartbeatPath until ctx ends and reports on h:
// whether a write (a put, not a delete) arrived within timeout, calling
// stale at each check that finds none (every timeout/4). A stale
// heartbeat stays at level OK with a message starting "stale:": as for
// Cilium's main kvstore connection, agents work without an operator, so
// a missing heartbeat must not fail their readiness. As in Cilium, the time of arrival counts,
// not the value written, so that clocks need not agree; the timeout runs
// from the start of the watch.
func (c *Client) WatchHeartbeat(ctx context.Context, h hive.Health, timeout time.Duration, stale func()) {
	var (
		last    = time.Now()
		got     bool   // a heartbeat arrived since the start
		value   string // the last one written
		isStale bool
	)
	check := time.NewTicker(max(timeout/4, 10*time.Millisecond))
	defer check.Stop()
	report := func() {
		since := time.Since(last).Truncate(time.Millisecond)
		switch {
		case since > timeout:
			isStale = true
			if stale != nil {
				stale()
			}
			h.OK(fmt.Sprintf("stale: %s since last heartbeat update has been received (the cellium-operator leader writes %s every %s; is it running and connected to etcd?)",
				since, HeartbeatPath, HeartbeatWriteInterval))
		case got:
			isStale = false
			h.OK(fmt.Sprintf("last heartbeat %s received %s ago", value, since))
		default:
			h.OK(fmt.Sprintf("waiting for the first heartbeat (stale after %s)", timeout))
		}
	}
	report()
	for ctx.Err() == nil {
		// Bounded, so that the checks go on while etcd is unreachable.
		gctx, gcancel := context.WithTimeout(ctx, max(timeout/4, 100*time.Millisecond))
		resp, err := c.etcd.Get(gctx, HeartbeatPath)
		gcancel()
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			c.log.Debug("Cannot read the kvstore heartbeat; retrying", "error", err)
			if !c.waitOrCheck(ctx, check, time.Second, report) {
				return
			}
			continue
		}
		if len(resp.Kvs) == 1 {
			last, got, value = time.Now(), true, string(resp.Kvs[0].Value)
			report()
		}
		wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
		wch := c.etcd.Watch(wctx, HeartbeatPath, clientv3.WithRev(resp.Header.Revision+1))
	watch:
		for {
			select {
			case <-ctx.Done():
				cancel()
				return
			case <-check.C:
				if isStale || time.Since(last) > timeout {
					report()
				}
			case wr, ok := <-wch:
				if !ok || wr.Err() != nil {
					break watch // re-read and watch again
				}
				for _, ev := range wr.Events {
					if ev.Type == clientv3.EventTypePut {
						last, got, value = time.Now(), true, string(ev.Kv.Value)
						report()
					}
				}
			}
		}
		cancel()
	}
}

// waitOrCheck waits d, running report at each check tick meanwhile;
// false when ctx ended.
func (c *Client) waitOrCheck(ctx context.Context, check *time.Ticker, d time.Duration, report func()) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
			return true
		case <-check.C:
			report()
		}
	}
}
