// Package socklb composes the agent's socket load balancer (like Cilium's
// --bpf-lb-sock): the lb-frontends and lb-backends tables (statedb/lb),
// the deriver that fills them from Services and EndpointSlices and their
// reconcilers into cellium_lb4_services and cellium_lb4_backends
// (datapath/lbsync), and the cgroup programs of bpf/sock.c attached to the
// cgroup v2 root with links pinned in <bpf-root>/cellium/socklb
// (datapath/socklb). It belongs under the BPF datapath's feature
// (daemon/bpfdatapath), whose bpfconfig.Config it reads.
package socklb

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/cilium/statedb"
	"github.com/spf13/pflag"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/cells/hive/reconcilejob"
	"github.com/cellium/cellium/cells/k8s"
	"github.com/cellium/cellium/datapath/bpfconfig"
	"github.com/cellium/cellium/datapath/hostportcheck"
	"github.com/cellium/cellium/datapath/hostsockets"
	"github.com/cellium/cellium/datapath/lbsync"
	"github.com/cellium/cellium/datapath/maglev"
	"github.com/cellium/cellium/datapath/maps"
	"github.com/cellium/cellium/datapath/socklb"
	"github.com/cellium/cellium/statedb/lb"
	"github.com/cellium/cellium/statedb/nodes"
)

// FullInterval is how often the services and backends maps are checked
// against their tables again and pruned.
const FullInterval = 30 * time.Second

// LinkSubdir is the directory under the agent's pin directory
// (<bpf-root>/cellium) holding the programs' pinned cgroup links.
const LinkSubdir = "socklb"

// Config is the socket load balancer's configuration.
type Config struct {
	// EnableSocketLB translates ClusterIPs at connect/sendmsg.
	EnableSocketLB bool `flag:"bpf-lb-sock"`
	// CgroupRoot is where the cgroup v2 hierarchy is (mounted if not).
	CgroupRoot string `flag:"cgroup-root"`
	// KubeProxyReplacement is "true" or "false" (Cilium's values): true
	// derives every Service type's frontends (NodePort, LoadBalancer,
	// externalIPs, traffic policies), see
	// Documentation/operations/kube-proxy-replacement.md.
	KubeProxyReplacement string `flag:"kube-proxy-replacement"`
	// EnableHostPort serves the hostPorts of this node's pods in eBPF
	// (on with kube-proxy replacement, as in Cilium).
	EnableHostPort bool `flag:"enable-host-port"`
	// EnableSVCSourceRangeCheck enforces loadBalancerSourceRanges on
	// LoadBalancer frontends in eBPF, with kube-proxy replacement.
	EnableSVCSourceRangeCheck bool `flag:"enable-svc-source-range-check"`
	// LBSourceRangeAllTypes applies them to the Service's NodePort
	// frontends as well.
	LBSourceRangeAllTypes bool `flag:"bpf-lb-source-range-all-types"`
	// K8sServiceProxyName is the service.kubernetes.io/service-proxy-name
	// of the Services this agent serves; empty: those without the label.
	K8sServiceProxyName string `flag:"k8s-service-proxy-name"`
	// LBMapMax is the capacity of the service, backend and affinity maps
	// (Cilium's --bpf-lb-map-max).
	LBMapMax int `flag:"bpf-lb-map-max"`
}

// DefaultConfig is on, with cgroup2 at /run/cellium/cgroupv2 (Cilium's
// place, /run/cilium/cgroupv2, with cellium's name), without kube-proxy
// replacement (Cilium's default).
var DefaultConfig = Config{EnableSocketLB: true, CgroupRoot: "/run/cellium/cgroupv2", KubeProxyReplacement: "false",
	EnableSVCSourceRangeCheck: true, LBMapMax: maps.DefaultLBMapMax}

// KPR reports whether --kube-proxy-replacement is "true".
func (c Config) KPR() bool { return c.KubeProxyReplacement == "true" }

