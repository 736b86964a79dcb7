package routing

import (
	"context"
	"fmt"
	"net/netip"
	"time"

	"github.com/cilium/statedb"

	"github.com/cellium/cellium/statedb/endpoints"
	"github.com/cellium/cellium/statedb/nodes"
	"github.com/cellium/cellium/statedb/reconciler"
	"github.com/cellium/cellium/statedb/routes"
	"github.com/cellium/cellium/statedb/tables"
)

// Tables are the tables the deriver reads and writes.
type Tables struct {
	DB        *statedb.DB
	Endpoints statedb.Table[*endpoints.Endpoint]
	LocalNode statedb.Table[*nodes.LocalNode]
	Routes    statedb.RWTable[*routes.Route]
	Devices   statedb.RWTable[*routes.Device]
	Sysctls   statedb.RWTable[*routes.Sysctl]
	// Masquerade is nil when masquerading is off.
	Masquerade statedb.RWTable[*routes.Masquerade]
	// Nodes are the cluster's nodes (their pod CIDRs and addresses); nil,
	// or a nil Remote, for a node that routes to no other node.
	Nodes statedb.Table[*nodes.Node]
	// Remote is how the node reaches other nodes' pods.
	Remote *RemoteConfig
}

// RemoteConfig is how the node reaches other nodes' pods.
type RemoteConfig struct {
	// Remote is the routing mode and its settings; TunnelMTU and
	// SameSubnet are filled from the uplink the deriver detects.
	routes.Remote
	// Devices are the uplink devices the user named (--devices); empty:
	// detect (DetectUplink).
	Devices []string
	// Netns is where the uplink is looked for (the node's namespace).
	Netns Netns
	// Uplink, when set, is the uplink, and nothing is detected (the
	// control-plane script tests give a fixed one).
	Uplink *Uplink
}

// DefaultUplinkMTU is the uplink MTU assumed while the uplink cannot be
// found (the deriver reports itself degraded meanwhile).
const DefaultUplinkMTU = 1500

// remote returns the routes, devices and masquerade exceptions for other
// nodes, and the error of the uplink detection (the rest is derived with
// DefaultUplinkMTU then).
func (d *Deriver) remote(rtxn statedb.ReadTxn, local *nodes.LocalNode) (rs []*routes.Route, devs []*routes.Device, masq []*routes.Masquerade, watch <-chan struct{}, err error) {
	if d.t.Remote == nil || d.t.Nodes == nil {
		return nil, nil, nil, nil, nil
	}
	all, watch := d.t.Nodes.AllWatch(rtxn)
	cfg := d.t.Remote.Remote
	var nodeIP netip.Addr
	localName := ""
	if local != nil {
		nodeIP, localName = local.InternalIP, local.Name
	}
	var up Uplink
	if d.t.Remote.Uplink != nil {
		up = *d.t.Remote.Uplink
	} else {
		up, err = DetectUplink(d.t.Remote.Netns, d.t.Remote.Devices, nodeIP)
	}
	mtu := DefaultUplinkMTU
	if err == nil && up.MTU > 0 {
		mtu = up.MTU
	}
	cfg.TunnelMTU = mtu - routes.TunnelOverhead
	cfg.SameSubnet = up.SameSubnet
	seq := func(yield func(*nodes.Node) bool) {
		for n := range all {
			if !yield(n) {
				return
			}
		}
	}
	rs, devs = routes.DeriveRemote(cfg, localName, seq)
	masq = routes.DeriveMasqueradeExceptions(cfg, local, seq)
	return rs, devs, masq, watch, err
}

func (t Tables) written() []statedb.TableMeta {
	out := []statedb.TableMeta{t.Routes, t.Devices, t.Sysctls}
	if t.Masquerade != nil {
		out = append(out, t.Masquerade)
	}
	return out
}

// Deriver keeps the routes, devices and sysctls tables equal to
// routes.Derive of the endpoints and local-node tables. Create it with
// NewDeriver before the hive starts (it registers as the initializer of the
// three tables), then Run it.
type Deriver struct {
	t    Tables
	init tables.InitGate
}

// NewDeriver registers the deriver as the initializer of the desired
// tables: they are initialized (and the reconcilers may prune) only once
// the endpoints table is (the restore is done) and the local node has a
// router IP, so that an agent restart never removes cilium_host or a
// route before it knows what is desired.
func NewDeriver(t Tables) *Deriver {
	wtxn := t.DB.WriteTxn(t.written()...)
	d := &Deriver{t: t, init: tables.NewInitGate(
		t.Routes.RegisterInitializer(wtxn, "host-routing"),
		t.Devices.RegisterInitializer(wtxn, "host-routing"),
		t.Sysctls.RegisterInitializer(wtxn, "host-routing"),
	)}
	if t.Masquerade != nil {
		d.init.Add(t.Masquerade.RegisterInitializer(wtxn, "host-routing"))
	}
	wtxn.Commit()
	return d
}

// localNode returns the local-node table's row (it has one) or nil.
func localNode(txn statedb.ReadTxn, t statedb.Table[*nodes.LocalNode]) (*nodes.LocalNode, <-chan struct{}) {
	iter, watch := t.AllWatch(txn)
	for n := range iter {
		return n, watch
	}
	return nil, watch
}

