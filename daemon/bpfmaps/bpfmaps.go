// Package bpfmaps composes the agent's BPF map cell: the lxc-map and
// policy-maps tables (statedb/mapstate), the deriver that fills them, the
// reconcilers of the ipcache, lxc-map and policy-maps tables into the
// pinned BPF maps (datapath/mapsync), and the conntrack map's garbage
// collector (datapath/ctgc, every --conntrack-gc-interval), behind
// --enable-bpf-datapath with --bpf-root (datapath/bpfconfig). Like daemon/hostrouting it is a package of its own,
// composed only by cellium-agent's main, so that the daemon package does
// not link the datapath.
package bpfmaps

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/cilium/statedb"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/cells/hive/reconcilejob"
	"github.com/cellium/cellium/datapath/bpfconfig"
	"github.com/cellium/cellium/datapath/ctgc"
	"github.com/cellium/cellium/datapath/maps"
	"github.com/cellium/cellium/datapath/mapsync"
	"github.com/cellium/cellium/statedb/endpoints"
	"github.com/cellium/cellium/statedb/ipcache"
	"github.com/cellium/cellium/statedb/mapstate"
	"github.com/cellium/cellium/statedb/policy"
)

// FullInterval is how often the endpoint and policy maps are checked
// against their tables again (repairing and pruning what changed behind
// the agent's back); IPCacheFullInterval the same for the ipcache, whose
// full pass writes every prefix again.
const (
	FullInterval        = 30 * time.Second
	IPCacheFullInterval = 2 * time.Minute
)

// Targets are the maps the reconcilers write.
type Targets struct {
	IPCache   mapsync.Map[netip.Prefix, mapsync.IPCacheValue]
	Endpoints mapsync.Map[netip.Addr, mapsync.EndpointInfo]
	Policies  mapsync.PolicyMaps
	// Conntrack is the conntrack map the garbage collector walks (nil:
	// none), ConntrackSize its capacity.
	Conntrack     ctgc.Table
	ConntrackSize int
	// NAT gives the collectors of the other maps whose expired entries
	// the GC job deletes with the conntrack map's (the NodePort NAT
	// maps); may be nil.
	NAT func(*ctgc.Metrics) []*ctgc.GC
	// Close releases the maps (they stay pinned); may be nil.
	Close func() error
}

// Opener opens (creating and pinning when missing) the maps in pinDir. It
// runs in the hive's start.
type Opener func(pinDir string) (Targets, error)

// Cell is the agent's cell: the maps of datapath/maps pinned in
// <bpf-root>/cellium (bpffs mounted there if needed).
var Cell = NewCell(OpenPinned)

// OpenPinned opens (creating and pinning when missing) the agent's global
// maps in dir, a directory on bpffs (mounted if it is not).
func OpenPinned(dir string) (Targets, error) {
	if err := maps.EnsureBPFFS(dir); err != nil {
		return Targets{}, err
	}
	m, err := maps.Open(dir)
	if err != nil {
		return Targets{}, err
	}
	return Targets{IPCache: mapsync.IPCacheMap(m.IPCache), Endpoints: mapsync.EndpointsMap(m.Endpoints),
		Policies: mapsync.PinnedPolicyMaps{Dir: dir}, Conntrack: m.CT4, ConntrackSize: int(m.CT4.Map().MaxEntries()),
		NAT: func(mt *ctgc.Metrics) []*ctgc.GC {
			ct, rev := m.NodePortCT4Expiry(), m.NodePortRev4Expiry()
			return []*ctgc.GC{
				ctgc.NewExpiring(ct, maps.NodePortCT4MapName, ct.Capacity(), ctgc.Monotonic, mt),
				ctgc.NewExpiring(rev, maps.NodePortRev4MapName, rev.Capacity(), ctgc.Monotonic, mt),
			}
		},
		Close: m.Close}, nil
}

// NewCell is the cell with the maps that open gives (the agent's: the
// pinned maps of datapath/maps; tests may give others): Maps under the
// --enable-bpf-datapath feature, with --bpf-root.
func NewCell(open Opener) hive.Cell {
	return hive.Module("bpf-maps", "Reconciles the ipcache, endpoint and policy tables into BPF maps",
		hive.Feature(bpfconfig.EnableFlag, bpfconfig.EnableDefault, bpfconfig.EnableUsage,
			// --bpf-root.
			hive.Config(bpfconfig.DefaultConfig),
			Maps(open),
		),
	)
}

// Maps is the cell's content without the switch and the config, for
// composing under a feature that already declares --enable-bpf-datapath
// and provides bpfconfig.Config (the loader's).
func Maps(open Opener) hive.Cell {
	return hive.Group(
		// The derived tables: rows written by the deriver here, their
		// status by the reconcilers here.
		hive.ProvidePrivate(mapstate.NewEndpointsTable, mapstate.NewPoliciesTable),
		// Anyone reads them: readiness reads policy-maps' realized
		// revision. Without the BPF datapath they are not in the graph.
		hive.Provide(statedb.RWTable[*mapstate.Endpoint].ToTable, statedb.RWTable[*mapstate.PolicyMap].ToTable),
		// --conntrack-gc-interval.
		hive.Config(ctgc.DefaultConfig),
		// Tables in, maps out; the conntrack GC job; the metrics of both.
		hive.Invoke(func(p params) error { return register(p, open) }),
	)
}