// HostPort reports whether hostPorts are served: --enable-host-port, or
// kube-proxy replacement (Cilium turns it on with it).
func (c Config) HostPort() bool { return c.EnableHostPort || c.KPR() }

// Flags registers --bpf-lb-sock and --cgroup-root.
func (def Config) Flags(fs *pflag.FlagSet) {
	fs.Bool("bpf-lb-sock", def.EnableSocketLB,
		"Translate Service ClusterIPs to backends at the socket (cgroup connect4/sendmsg4/recvmsg4/getpeername4 programs, and connect6/recvmsg6/getpeername6 for IPv4-mapped addresses of dual-stack sockets), so that pod egress policy sees the real destination, and drop a pod's packets to a ClusterIP that escaped them (drop reason 174, e.g. raw sockets); false detaches the programs and lifts that guard")
	fs.String("cgroup-root", def.CgroupRoot,
		"Path to the cgroup v2 root the socket load balancer attaches to (cgroup2 is mounted there if it is not one)")
	fs.Bool("enable-host-port", def.EnableHostPort,
		"Serve the hostPorts of this node's pods in eBPF (on the node's addresses, or the hostIP; and 127.0.0.1 in the host namespace); from outside the node only with --kube-proxy-replacement=true (the uplink program), which implies it: with both, the portmap CNI chaining is not needed")
	fs.Bool("enable-svc-source-range-check", def.EnableSVCSourceRangeCheck,
		"Enable the check of a LoadBalancer Service's loadBalancerSourceRanges in eBPF (with --kube-proxy-replacement=true): clients from outside the node not in them are dropped (drop reason 177); clients inside the cluster are not restricted")
	fs.String("k8s-service-proxy-name", def.K8sServiceProxyName,
		"Value of the service.kubernetes.io/service-proxy-name label of the Services cellium serves (empty: every Service without that label); Services labelled service.kubernetes.io/headless are never served")
	fs.Bool("bpf-lb-source-range-all-types", def.LBSourceRangeAllTypes,
		"Propagate loadBalancerSourceRanges to the NodePort frontends of the LoadBalancer Service as well")
	fs.Int("bpf-lb-map-max", def.LBMapMax,
		"Capacity of the load balancer's BPF maps: cellium_lb4_services (one entry per frontend scope plus one per backend of each), cellium_lb4_backends (distinct backend addresses) and the affinity maps; a change replaces those maps at the agent's start (the Services are written again)")
	fs.String("kube-proxy-replacement", def.KubeProxyReplacement,
		"Replace kube-proxy: \"true\" serves every Service type and the pods' hostPorts in eBPF (NodePort on the node's addresses and its loopback, LoadBalancer ingress IPs, externalIPs, externalTrafficPolicy and internalTrafficPolicy Local, terminating endpoints), \"false\" only ClusterIPs at the socket (kube-proxy does the rest)")
}

// Validate implements hive.Validator.
func (c Config) Validate() error {
	switch c.KubeProxyReplacement {
	case "true":
		if !c.EnableSocketLB {
			return fmt.Errorf("--kube-proxy-replacement=true needs the socket load balancer: drop --bpf-lb-sock=false")
		}
	case "false":
		if c.EnableHostPort && !c.EnableSocketLB {
			return fmt.Errorf("--enable-host-port needs the socket load balancer: drop --bpf-lb-sock=false")
		}
	default:
		return fmt.Errorf("--kube-proxy-replacement=%q: want \"true\" or \"false\"", c.KubeProxyReplacement)
	}
	if c.LBMapMax < 1 || c.LBMapMax > maps.MaxLBMapMax {
		return fmt.Errorf("--bpf-lb-map-max=%d: want 1 to %d", c.LBMapMax, maps.MaxLBMapMax)
	}
	if c.EnableSocketLB && !filepath.IsAbs(c.CgroupRoot) {
		return fmt.Errorf("--cgroup-root %q is not an absolute path", c.CgroupRoot)
	}
	return nil
}

// Cell is the socket load balancer, under --enable-bpf-datapath: the
// pinned maps of datapath/maps and the programs of datapath/socklb.
var Cell = NewCell(OpenPinned)

