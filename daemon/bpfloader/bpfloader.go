// Package bpfloader composes the agent's eBPF loader cell: the desired
// bpf-programs table (statedb/bpfprog), the deriver that fills it from the
// endpoints table and its reconciler into the kernel (datapath/loader),
// behind --enable-bpf-datapath. Like daemon/hostrouting it is a package of
// its own, composed only by cellium-agent's main, so that what links the
// daemon package does not link the datapath.
package bpfloader

import (
	"context"
	"fmt"
	"net/netip"
	"strconv"
	"time"

	"github.com/cilium/statedb"
	"github.com/spf13/pflag"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/cells/hive/reconcilejob"
	"github.com/cellium/cellium/datapath/bpf"
	"github.com/cellium/cellium/datapath/bpfconfig"
	"github.com/cellium/cellium/datapath/loader"
	"github.com/cellium/cellium/datapath/maps"
	"github.com/cellium/cellium/statedb/bpfprog"
	"github.com/cellium/cellium/statedb/endpoints"
	"github.com/cellium/cellium/statedb/identity"
	"github.com/cellium/cellium/statedb/nodes"
	"github.com/cellium/cellium/statedb/reconciler"
	"github.com/cellium/cellium/statedb/routes"
)

// FullInterval is how often every row is checked against the kernel
// again (a link removed behind the agent's back is attached again) and
// the pins of endpoints that are gone are pruned. A check of an endpoint
// whose links are intact loads nothing.
const FullInterval = 30 * time.Second

// Flag switches the cell on and off.
const Flag = bpfconfig.EnableFlag

// Sources are where the loader gets its programs and shared maps.
type Sources struct {
	// Spec loads the programs' collection.
	Spec loader.SpecLoader
	// OpenMaps returns the shared maps pinned in dir (the agent's bpffs
	// directory); they are opened lazily and closed when the cell stops.
	OpenMaps func(dir string) ClosableMaps
}

// ClosableMaps are loader.Maps the cell closes when it stops.
type ClosableMaps interface {
	loader.Maps
	Close() error
}

// Cell loads the agent's programs (datapath/bpf) with the maps pinned in
// <bpf-root>/cellium (datapath/maps) and attaches them to the endpoints'
// veths in the agent's own network namespace.
var Cell = NewCell(loader.Netns{}, Sources{
	Spec:     loader.LoadSpec,
	OpenMaps: func(dir string) ClosableMaps { return loader.NewPinnedMaps(dir) },
})

// NewCell is the loader cell acting on the veths of network namespace n
// with the programs and maps of src (tests give a namespace they made and
// programs of their own), behind --enable-bpf-datapath with --bpf-root.
// The agent composes [Loader] with the map reconcilers under one switch
// instead (daemon/bpfdatapath).
func NewCell(n loader.Netns, src Sources) hive.Cell {
	return hive.Module("bpf-loader", "Per-endpoint eBPF programs on the pod veths",
		hive.Feature(bpfconfig.EnableFlag, bpfconfig.EnableDefault, bpfconfig.EnableUsage,
			// --bpf-root.
			hive.Config(bpfconfig.DefaultConfig),
			Loader(n, src),
		),
	)
}

// Loader is the loader's content, for a feature that provides
// bpfconfig.Config (--bpf-root): --policy-audit-mode, the bpf-programs
// table and its deriver and reconciler.
func Loader(n loader.Netns, src Sources) hive.Cell {
	return hive.Group(
		// --policy-audit-mode.
		hive.Config(DefaultConfig),
		// The desired table: rows written only by the deriver here,
		// their status only by the reconciler here.
		hive.ProvidePrivate(bpfprog.NewTable),
		// Anyone may read it: the endpoint manager derives readiness
		// and failures from it, the doctor and `cellium statedb`.
		hive.Provide(statedb.RWTable[*bpfprog.Program].ToTable),
		// Endpoints -> bpf-programs -> the kernel.
		hive.Invoke(func(p params) error { return register(p, n, src) }),
	)
}

