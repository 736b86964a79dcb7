package controlplane

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cilium/hive/script"
	"github.com/cilium/statedb"
	"k8s.io/apimachinery/pkg/watch"
	k8stesting "k8s.io/client-go/testing"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	"github.com/cellium/cellium/api/v1/client"
	"github.com/cellium/cellium/cells/agentapi"
	"github.com/cellium/cellium/cells/cepsync"
	"github.com/cellium/cellium/cells/endpointmanager"
	"github.com/cellium/cellium/cells/endpointpolicy"
	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/cells/hive/hivetest"
	"github.com/cellium/cellium/cells/identity"
	"github.com/cellium/cellium/cells/ipam"
	"github.com/cellium/cellium/cells/ipcache"
	"github.com/cellium/cellium/cells/k8s"
	"github.com/cellium/cellium/cells/k8s/k8stest"
	"github.com/cellium/cellium/cells/nodediscovery"
	"github.com/cellium/cellium/cells/statedir"
	"github.com/cellium/cellium/daemon/bpfmaps"
	"github.com/cellium/cellium/daemon/hostrouting"
	"github.com/cellium/cellium/daemon/socklb"
	"github.com/cellium/cellium/datapath/bpfconfig"
	"github.com/cellium/cellium/datapath/routing"
	"github.com/cellium/cellium/statedb/endpoints"
	k8stables "github.com/cellium/cellium/statedb/k8s"
	"github.com/cellium/cellium/statedb/nodes"
	"github.com/cellium/cellium/statedb/routes"
)

// NodeName is the name of the node the harness's agent runs on.
const NodeName = "node1"

// Uplink returns the uplink the host-routing deriver is given (nothing is
// detected): eth0, MTU 1500, on 192.168.56.0/24. Nodes with an
// InternalIP there are on the agent's subnet.
func Uplink() routing.Uplink {
	return routing.Uplink{Name: "eth0", MTU: 1500, Subnets: []netip.Prefix{netip.MustParsePrefix("192.168.56.0/24")}}
}

// Harness is one script's agent: its hive (built, started by hive/start),
// the fake clientset it mirrors objects from, its fake maps and a client
// of its API socket.
type Harness struct {
	Hive      *hive.Hive
	DB        *statedb.DB
	Clientset *k8stest.Clientset
	Maps      *Maps
	API       *client.Client

	watches   *watchCounter
	endpoints statedb.Table[*endpoints.Endpoint]
	started   bool
	// ifindex is the next host-side interface index endpoint/add gives.
	ifindex int
}

// ControlPlane are the agent's control-plane cells the harness runs, as
// daemon.ControlPlane composes them, minus what writes files, serves or
// probes the outside world: the CNI config writer, the health prober, the
// doctor, the monitor and Hubble.
var ControlPlane = hive.Group(
	k8s.AgentResourcesCell,
	nodediscovery.Cell,
	ipam.Cell,
	identity.Cell,
	endpointmanager.Cell,
	cepsync.Cell,
	endpointpolicy.Cell,
	ipcache.Cell,
)

// Datapath are the datapath's derivers and reconcilers over the fake maps
// m: the ipcache, lxc and policy maps (daemon/bpfmaps), the socket load
// balancer's maps (daemon/socklb), and the host-routing tables (the
// deriver of daemon/hostrouting with the fixed Uplink; its reconcilers
// into the kernel are left out).
func Datapath(m *Maps) hive.Cell {
	return hive.Module("fake-datapath", "Map reconcilers over in-memory maps",
		hive.Feature(bpfconfig.EnableFlag, bpfconfig.EnableDefault, bpfconfig.EnableUsage,
			hive.Config(bpfconfig.DefaultConfig),
			bpfmaps.Maps(m.OpenBPF),
			socklb.NewCell(m.OpenLB),
		),
		hostRoutingTables,
	)
}