// Targets are the maps the reconcilers write.
type Targets struct {
	Services      lbsync.ServicesMap
	Backends      lbsync.BackendsMap
	AffinityMatch lbsync.AffinityMatchMap
	// SourceRange is cellium_lb4_source_range; nil leaves
	// loadBalancerSourceRanges unenforced.
	SourceRange lbsync.SourceRangeMap
	// Maglev holds the frontends' Maglev tables (with
	// --kube-proxy-replacement=true; nil: none are written).
	Maglev lbsync.MaglevMap
	// HostSockets lists the host's listening sockets, which the
	// NodePorts and hostPorts are checked against (lb-service-states,
	// reason HostPortInUse); nil: not checked.
	HostSockets hostportcheck.Lister
	// Close releases the maps (they and the programs stay); may be nil.
	Close func() error
}

// Opener opens the maps and attaches the programs that read them. It runs
// in the hive's start, only with --bpf-lb-sock.
type Opener func(c Config, bpf bpfconfig.Config) (Targets, error)

// OpenPinned opens (creating and pinning when missing) the socket LB maps
// in the agent's pin directory and attaches the cgroup programs to
// --cgroup-root, mounting bpffs and cgroup2 where they are missing.
func OpenPinned(c Config, bpf bpfconfig.Config) (Targets, error) {
	t, err := openPinned(c, bpf)
	if err != nil || !c.HostPort() {
		return t, err
	}
	// NodePorts and hostPorts are served: the host's sockets on their
	// ports are reported. The check is no reason not to start: a lister
	// that cannot open says so in its module's health.
	l, err := hostsockets.Open("")
	if err != nil {
		t.HostSockets = failedLister{err}
		return t, nil
	}
	t.HostSockets = l
	closeMaps := t.Close
	t.Close = func() error {
		l.Close()
		return closeMaps()
	}
	return t, nil
}

// failedLister is the host socket lister that could not be opened.
type failedLister struct{ err error }

func (f failedLister) Listening() ([]hostsockets.Socket, error) { return nil, f.err }
func (failedLister) Processes([]uint32) map[uint32]hostsockets.Process {
	return nil
}

func openPinned(c Config, bpf bpfconfig.Config) (Targets, error) {
	pinDir := bpf.PinDir()
	// bpffs at --bpf-root (not at the pin directory: a mount there
	// would hide under the loader's mount of the root).
	if err := maps.EnsureBPFFS(bpf.BPFRoot); err != nil {
		return Targets{}, err
	}
	if err := os.MkdirAll(pinDir, 0o700); err != nil {
		return Targets{}, fmt.Errorf("create %s: %w", pinDir, err)
	}
	if _, err := socklb.EnsureCgroup2(c.CgroupRoot); err != nil {
		return Targets{}, fmt.Errorf("%w (pass --cgroup-root=<a cgroup2 mount>, or --bpf-lb-sock=false)", err)
	}
	m, err := maps.OpenLBWith(pinDir, maps.LBOptions{MapMax: c.LBMapMax})
	if err != nil {
		return Targets{}, fmt.Errorf("open the socket LB maps in %s: %w", pinDir, err)
	}
	// The agent runs in the node's host namespace: its loopback reaches
	// NodePorts. Without the cookie (a kernel before 5.14), the initial
	// namespace's is the programs' default.
	cookie, _ := socklb.NetnsCookie()
	if err := socklb.AttachWith(m, c.CgroupRoot, filepath.Join(pinDir, LinkSubdir), socklb.Options{HostNetnsCookie: cookie}); err != nil {
		_ = m.Close()
		return Targets{}, fmt.Errorf("attach the socket LB programs to %s: %w (or pass --bpf-lb-sock=false)", c.CgroupRoot, err)
	}
	t := Targets{Services: lbsync.PinnedServices{M: m.Services}, Backends: lbsync.PinnedBackends{M: m.Backends},
		AffinityMatch: lbsync.PinnedAffinityMatch{M: m.AffinityMatch}, SourceRange: lbsync.PinnedSourceRange{M: m.SourceRange},
		Close: m.Close}
	if !c.KPR() {
		// Without the uplink program no table is read: an earlier run's go.
		if err := maps.UnpinMaglev(pinDir); err != nil {
			_ = m.Close()
			return Targets{}, err
		}
		return t, nil
	}
	mg, err := maps.OpenMaglev(pinDir, c.LBMapMax)
	if err != nil {
		_ = m.Close()
		return Targets{}, err
	}
	t.Maglev = mg
	t.Close = func() error { return errors.Join(m.Close(), mg.Close()) }
	return t, nil
}

