// Package datapathmonitor composes the agent's datapath monitor cell: it
// reads the eBPF datapath's cellium_events ring buffer into the monitor
// hub (cells/monitor serves it as GET /v1/monitor, `cellium monitor`) and
// registers the Prometheus collector of the cellium_metrics counters
// (datapath/monitor). Like daemon/hostrouting it is a package of its own,
// composed only by cellium-agent's main, so that what links the daemon
// package does not link the datapath.
//
// It declares no flag: it follows the loader cell's --enable-bpf-datapath
// and --bpf-root (daemon/bpfloader), reading their values, and does
// nothing when the BPF datapath is off or not part of the agent.
package datapathmonitor

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/datapath/maps"
	"github.com/cellium/cellium/datapath/monitor"
	hub "github.com/cellium/cellium/statedb/monitor"
)

// The loader cell's flags this cell follows.
const (
	// EnableFlag switches the BPF datapath on (default true).
	EnableFlag = "enable-bpf-datapath"
	// BPFRootFlag is where bpffs is mounted; the maps are pinned in
	// <bpf-root>/cellium.
	BPFRootFlag = "bpf-root"
	// DefaultBPFRoot is --bpf-root's default.
	DefaultBPFRoot = "/sys/fs/bpf"
)

// PollInterval is how often the cell looks for the pinned maps until
// they exist: the loader creates them with the first endpoint's programs.
const PollInterval = 2 * time.Second

// LostPollInterval is how often the cell reads the datapath's count of
// events the ring buffer had no room for and reports the new ones to the
// hub (Hubble turns them into LostEvents of source
// PERF_EVENT_RING_BUFFER).
const LostPollInterval = 250 * time.Millisecond

// Locator says where the datapath's maps are pinned, or that the BPF
// datapath is off (on false).
type Locator func(hive.FlagValues) (dir string, on bool)

// LoaderFlags locates the maps where the loader pins them:
// <--bpf-root>/cellium, when --enable-bpf-datapath is true. An agent
// without the loader cell has neither flag: the datapath is off.
func LoaderFlags(f hive.FlagValues) (string, bool) {
	all := f.All()
	if on, ok := all[EnableFlag]; !ok || on != "true" {
		return "", false
	}
	root := all[BPFRootFlag]
	if root == "" {
		root = DefaultBPFRoot
	}
	return filepath.Join(root, "cellium"), true
}

// Cell reads the maps the loader pins.
var Cell = NewCell(LoaderFlags)

// NewCell is Cell with the maps where locate says (tests give a bpffs
// directory of their own).
func NewCell(locate Locator) hive.Cell {
	return hive.Module("datapath-monitor", "Datapath events into the monitor hub, drop and forward counters as metrics",
		// Job "read-datapath-events" and the cellium_drop_*/forward_*
		// collector, only when the BPF datapath is on.
		hive.Invoke(func(p params) error { return register(p, locate) }),
	)
}

type params struct {
	hive.In
	Flags     hive.FlagValues
	Publisher hub.Publisher
	Registry  prometheus.Registerer
	Jobs      hive.Jobs
}

func register(p params, locate Locator) error {
	dir, on := locate(p.Flags)
	if !on {
		return nil
	}
	var current atomic.Pointer[maps.Metrics]
	collector := monitor.NewCollector(func() monitor.MetricsSource {
		if m := current.Load(); m != nil {
			return m
		}
		return nil
	})
	if err := p.Registry.Register(collector); err != nil {
		return fmt.Errorf("register datapath metrics: %w", err)
	}
	p.Jobs.Add(hive.Service("read-datapath-events", nil, func(ctx context.Context, h hive.Health) {
		run(ctx, h, dir, p.Publisher, &current)
	}))
	return nil
}

// run waits for the pinned maps, then publishes the ring buffer's events
// until ctx ends.
func run(ctx context.Context, h hive.Health, dir string, pub hub.Publisher, current *atomic.Pointer[maps.Metrics]) {
	m := open(ctx, h, dir)
	if m == nil {
		return
	}
	defer m.Close()
	current.Store(m.Metrics)
	defer current.Store(nil)

	rd, err := m.NewEventReader()
	if err != nil {
		h.Degraded("open the event ring buffer", err)
		<-ctx.Done()
		return
	}
	// Closing the reader ends a blocked read.
	stop := context.AfterFunc(ctx, func() { _ = rd.Close() })
	defer stop()
	h.OK("reading " + filepath.Join(dir, maps.EventsMapName))
	if lp, ok := pub.(hub.LostPublisher); ok {
		done := make(chan struct{})
		polled := make(chan struct{})
		defer func() { close(done); <-polled }()
		go func() {
			defer close(polled)
			pollLost(m.EventsLost, lp, done)
		}()
	}
	if err := monitor.NewReader(rd, pub).Run(); err != nil {
		h.Degraded("read datapath events", err)
		<-ctx.Done()
	}
	_ = rd.Close()
}

// pollLost reports the growth of the datapath's lost-event count to lp
// every LostPollInterval until done is closed. What was counted before
// it started (an earlier agent's losses, in the pinned map) is not
// reported.
func pollLost(l *maps.EventsLost, lp hub.LostPublisher, done <-chan struct{}) {
	last, err := l.Read()
	if err != nil {
		return
	}
	t := time.NewTicker(LostPollInterval)
	defer t.Stop()
	for {
		select {
		case <-done:
			return
		case <-t.C:
		}
		n, err := l.Read()
		if err != nil || n <= last {
			continue
		}
		lp.PublishLost(n - last)
		last = n
	}
}

// open waits until the loader has pinned the events map in dir and opens
// the global maps; nil when ctx ended first.
func open(ctx context.Context, h hive.Health, dir string) *maps.Maps {
	pin := filepath.Join(dir, maps.EventsMapName)
	t := time.NewTicker(PollInterval)
	defer t.Stop()
	for {
		_, err := os.Stat(pin)
		switch {
		case err == nil:
			m, err := maps.Open(dir)
			if err == nil {
				return m
			}
			h.Degraded("open the datapath's maps in "+dir, err)
		case errors.Is(err, os.ErrNotExist):
			h.OK("waiting for " + pin + " (pinned with the first endpoint's programs)")
		default:
			h.Degraded("look for "+pin, err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}