type params struct {
	hive.In
	Config    bpfconfig.Config
	DB        *statedb.DB
	Endpoints statedb.Table[*endpoints.Endpoint]
	Policies  statedb.Table[*policy.EndpointPolicyRow]
	IPCache   ipcache.StatusTable
	LXC       statedb.RWTable[*mapstate.Endpoint]
	PolicyMap statedb.RWTable[*mapstate.PolicyMap]
	CTGC      ctgc.Config
	Lifecycle hive.Lifecycle
	Jobs      hive.Jobs
	Reconcile reconcilejob.Params
	// Registry takes the policy map overflow and conntrack GC metrics
	// (none without the metrics cell).
	Registry prometheus.Registerer `optional:"true"`
}

// lazyTargets forward to the maps once the start hook has opened them:
// the reconcilers are built before the hive starts, the maps open in it.
type lazyTargets struct{ t Targets }

func register(p params, open Opener) error {
	t := mapsync.Tables{DB: p.DB, Endpoints: p.Endpoints, Policies: p.Policies, LXC: p.LXC, PolicyMap: p.PolicyMap}
	d := mapsync.NewDeriver(t)
	lazy := &lazyTargets{}
	ic := mapsync.IPCacheConfig(p.IPCache, lazyMap[netip.Prefix, mapsync.IPCacheValue]{func() mapsync.Map[netip.Prefix, mapsync.IPCacheValue] { return lazy.t.IPCache }})
	ec := mapsync.EndpointsConfig(t, lazyMap[netip.Addr, mapsync.EndpointInfo]{func() mapsync.Map[netip.Addr, mapsync.EndpointInfo] { return lazy.t.Endpoints }})
	ops := mapsync.NewPolicyOps(lazyPolicies{lazy}, p.Endpoints)
	pc := mapsync.PoliciesConfig(t, ops)
	ic.FullInterval, ec.FullInterval, pc.FullInterval = IPCacheFullInterval, FullInterval, FullInterval
	// The maps open in the start hook, before any reconciler runs.
	p.Lifecycle.Append(hive.Hook{
		OnStart: func(context.Context) error {
			var err error
			if lazy.t, err = open(p.Config.PinDir()); err != nil {
				return fmt.Errorf("open the BPF maps in %s: %w (is bpffs mounted at --bpf-root? or pass --enable-bpf-datapath=false)", p.Config.PinDir(), err)
			}
			return nil
		},
		OnStop: func(context.Context) error {
			if lazy.t.Close != nil {
				return lazy.t.Close()
			}
			return nil
		},
	})
	// Jobs "reconcile-ipcache-map", "reconcile-lxc-map",
	// "reconcile-policy-maps".
	if _, err := reconcilejob.New(p.Reconcile, ic, nil); err != nil {
		return err
	}
	if _, err := reconcilejob.New(p.Reconcile, ec, nil); err != nil {
		return err
	}
	if _, err := reconcilejob.New(p.Reconcile, pc, nil); err != nil {
		return err
	}
	p.Jobs.Add(hive.Service("derive-bpf-map-tables", d.Subscribe, func(ctx context.Context, h hive.Health) { d.Run(ctx, h) }))

	// cellium_policy_map_overflow_endpoints; the conntrack GC's metrics.
	var ctMetrics *ctgc.Metrics
	if p.Registry != nil {
		if err := p.Registry.Register(mapsync.NewPolicyCollector(ops)); err != nil {
			return fmt.Errorf("register policy map metrics: %w", err)
		}
		var err error
		if ctMetrics, err = ctgc.NewMetrics(p.Registry); err != nil {
			return err
		}
	}
	// Job "conntrack-gc": the maps evict nothing, expired entries must
	// go (cellium_ct4, then the NodePort NAT maps).
	p.Jobs.Add(hive.Timer("conntrack-gc", func(ctx context.Context) error {
		var gcs []*ctgc.GC
		if lazy.t.Conntrack != nil {
			gcs = append(gcs, ctgc.New(lazy.t.Conntrack, maps.CT4MapName, lazy.t.ConntrackSize, ctgc.Monotonic, ctMetrics))
		}
		if lazy.t.NAT != nil {
			gcs = append(gcs, lazy.t.NAT(ctMetrics)...)
		}
		var errs []error
		for _, g := range gcs {
			if _, err := g.Run(ctx); err != nil {
				errs = append(errs, err)
			}
		}
		if err := errors.Join(errs...); err != nil {
			return fmt.Errorf("conntrack garbage collection: %w", err)
		}
		return nil
	}, p.CTGC.EffectiveInterval()))
	return nil
}

type lazyMap[K, V comparable] struct {
	get func() mapsync.Map[K, V]
}

func (l lazyMap[K, V]) Update(keys []K, vals []V) error { return l.get().Update(keys, vals) }
func (l lazyMap[K, V]) Delete(keys []K) error           { return l.get().Delete(keys) }
func (l lazyMap[K, V]) Dump() (map[K]V, error)          { return l.get().Dump() }

type lazyPolicies struct{ l *lazyTargets }

func (l lazyPolicies) Open(id uint16) (mapsync.PolicyMap, error) { return l.l.t.Policies.Open(id) }
func (l lazyPolicies) Remove(id uint16) error                    { return l.l.t.Policies.Remove(id) }
func (l lazyPolicies) List() ([]uint16, error)                   { return l.l.t.Policies.List() }