// Config is the loader cell's own configuration (--bpf-root is
// bpfconfig.Config, shared with the map reconcilers).
type Config struct {
	// PolicyAuditMode loads the programs so that policy verdicts are
	// logged and nothing is dropped by policy (Cilium's flag).
	PolicyAuditMode bool
	// MonitorAggregation is the level of aggregation of trace events
	// (Cilium's --monitor-aggregation): none, lowest, low, medium,
	// maximum (or 0 to 4).
	MonitorAggregation string
	// MonitorAggregationInterval is how long a connection's direction
	// goes untraced at medium and above.
	MonitorAggregationInterval time.Duration
	// MonitorAggregationFlags are the TCP flags whose first appearance
	// in a direction of a connection is traced at medium and above.
	MonitorAggregationFlags []string
}

// DefaultConfig enforces policy and aggregates traces at medium, the
// level Cilium's Helm chart sets (Documentation/operations/monitor.md).
var DefaultConfig = Config{
	MonitorAggregation:         bpf.DefaultAggregation.String(),
	MonitorAggregationInterval: bpf.DefaultReportInterval,
	MonitorAggregationFlags:    []string{"syn", "fin", "rst"},
}

// Flags registers --policy-audit-mode and the monitor aggregation flags.
func (def Config) Flags(fs *pflag.FlagSet) {
	fs.Bool("policy-audit-mode", def.PolicyAuditMode,
		"Log policy verdicts (audit) instead of dropping the packets policy denies")
	fs.String("monitor-aggregation", def.MonitorAggregation,
		"Level of monitor aggregation for traces from the datapath: none, lowest, low, medium, maximum "+
			"(drops and policy verdicts are never aggregated)")
	fs.Duration("monitor-aggregation-interval", def.MonitorAggregationInterval,
		"Monitor report interval when monitor aggregation is medium or higher")
	fs.StringSlice("monitor-aggregation-flags", def.MonitorAggregationFlags,
		"TCP flags that trigger monitor reports when monitor aggregation is medium or higher")
}

// Monitor parses the monitor aggregation flags.
//
// Errors: the flag and value that is not valid, and what is.
func (c Config) Monitor() (bpf.Monitor, error) {
	agg, err := bpf.ParseAggregation(c.MonitorAggregation)
	if err != nil {
		return bpf.Monitor{}, fmt.Errorf("--monitor-aggregation: %w", err)
	}
	if c.MonitorAggregationInterval < time.Second {
		return bpf.Monitor{}, fmt.Errorf("--monitor-aggregation-interval=%s: the datapath counts whole seconds, use 1s or more",
			c.MonitorAggregationInterval)
	}
	flags, err := bpf.ParseReportFlags(c.MonitorAggregationFlags)
	if err != nil {
		return bpf.Monitor{}, err
	}
	return bpf.Monitor{Aggregation: agg, ReportInterval: c.MonitorAggregationInterval, ReportFlags: flags}, nil
}

type params struct {
	hive.In
	Config    Config
	BPF       bpfconfig.Config
	DB        *statedb.DB
	Endpoints statedb.Table[*endpoints.Endpoint]
	Programs  statedb.RWTable[*bpfprog.Program]
	// Devices is the host-routing cell's desired devices (absent when it
	// is off): the tunnel device's row switches the overlay programs.
	Devices statedb.Table[*routes.Device] `optional:"true"`
	// Identities are the cluster's CiliumIdentities (absent without the
	// Kubernetes client), mirrored into cellium_identities: the VNIs the
	// overlay programs accept.
	Identities statedb.Table[*ciliumv2.CiliumIdentity] `optional:"true"`
	// NodePort switches the kube-proxy replacement's uplink program
	// (absent: off). The agent provides it from --kube-proxy-replacement
	// and --devices.
	NodePort *loader.NodePortConfig `optional:"true"`
	// LocalNode gives the node's InternalIP, whose device is an uplink
	// when no default route names one (absent: default routes only).
	LocalNode statedb.Table[*nodes.LocalNode] `optional:"true"`
	Jobs      hive.Jobs
	Reconcile reconcilejob.Params
}