// NewCell is the socket load balancer writing the maps open gives (the
// agent's: OpenPinned; the control-plane script tests give in-memory
// maps).
func NewCell(open Opener) hive.Cell {
	return hive.Module("socket-lb", "Socket load balancer: Service ClusterIPs translated at connect and sendmsg",
		// --bpf-lb-sock, --cgroup-root.
		hive.Config(DefaultConfig),
		// --bpf-lb-algorithm, --bpf-lb-maglev-table-size,
		// --bpf-lb-maglev-hash-seed: the frontends' Maglev tables here, the
		// uplink program's constants in the loader.
		hive.Config(maglev.DefaultConfig),
		// The derived tables: rows written by the deriver here, statuses by
		// the reconcilers here.
		hive.ProvidePrivate(lb.NewFrontendsTable, lb.NewBackendsTable, lb.NewServiceStatesTable),
		// Anyone reads them (cellium statedb lb-frontends); the Services
		// refused or degraded (lb-service-states) are reported as Events
		// by cells/lbevents.
		hive.Provide(statedb.RWTable[*lb.Frontend].ToTable, statedb.RWTable[*lb.Backend].ToTable,
			statedb.RWTable[*lb.ServiceState].ToTable),
		// Whether the frontends are translated: the ipcache cell marks their
		// addresses only then, so the datapath drops untranslated packets to
		// them (174 "Is a ClusterIP").
		hive.Provide(func(c Config) lb.SocketLB { return lb.SocketLB{Enabled: c.EnableSocketLB} }),
		// Whether every Service type is served (--kube-proxy-replacement):
		// the programs on the node's uplinks attach only then.
		hive.Provide(func(c Config) lb.KubeProxyReplacement { return lb.KubeProxyReplacement{Enabled: c.KPR()} }),
		// Services in, maps and cgroup programs out; or, when off, the
		// programs detached.
		hive.Invoke(func(p params) error { return register(p, open) }),
	)
}

type params struct {
	hive.In
	Config    Config
	Maglev    maglev.Config
	BPF       bpfconfig.Config
	DB        *statedb.DB
	Services  statedb.Table[*corev1.Service]
	Slices    statedb.Table[*discoveryv1.EndpointSlice]
	Frontends statedb.RWTable[*lb.Frontend]
	Backends  statedb.RWTable[*lb.Backend]
	States    statedb.RWTable[*lb.ServiceState]
	// NodeName and LocalNode give the node's addresses and name, for
	// NodePorts and traffic policy Local; needed with
	// --kube-proxy-replacement=true only.
	NodeName  k8s.NodeName                    `optional:"true"`
	LocalNode statedb.Table[*nodes.LocalNode] `optional:"true"`
	// Pods are this node's pods, for their hostPorts (--enable-host-port).
	Pods      statedb.Table[*corev1.Pod] `optional:"true"`
	Lifecycle hive.Lifecycle
	Jobs      hive.Jobs
	Reconcile reconcilejob.Params
	Log       *slog.Logger
}

