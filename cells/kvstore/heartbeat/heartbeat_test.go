package heartbeat

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/cells/hive/hivetest"
	"github.com/cellium/cellium/cells/kvstore"
	"github.com/cellium/cellium/test/harness"
)

// recHealth keeps the last report.
type recHealth struct {
	mu       sync.Mutex
	degraded bool
	msg, err string
}

func (h *recHealth) OK(msg string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.degraded, h.msg, h.err = false, msg, ""
}

func (h *recHealth) Degraded(msg string, err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.degraded, h.msg, h.err = true, msg, err.Error()
}
func (h *recHealth) Stopped(string)           {}
func (h *recHealth) Scope(string) hive.Health { return h }
func (h *recHealth) get() (bool, string, string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.degraded, h.msg, h.err
}

// waitFor polls cond until it holds or d passes.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", d, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// startClient starts a kvstore client with its session against url until
// the test ends.
func startClient(t *testing.T, url string) *kvstore.Client {
	t.Helper()
	cfg, err := kvstore.EtcdConfig(map[string]string{kvstore.OptAddress: url})
	if err != nil {
		t.Fatal(err)
	}
	c := kvstore.NewClient(hivetest.Logger(t), cfg, 30*time.Second)
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { c.RunSession(ctx, &recHealth{}); close(done) }()
	t.Cleanup(func() { cancel(); <-done; _ = c.Close() })
	return c
}

// TestIntegrationHeartbeat: the operator's writer puts cilium/.heartbeat
// (an RFC 3339 time, with its session lease); an agent watching it is OK;
// with the writer stopped the agent reports the session stale after the
// timeout and counts it, and a new write makes it OK again.
func TestIntegrationHeartbeat(t *testing.T) {
	if testing.Short() {
		t.Skip("needs etcd")
	}
	e := harness.StartEtcd(t)
	operator, agent := startClient(t, e.URL()), startClient(t, e.URL())
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	const interval, timeout = 100 * time.Millisecond, 2 * time.Second
	var ah recHealth
	var staleChecks atomic.Int64
	actx, acancel := context.WithCancel(ctx)
	adone := make(chan struct{})
	go func() { agent.WatchHeartbeat(actx, &ah, timeout, func() { staleChecks.Add(1) }); close(adone) }()
	defer func() { acancel(); <-adone }()

	wh := &recHealth{}
	w := &Writer{KV: operator, Interval: interval, Log: hivetest.Logger(t), Health: wh}
	wctx, wcancel := context.WithCancel(ctx)
	wdone := make(chan struct{})
	go func() { _ = w.Run(wctx); close(wdone) }()

	waitFor(t, 10*time.Second, "the heartbeat key", func() bool {
		resp, err := operator.Etcd().Get(ctx, kvstore.HeartbeatPath)
		return err == nil && len(resp.Kvs) == 1
	})
	resp, err := operator.Etcd().Get(ctx, kvstore.HeartbeatPath)
	if err != nil {
		t.Fatal(err)
	}
	kv := resp.Kvs[0]
	if ts, err := time.Parse(time.RFC3339, string(kv.Value)); err != nil || time.Since(ts) > time.Minute {
		t.Errorf("heartbeat value %q: want the current time in RFC 3339 (%v)", kv.Value, err)
	}
	if lease, _ := operator.Session(); kv.Lease != int64(lease) || lease == 0 {
		t.Errorf("heartbeat key lease %x, want the writer's session lease %x", kv.Lease, lease)
	}
	if deg, msg, _ := wh.get(); deg || !strings.Contains(msg, kvstore.HeartbeatPath) {
		t.Errorf("writer health degraded=%v %q", deg, msg)
	}
	waitFor(t, 10*time.Second, "the agent to see a heartbeat", func() bool {
		deg, msg, _ := ah.get()
		return !deg && strings.HasPrefix(msg, "last heartbeat ")
	})
	// Writes keep coming: well past the timeout the agent stays OK.
	time.Sleep(2 * timeout)
	if deg, msg, err := ah.get(); deg || !strings.HasPrefix(msg, "last heartbeat ") {
		t.Fatalf("agent stale while the writer runs: %s: %s", msg, err)
	}
	if n := staleChecks.Load(); n != 0 {
		t.Errorf("%d stale checks while the writer runs", n)
	}

	// The writer stops (the operator died): stale after the timeout.
	wcancel()
	<-wdone
	stopped := time.Now()
	isStale := func(h *recHealth) bool {
		deg, msg, _ := h.get()
		if deg {
			t.Errorf("heartbeat watcher degraded (%q): a stale heartbeat must not fail the agent's readiness", msg)
		}
		return strings.HasPrefix(msg, "stale: ")
	}
	waitFor(t, 10*time.Second, "the agent to report the heartbeat stale", func() bool { return isStale(&ah) })
	if d := time.Since(stopped); d < timeout-interval {
		t.Errorf("stale after %s, before the timeout %s", d, timeout)
	}
	if _, msg, _ := ah.get(); !strings.Contains(msg, "since last heartbeat update has been received") || !strings.Contains(msg, "cellium-operator") {
		t.Errorf("stale report %q", msg)
	}
	if staleChecks.Load() == 0 {
		t.Error("stale not counted")
	}

	// One write brings it back.
	if err := w.Write(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the agent to see heartbeats again", func() bool {
		_, msg, _ := ah.get()
		return strings.HasPrefix(msg, "last heartbeat ")
	})

	// An agent that starts while etcd is unreachable sees no heartbeat
	// either: stale after the timeout, not stuck reading the key.
	if err := e.Stop(); err != nil {
		t.Fatal(err)
	}
	var dh recHealth
	dctx, dcancel := context.WithCancel(ctx)
	ddone := make(chan struct{})
	go func() { agent.WatchHeartbeat(dctx, &dh, timeout, nil); close(ddone) }()
	defer func() { dcancel(); <-ddone }()
	waitFor(t, 3*timeout, "stale with etcd down", func() bool { return isStale(&dh) })
}

// TestIntegrationAgentCellHeartbeat: the kvstore cell watches the
// heartbeat and shows it in the module health `cellium status` prints.
func TestIntegrationAgentCellHeartbeat(t *testing.T) {
	if testing.Short() {
		t.Skip("needs etcd")
	}
	e := harness.StartEtcd(t)
	op := startClient(t, e.URL())
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := (&Writer{KV: op, Interval: time.Minute, Log: hivetest.Logger(t), Health: &recHealth{}}).Write(ctx); err != nil {
		t.Fatal(err)
	}
	var (
		rep hive.HealthReporter
		c   *kvstore.Client
	)
	reg := prometheus.NewRegistry()
	hivetest.Start(t, []string{"--kvstore=etcd", "--kvstore-opt=etcd.address=" + e.URL()}, kvstore.Cell, WatcherCell,
		hive.Provide(func() prometheus.Registerer { return reg }), hivetest.Capture(&rep), hivetest.Capture(&c))
	waitFor(t, 20*time.Second, "the heartbeat in the kvstore module's health", func() bool {
		for _, s := range rep.Statuses() {
			if strings.HasSuffix(s.ID, "kvstore-heartbeat") && s.Level == hive.LevelOK && strings.HasPrefix(s.Message, "last heartbeat ") {
				return true
			}
		}
		return false
	})
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	if len(mfs) != 1 || mfs[0].GetName() != "cellium_kvstore_quorum_errors_total" {
		t.Errorf("metrics %v, want cellium_kvstore_quorum_errors_total", mfs)
	}
	// Without --kvstore: nothing.
	hivetest.Start(t, nil, kvstore.Cell, WatcherCell)
}