func register(p params, n loader.Netns, src Sources) error {
	layout := loader.Layout{Root: p.BPF.BPFRoot}
	t := loader.Tables{DB: p.DB, Endpoints: p.Endpoints, Programs: p.Programs}
	mon, err := p.Config.Monitor()
	if err != nil {
		return err
	}
	d := loader.NewDeriver(t, p.Config.PolicyAuditMode)
	var maps ClosableMaps
	if src.OpenMaps != nil {
		maps = src.OpenMaps(layout.Dir())
	}
	var npCfg loader.NodePortConfig
	if p.NodePort != nil {
		npCfg = *p.NodePort
	}
	opsCfg := loader.OpsConfig{Layout: layout, Netns: n, Spec: src.Spec, Monitor: mon,
		KubeProxyReplacement: npCfg.KubeProxyReplacement}
	if maps != nil {
		opsCfg.Maps = maps
	}
	cfg := loader.ReconcilerConfig(t, loader.NewOps(opsCfg))
	cfg.FullInterval = FullInterval
	cfg.Metrics = p.Reconcile.Metrics
	r, err := reconciler.New(p.DB, cfg)
	if err != nil {
		return err
	}
	p.Jobs.Add(
		hive.Service("derive-bpf-programs", nil, func(ctx context.Context, h hive.Health) { d.Run(ctx, h) }),
		// Like reconcilejob.Job, and the maps are closed once it stopped
		// (the pins stay: the programs keep running without the agent).
		hive.DescribeJob(hive.Service("reconcile-"+bpfprog.TableName,
			func() error {
				if err := layout.MountBPFFS(); err != nil {
					return err
				}
				return r.Subscribe()
			},
			func(ctx context.Context, h hive.Health) {
				r.Run(ctx, h)
				if maps != nil {
					if err := maps.Close(); err != nil {
						h.Degraded("close maps", err)
					}
				}
			}), r.Describe()),
	)
	np := &loader.NodePort{Layout: layout, Netns: n, LBMapMax: npCfg.LBMapMax, MaglevTableSize: npCfg.MaglevTableSize, MaglevSeed: npCfg.MaglevSeed, LBMode: npCfg.LBMode}
	p.Jobs.Add(hive.Service("attach-nodeport", nil, func(ctx context.Context, h hive.Health) {
		runNodePort(ctx, h, p.DB, p.LocalNode, npCfg, np)
	}))
	if p.Devices != nil {
		o := &loader.Overlay{Layout: layout, Netns: n, Trace: true, Monitor: mon, ViaStack: npCfg.ServicesInStack}
		p.Jobs.Add(hive.Service("attach-overlay", nil, func(ctx context.Context, h hive.Health) {
			runOverlay(ctx, h, p.DB, p.Devices, o)
		}))
		if p.Identities != nil {
			p.Jobs.Add(hive.Service("sync-identities-map", nil, func(ctx context.Context, h hive.Health) {
				runIdentities(ctx, h, p.DB, p.Identities, layout)
			}))
		}
	}
	return nil
}

// runIdentities keeps cellium_identities equal to the numeric identities of
// the CiliumIdentity table (an object's name is its number), rewriting the
// difference on every change of the table and every FullInterval.
func runIdentities(ctx context.Context, h reconciler.Health, db *statedb.DB, ids statedb.Table[*ciliumv2.CiliumIdentity], layout loader.Layout) {
	var m *maps.Maps
	defer func() {
		if m != nil {
			m.Close()
		}
	}()
	for {
		next := time.After(FullInterval)
		txn := db.ReadTxn()
		all, watch := ids.AllWatch(txn)
		want := map[identity.NumericIdentity]bool{}
		for o := range all {
			if n, err := strconv.ParseUint(o.Name, 10, 32); err == nil && n > 0 {
				want[identity.NumericIdentity(n)] = true
			}
		}
		var err error
		if m == nil {
			m, err = maps.Open(layout.Dir())
		}
		if err == nil {
			_, _, err = m.Identities.Sync(want)
		}
		if err != nil {
			h.Degraded("sync cellium_identities", err)
			next = time.After(overlayRetry)
		} else {
			h.OK(fmt.Sprintf("%d identities", len(want)))
		}
		select {
		case <-ctx.Done():
			return
		case <-watch:
		case <-next:
		}
	}
}