func register(p params, open Opener) error {
	pinDir := p.BPF.PinDir()
	linkDir := filepath.Join(pinDir, LinkSubdir)
	if !p.Config.EnableSocketLB {
		// Off: whatever an earlier run attached goes.
		p.Lifecycle.Append(hive.Hook{OnStart: func(context.Context) error {
			if err := errors.Join(socklb.Detach(linkDir), maps.UnpinLB(pinDir)); err != nil {
				return fmt.Errorf("detach the socket load balancer (--bpf-lb-sock=false): %w", err)
			}
			return nil
		}})
		return nil
	}
	t := lbsync.Tables{DB: p.DB, Services: p.Services, Slices: p.Slices, Frontends: p.Frontends, Backends: p.Backends,
		MaxBackendID: uint32(p.Config.LBMapMax - 1), MaxServiceEntries: p.Config.LBMapMax, States: p.States,
		ServiceProxyName: p.Config.K8sServiceProxyName}
	if p.Config.KPR() || p.Config.HostPort() {
		if p.NodeName == "" || p.LocalNode == nil {
			return fmt.Errorf("--kube-proxy-replacement=true or --enable-host-port: the agent has no node name or local-node table (NodePorts and hostPorts need the node's addresses)")
		}
		t.KubeProxyReplacement, t.NodeName, t.LocalNode = p.Config.KPR(), string(p.NodeName), p.LocalNode
		t.SourceRangeCheck, t.SourceRangeAllTypes = p.Config.EnableSVCSourceRangeCheck, p.Config.LBSourceRangeAllTypes
	}
	if p.Config.HostPort() {
		if p.Pods == nil {
			return fmt.Errorf("--enable-host-port: the agent has no pods table")
		}
		t.Pods = p.Pods
	}
	var m Targets
	services := lazyServices{func() lbsync.ServicesMap { return m.Services }}
	backends := lazyBackends{func() lbsync.BackendsMap { return m.Backends }}
	match := lazyMatch{func() lbsync.AffinityMatchMap { return m.AffinityMatch }}
	d := lbsync.NewDeriver(t, func() (map[lb.L4Addr]uint32, error) { return lbsync.RestoreIDs(backends) })
	// The maps open and the programs attach in the start hook, before
	// any reconciler runs.
	p.Lifecycle.Append(hive.Hook{
		OnStart: func(context.Context) error {
			var err error
			m, err = open(p.Config, p.BPF)
			return err
		},
		OnStop: func(context.Context) error {
			// The links stay pinned: translation goes on while the agent
			// restarts.
			if m.Close != nil {
				return m.Close()
			}
			return nil
		},
	})
	var opts []lbsync.FrontendOption
	if p.Config.KPR() {
		// Random: no table, and those of an earlier run go.
		mg := lbsync.Maglev{Map: lazyMaglev{func() lbsync.MaglevMap { return m.Maglev }}}
		if p.Maglev.Maglev() {
			mg.TableSize, mg.Seed = p.Maglev.TableSize, p.Maglev.Seed()
		}
		opts = append(opts, lbsync.WithMaglev(mg))
	}
	ranges := lazyRanges{func() lbsync.SourceRangeMap { return m.SourceRange }}
	fc := lbsync.FrontendsConfigWithRanges(t, services, match, ranges, opts...)
	bc := lbsync.BackendsConfig(t, backends)
	fc.FullInterval, bc.FullInterval = FullInterval, FullInterval
	// Jobs "reconcile-lb4-services-map", "reconcile-lb4-backends-map".
	if _, err := reconcilejob.New(p.Reconcile, bc, nil); err != nil {
		return err
	}
	if _, err := reconcilejob.New(p.Reconcile, fc, nil); err != nil {
		return err
	}
	p.Jobs.Add(hive.Service("derive-lb-tables", d.Subscribe, func(ctx context.Context, h hive.Health) { d.Run(ctx, h) }))
	if p.Config.HostPort() {
		// NodePorts and hostPorts a host socket listens on: Degraded rows
		// (HostPortInUse) beside the deriver's.
		chk := hostportcheck.New(hostportcheck.Config{DB: p.DB, Frontends: p.Frontends, States: p.States,
			Lister: func() hostportcheck.Lister { return m.HostSockets }, Log: p.Log})
		p.Jobs.Add(hive.Service("check-host-port-sockets", nil, func(ctx context.Context, h hive.Health) { chk.Run(ctx, h) }))
	}
	return nil
}