// hostRoutingTables derives the host-routing tables as daemon/hostrouting
// does, from its flags (--routing-mode, --auto-direct-node-routes, ...).
var hostRoutingTables = hive.Module("host-routing", "Desired host routes and devices (tables only)",
	hive.Config(hostrouting.DefaultConfig),
	hive.ProvidePrivate(routes.NewRoutesTable, routes.NewDevicesTable, routes.NewSysctlsTable, routes.NewMasqueradeTable),
	hive.Provide(
		statedb.RWTable[*routes.Route].ToTable,
		statedb.RWTable[*routes.Device].ToTable,
		statedb.RWTable[*routes.Sysctl].ToTable,
		statedb.RWTable[*routes.Masquerade].ToTable,
	),
	hive.Invoke(func(p routingParams) {
		c := p.Config
		remote := c.Remote(routing.Netns{})
		up := Uplink()
		remote.Uplink = &up // nothing detected
		t := routing.Tables{DB: p.DB, Endpoints: p.Endpoints, LocalNode: p.LocalNode, Nodes: p.Nodes,
			Routes: p.Routes, Devices: p.Devices, Sysctls: p.Sysctls, Remote: remote}
		if c.EnableIPv4Masquerade {
			t.Masquerade = p.Masquerade
		}
		d := routing.NewDeriver(t)
		p.Jobs.Add(hive.Service("derive-host-routing", nil, func(ctx context.Context, h hive.Health) { d.Run(ctx, h) }))
	}),
)

type routingParams struct {
	hive.In
	Config     hostrouting.Config
	DB         *statedb.DB
	Endpoints  statedb.Table[*endpoints.Endpoint]
	LocalNode  statedb.Table[*nodes.LocalNode]
	Nodes      statedb.Table[*nodes.Node]
	Routes     statedb.RWTable[*routes.Route]
	Devices    statedb.RWTable[*routes.Device]
	Sysctls    statedb.RWTable[*routes.Sysctl]
	Masquerade statedb.RWTable[*routes.Masquerade]
	Jobs       hive.Jobs
}

// New builds (but does not start) the harness's hive with the command-line
// flags args, a fresh fake clientset, fake maps, a state directory and an
// API socket of its own. The hive stops and everything is removed when tb
// ends.
func New(tb testing.TB, args []string) *Harness {
	tb.Helper()
	// A unix socket path must stay short: not under tb.TempDir().
	dir, err := os.MkdirTemp("", "cellium-cp")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { os.RemoveAll(dir) })
	socket := filepath.Join(dir, "api.sock")

	h := &Harness{Clientset: k8stest.NewClientset(), Maps: NewMaps(), ifindex: 100}
	h.watches = countWatches(h.Clientset)
	all := append([]string{
		"--state-dir=" + filepath.Join(dir, "state"),
		"--socket-path=" + socket,
	}, args...)
	h.Hive = hivetest.New(tb, all,
		hive.Provide(
			func() k8s.Clientset { return h.Clientset },
			func() k8s.NodeName { return NodeName },
		),
		agentapi.Cell,
		statedir.Cell,
		ControlPlane,
		Datapath(h.Maps),
		hivetest.Capture(&h.DB),
		hivetest.Capture(&h.endpoints),
	)
	if err := h.Hive.Populate(); err != nil {
		tb.Fatalf("build the hive: %v", err)
	}
	h.API = client.New(socket)
	tb.Cleanup(func() {
		if h.started {
			if err := h.Hive.Stop(context.Background()); err != nil {
				tb.Errorf("stop hive: %v", err)
			}
		}
		h.API.Close()
	})
	return h
}

// resources are the k8s resource cells' tables (AgentResourcesCell): the
// harness waits until each has its watch.
var resources = []string{"pods", "namespaces", "nodes", "networkpolicies", "ciliumnetworkpolicies",
	"ciliumclusterwidenetworkpolicies", "ciliumendpoints", "ciliumnodes", "ciliumidentities",
	"services", "endpointslices"}

// Start starts the hive and waits until every resource mirror watches
// the fake clientset (an object added before that could be missed: the
// fake's watch does not replay from the list's resourceVersion) and,
// when the node has a pod CIDR, until the node's health endpoint exists
// (so that it takes endpoint ID 1 and the first address after the
// router's before any pod: scripts see the same IDs and addresses on
// every run).
func (h *Harness) Start(ctx context.Context) error {
	if h.started {
		return fmt.Errorf("the hive is already started")
	}
	if err := h.Hive.Start(ctx); err != nil {
		return err
	}
	h.started = true
	if err := h.watches.wait(ctx, resources, 10*time.Second); err != nil {
		return err
	}
	if len(h.localPodCIDRs()) == 0 {
		return nil
	}
	deadline := time.After(10 * time.Second)
	for {
		objs, watch := h.endpoints.AllWatch(h.DB.ReadTxn())
		for ep := range objs {
			if ep.Health {
				return nil
			}
		}
		select {
		case <-watch:
		case <-ctx.Done():
			return ctx.Err()
		case <-deadline:
			return fmt.Errorf("no health endpoint 10s after start, though CiliumNode %s has pod CIDRs", NodeName)
		}
	}
}