// runNodePort keeps cil_from_netdev (bpf/nodeport.c) on the uplink
// devices while the kube-proxy replacement is on: the devices named, or
// detected (default routes, else the device of the node's InternalIP)
// again on every change of the local node and every FullInterval, which
// also re-attaches a link removed behind the agent's back. Off, it removes
// the program once (pins an earlier run left).
func runNodePort(ctx context.Context, h reconciler.Health, db *statedb.DB, local statedb.Table[*nodes.LocalNode],
	cfg loader.NodePortConfig, np *loader.NodePort) {
	if !cfg.KubeProxyReplacement {
		if err := np.Remove(); err != nil {
			h.Degraded("remove the nodeport program", err)
		} else {
			h.OK("kube-proxy replacement off")
		}
		return
	}
	for {
		next := time.After(FullInterval)
		var nodeIP netip.Addr
		var watch <-chan struct{}
		if local != nil {
			txn := db.ReadTxn()
			all, w := local.AllWatch(txn)
			for n := range all {
				nodeIP = n.InternalIP
			}
			watch = w
		}
		devices, err := cfg.Devices, error(nil)
		if len(devices) == 0 {
			devices, err = loader.DetectNodePortDevices(np.Netns, nodeIP)
		}
		switch {
		case err != nil:
		case len(devices) == 0:
			err = fmt.Errorf("no uplink device: no IPv4 default route and no device holds the node's address %v (set --devices)", nodeIP)
		default:
			err = np.Ensure(devices)
		}
		if err != nil {
			h.Degraded("attach the nodeport program", err)
			next = time.After(overlayRetry)
		} else {
			h.OK(fmt.Sprintf("nodeport program on %v", devices))
		}
		select {
		case <-ctx.Done():
			return
		case <-watch:
		case <-next:
		}
	}
}

// overlayRetry is how soon a failed attach of the overlay programs is
// tried again.
const overlayRetry = 5 * time.Second

// runOverlay keeps the overlay programs on the tunnel device while the
// devices table has its row reconciled (routing mode tunnel), and removes
// them once the table, initialized, has none (routing mode native). Every
// FullInterval it checks that the links are still on the device (a device
// re-created behind the agent's back gets them again).
func runOverlay(ctx context.Context, h reconciler.Health, db *statedb.DB, devs statedb.Table[*routes.Device], o *loader.Overlay) {
	for {
		txn := db.ReadTxn()
		d, _, watch, found := devs.GetWatch(txn, routes.DeviceNameIndex.Query(routes.TunnelDevice))
		initialized, initWatch := devs.Initialized(txn)
		next := time.After(FullInterval)
		switch {
		case found && d.Status.Kind == reconciler.StatusDone:
			if err := o.Ensure(d.Name); err != nil {
				h.Degraded("attach the overlay programs to "+d.Name, err)
				next = time.After(overlayRetry)
			} else {
				h.OK("overlay programs on " + d.Name)
			}
		case found:
			h.OK(d.Name + " not reconciled yet")
		case initialized:
			if err := o.Remove(); err != nil {
				h.Degraded("remove the overlay programs", err)
				next = time.After(overlayRetry)
			} else {
				h.OK("no tunnel device")
			}
		default:
			watch = initWatch
		}
		select {
		case <-ctx.Done():
			return
		case <-watch:
		case <-next:
		}
	}
}