// lazyServices, lazyBackends and lazyMatch forward to the maps once the
// start hook has opened them.
type lazyServices struct{ get func() lbsync.ServicesMap }

func (l lazyServices) Update(k []maps.ServiceSlot, v []maps.ServiceValue) error {
	return l.get().Update(k, v)
}
func (l lazyServices) Delete(k []maps.ServiceSlot) error { return l.get().Delete(k) }
func (l lazyServices) Lookup(k maps.ServiceSlot) (maps.ServiceValue, bool, error) {
	return l.get().Lookup(k)
}
func (l lazyServices) Dump() (map[maps.ServiceSlot]maps.ServiceValue, error) { return l.get().Dump() }

// Batches lists the map in batches (the prune's rounds), when it can.
func (l lazyServices) Batches() *maps.Batches[maps.ServiceSlot, maps.ServiceValue] {
	return lbsync.ServiceBatches(l.get())
}

type lazyBackends struct{ get func() lbsync.BackendsMap }

func (l lazyBackends) Update(ids []uint32, a []lb.L4Addr) error { return l.get().Update(ids, a) }
func (l lazyBackends) Delete(ids []uint32) error                { return l.get().Delete(ids) }
func (l lazyBackends) Dump() (map[uint32]lb.L4Addr, error)      { return l.get().Dump() }

// Batches lists the map in batches (the prune's rounds), when it can.
func (l lazyBackends) Batches() *maps.Batches[uint32, lb.L4Addr] {
	return lbsync.BackendBatches(l.get())
}

type lazyMatch struct {
	get func() lbsync.AffinityMatchMap
}

func (l lazyMatch) Update(k []maps.AffinityMatch) error { return l.get().Update(k) }
func (l lazyMatch) Delete(k []maps.AffinityMatch) error { return l.get().Delete(k) }
func (l lazyMatch) Dump() ([]maps.AffinityMatch, error) { return l.get().Dump() }

// Batches lists the map in batches (the prune's rounds), when it can.
func (l lazyMatch) Batches() *maps.Batches[maps.AffinityMatch, struct{}] {
	return lbsync.AffinityMatchBatches(l.get())
}

// lazyRanges forwards to the source range map once the start hook has
// opened it; without one (an opener that gives none) it holds nothing.
type lazyRanges struct{ get func() lbsync.SourceRangeMap }

func (l lazyRanges) Update(k []maps.SourceRange) error {
	if r := l.get(); r != nil {
		return r.Update(k)
	}
	return errNoSourceRangeMap
}

func (l lazyRanges) Delete(k []maps.SourceRange) error {
	if r := l.get(); r != nil {
		return r.Delete(k)
	}
	return nil
}

func (l lazyRanges) Dump() ([]maps.SourceRange, error) {
	if r := l.get(); r != nil {
		return r.Dump()
	}
	return nil, nil
}

// errNoSourceRangeMap: a frontend with source ranges, but the opener gave
// no map to write them to (the flag is then never set either).
var errNoSourceRangeMap = errors.New("no source range map to write loadBalancerSourceRanges to")

// lazyMaglev forwards to the Maglev map once the start hook has opened
// it; an opener without one (the control-plane tests' fakes) keeps no
// tables.
type lazyMaglev struct{ get func() lbsync.MaglevMap }

func (l lazyMaglev) Swap(fe lb.L4Addr, table []uint32) error {
	if m := l.get(); m != nil {
		return m.Swap(fe, table)
	}
	return nil
}

func (l lazyMaglev) Delete(fes []lb.L4Addr) error {
	if m := l.get(); m != nil {
		return m.Delete(fes)
	}
	return nil
}

func (l lazyMaglev) Frontends() ([]lb.L4Addr, error) {
	if m := l.get(); m != nil {
		return m.Frontends()
	}
	return nil, nil
}