// Run derives until ctx ends, each time the endpoints or the local node
// change.
func (d *Deriver) Run(ctx context.Context, health reconciler.Health) {
	for {
		rtxn := d.t.DB.ReadTxn()
		eps, epWatch := d.t.Endpoints.AllWatch(rtxn)
		local, nodeWatch := localNode(rtxn, d.t.LocalNode)
		var initWatch <-chan struct{}
		if d.init.Closed() {
			if ok, w := d.t.Endpoints.Initialized(rtxn); !ok {
				initWatch = w // wake up when the restore is done
			}
		}
		want := routes.Derive(local, func(yield func(*endpoints.Endpoint) bool) {
			for ep := range eps {
				if !yield(ep) {
					return
				}
			}
		})
		rs, devs, except, nodesWatch, uplinkErr := d.remote(rtxn, local)
		want.Routes = append(want.Routes, rs...)
		want.Devices = append(want.Devices, devs...)
		var retry <-chan time.Time
		if err := d.write(rtxn, local, want, except); err != nil {
			health.Degraded("write desired host networking", err)
		} else if uplinkErr != nil {
			health.Degraded("detect the uplink (tunnel MTU assumes a 1500 uplink)", uplinkErr)
			retry = time.After(uplinkRetry)
		} else {
			health.OK(fmt.Sprintf("%d routes, %d devices desired", len(want.Routes), len(want.Devices)))
		}
		select {
		case <-ctx.Done():
			return
		case <-epWatch:
		case <-nodeWatch:
		case <-initWatch:
		case <-nodesWatch:
		case <-retry:
		}
	}
}

// uplinkRetry is how soon the deriver looks for the uplink again when it
// found none.
const uplinkRetry = 5 * time.Second

func (d *Deriver) write(rtxn statedb.ReadTxn, local *nodes.LocalNode, want routes.Desired, except []*routes.Masquerade) error {
	tables := d.t.written()
	wtxn := d.t.DB.WriteTxn(tables...)
	defer wtxn.Abort()
	if _, err := routes.Sync(wtxn, d.t.Routes, want.Routes, func(r *routes.Route) reconciler.Status { return r.Status }); err != nil {
		return fmt.Errorf("routes: %w", err)
	}
	if _, err := routes.Sync(wtxn, d.t.Devices, want.Devices, func(r *routes.Device) reconciler.Status { return r.Status }); err != nil {
		return fmt.Errorf("devices: %w", err)
	}
	if _, err := routes.Sync(wtxn, d.t.Sysctls, want.Sysctls, func(r *routes.Sysctl) reconciler.Status { return r.Status }); err != nil {
		return fmt.Errorf("sysctls: %w", err)
	}
	if d.t.Masquerade != nil {
		if _, err := routes.Sync(wtxn, d.t.Masquerade, append(routes.DeriveMasquerade(local), except...), func(m *routes.Masquerade) reconciler.Status { return m.Status }); err != nil {
			return fmt.Errorf("masquerade: %w", err)
		}
	}
	if d.init.Closed() && local != nil && local.RouterIP.IsValid() {
		if ok, _ := d.t.Endpoints.Initialized(rtxn); ok {
			d.init.Open(wtxn)
		}
	}
	wtxn.Commit()
	return nil
}

// Reconcilers returns the configurations of the three reconcilers, for
// statedb/reconciler (or cells/hive/reconcilejob in the agent): names
// "host-routes", "host-devices" and "host-sysctls" (the table names),
// acting on n.
func Reconcilers(t Tables, n Netns) (reconciler.Config[*routes.Route], reconciler.Config[*routes.Device], reconciler.Config[*routes.Sysctl]) {
	return reconciler.Config[*routes.Route]{
			Name: routes.RoutesTableName, Table: t.Routes, Operations: RouteOps{Netns: n},
			GetStatus: func(r *routes.Route) reconciler.Status { return r.Status },
			SetStatus: (*routes.Route).WithStatus,
		}, reconciler.Config[*routes.Device]{
			Name: routes.DevicesTableName, Table: t.Devices, Operations: DeviceOps{Netns: n},
			GetStatus: func(r *routes.Device) reconciler.Status { return r.Status },
			SetStatus: (*routes.Device).WithStatus,
		}, reconciler.Config[*routes.Sysctl]{
			Name: routes.SysctlsTableName, Table: t.Sysctls, Operations: SysctlOps{Netns: n},
			GetStatus: func(r *routes.Sysctl) reconciler.Status { return r.Status },
			SetStatus: (*routes.Sysctl).WithStatus,
		}
}

// MasqueradeReconciler is the configuration of the masquerade table's
// reconciler (name "host-masquerade"), acting on n.
func MasqueradeReconciler(t Tables, n Netns) reconciler.Config[*routes.Masquerade] {
	return reconciler.Config[*routes.Masquerade]{
		Name: routes.MasqueradeTableName, Table: t.Masquerade, Operations: MasqueradeOps{Netns: n},
		GetStatus: func(m *routes.Masquerade) reconciler.Status { return m.Status },
		SetStatus: (*routes.Masquerade).WithStatus,
	}
}