// localPodCIDRs are the pod CIDRs of this node's CiliumNode, read from
// the agent's mirror table (once the mirrors watch, it holds what the fake
// API server holds). Not from the fake itself: its tracker hands the
// informers the objects it keeps, which the mirror's store then owns.
func (h *Harness) localPodCIDRs() []string {
	txn := h.DB.ReadTxn()
	meta := h.DB.GetTable(txn, k8stables.CiliumNodesTable)
	if meta == nil {
		return nil
	}
	for obj := range (statedb.AnyTable{Meta: meta}).All(txn) {
		if cn, ok := obj.(*ciliumv2.CiliumNode); ok && cn.Name == NodeName {
			return cn.Spec.IPAM.PodCIDRs
		}
	}
	return nil
}

// watchCounter counts the watches started on the fakes, by resource.
type watchCounter struct {
	mu      sync.Mutex
	n       map[string]int
	changed chan struct{}
}

func countWatches(cs *k8stest.Clientset) *watchCounter {
	w := &watchCounter{n: map[string]int{}, changed: make(chan struct{})}
	react := func(a k8stesting.Action) (bool, watch.Interface, error) {
		w.mu.Lock()
		defer w.mu.Unlock()
		w.n[a.GetResource().Resource]++
		close(w.changed)
		w.changed = make(chan struct{})
		return false, nil, nil // the fake's own reactor watches
	}
	cs.PrependWatchReactor("*", react)
	cs.CiliumFake.PrependWatchReactor("*", react)
	return w
}

func (w *watchCounter) wait(ctx context.Context, names []string, timeout time.Duration) error {
	deadline := time.After(timeout)
	for {
		w.mu.Lock()
		var missing []string
		for _, n := range names {
			if w.n[n] == 0 {
				missing = append(missing, n)
			}
		}
		ch := w.changed
		w.mu.Unlock()
		if len(missing) == 0 {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		case <-deadline:
			return fmt.Errorf("no watch of %v after %v: is the k8s resource cell of each in the hive?", missing, timeout)
		}
	}
}

// Engine returns the script engine of h: the default commands, statedb's
// db/* commands on h's tables, and the harness's hive/*, k8s/*, endpoint/*
// and maps/* commands.
func (h *Harness) Engine() *script.Engine {
	cmds := script.DefaultCmds()
	for name, c := range dbCommands(h.DB) {
		cmds[name] = c
	}
	for name, c := range h.commands() {
		cmds[name] = c
	}
	return &script.Engine{Cmds: cmds, Conds: script.DefaultConds()}
}

// dbCommands are statedb's script commands for db.
func dbCommands(db *statedb.DB) map[string]script.Cmd {
	return map[string]script.Cmd{
		"db":             statedb.DBCmd(db),
		"db/show":        statedb.ShowCmd(db),
		"db/cmp":         tableWritableOnly{db, statedb.CompareCmd(db)},
		"db/empty":       statedb.EmptyCmd(db),
		"db/get":         statedb.GetCmd(db),
		"db/prefix":      statedb.PrefixCmd(db),
		"db/list":        statedb.ListCmd(db),
		"db/initialized": statedb.InitializedCmd(db),
	}
}

// tableWritableOnly is statedb's db/cmp refusing, with what to do
// instead, the tables whose rows are not statedb.TableWritable (the k8s
// mirrors'): statedb's command would panic on their first row.
type tableWritableOnly struct {
	db *statedb.DB
	script.Cmd
}

func (c tableWritableOnly) Run(s *script.State, args ...string) (script.WaitFunc, error) {
	if len(args) > 0 {
		txn := c.db.ReadTxn()
		refuse := strings.HasPrefix(args[0], k8sTablePrefix)
		if meta := c.db.GetTable(txn, args[0]); meta != nil {
			for obj := range (statedb.AnyTable{Meta: meta}).All(txn) {
				_, ok := obj.(statedb.TableWritable)
				refuse = refuse || !ok
				break
			}
		}
		if refuse {
			return nil, fmt.Errorf("db/cmp %s: the rows of %s are not statedb.TableWritable; use db/show --format=json %s and stdout (with '*' to retry)",
				args[0], args[0], args[0])
		}
	}
	return c.Cmd.Run(s, args...)
}

// k8sTablePrefix begins the names of the tables of Kubernetes objects
// (statedb/k8s).
const k8sTablePrefix = "k8s-"
