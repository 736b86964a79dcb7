// Package hostrouting composes the agent's host-routing datapath cell: the
// desired routes, devices and sysctls tables (statedb/routes), the deriver
// that fills them from the endpoints and local-node tables, and their three
// reconcilers into the kernel (datapath/routing), behind
// --enable-endpoint-routes. Like daemon/hostlinks it is a package of its
// own, composed only by cellium-agent's main, so that what links the daemon
// package does not link the datapath.
package hostrouting

import (
	"context"
	"time"

	"github.com/cilium/statedb"
	"github.com/spf13/pflag"

	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/cells/hive/reconcilejob"
	"github.com/cellium/cellium/datapath/routing"
	"github.com/cellium/cellium/statedb/endpoints"
	"github.com/cellium/cellium/statedb/nodes"
	"github.com/cellium/cellium/statedb/routes"
)

// FullInterval is how often the reconcilers check every row against the
// kernel again (repairing a route or address removed behind the agent's
// back) and prune the routes and devices the agent owns but no longer
// wants.
const FullInterval = 30 * time.Second

// Flag switches the cell on and off.
const Flag = "enable-endpoint-routes"

// Cell programs the node's host networking in the agent's own network
// namespace: cilium_host with the router IP, a /32 route per endpoint
// through its veth, IPv4 forwarding.
var Cell = NewCell(routing.Netns{})

// NewCell is Cell acting on the network namespace n (tests give the
// namespace they made to play the node).
func NewCell(n routing.Netns) hive.Cell {
	return hive.Module("host-routing", "Host device, routes to endpoints and forwarding sysctls",
		hive.Feature(Flag, true,
			"Program cilium_host with the router IP, a route to each endpoint through its veth and the forwarding sysctls (pods cannot reach each other without it)",
			// --enable-ipv4-masquerade.
			hive.Config(DefaultConfig),
			// The desired tables: written only by the deriver here, their
			// status only by the reconcilers here.
			hive.ProvidePrivate(routes.NewRoutesTable, routes.NewDevicesTable, routes.NewSysctlsTable,
				routes.NewMasqueradeTable),
			// Anyone may read them (cellium statedb, the doctor, readiness).
			hive.Provide(
				statedb.RWTable[*routes.Route].ToTable,
				statedb.RWTable[*routes.Device].ToTable,
				statedb.RWTable[*routes.Sysctl].ToTable,
				statedb.RWTable[*routes.Masquerade].ToTable,
			),
			// Endpoints + local node -> desired tables -> the kernel.
			hive.Invoke(func(p params) error { return register(p, n) }),
		),
	)
}

// Config is the host-routing cell's configuration.
type Config struct {
	// EnableIPv4Masquerade masquerades traffic from the pod CIDR leaving
	// the node to addresses outside it (Cilium's flag and default).
	EnableIPv4Masquerade bool
}

// DefaultConfig masquerades, as Cilium does.
var DefaultConfig = Config{EnableIPv4Masquerade: true}

// Flags registers --enable-ipv4-masquerade.
func (def Config) Flags(fs *pflag.FlagSet) {
	fs.Bool("enable-ipv4-masquerade", def.EnableIPv4Masquerade,
		"Masquerade IPv4 traffic from the node's pod CIDR to destinations outside it (nftables table ip cellium)")
}

type params struct {
	hive.In
	Config     Config
	Masquerade statedb.RWTable[*routes.Masquerade]
	DB         *statedb.DB
	Endpoints  statedb.Table[*endpoints.Endpoint]
	LocalNode  statedb.Table[*nodes.LocalNode]
	Routes     statedb.RWTable[*routes.Route]
	Devices    statedb.RWTable[*routes.Device]
	Sysctls    statedb.RWTable[*routes.Sysctl]
	Jobs       hive.Jobs
	Reconcile  reconcilejob.Params
}

func register(p params, n routing.Netns) error {
	t := routing.Tables{DB: p.DB, Endpoints: p.Endpoints, LocalNode: p.LocalNode,
		Routes: p.Routes, Devices: p.Devices, Sysctls: p.Sysctls}
	if p.Config.EnableIPv4Masquerade {
		t.Masquerade = p.Masquerade
	}
	d := routing.NewDeriver(t)
	rc, dc, sc := routing.Reconcilers(t, n)
	for _, c := range []*time.Duration{&rc.FullInterval, &dc.FullInterval, &sc.FullInterval} {
		*c = FullInterval
	}
	// Jobs "reconcile-host-routes", "reconcile-host-devices",
	// "reconcile-host-sysctls".
	if _, err := reconcilejob.New(p.Reconcile, rc, nil); err != nil {
		return err
	}
	if _, err := reconcilejob.New(p.Reconcile, dc, nil); err != nil {
		return err
	}
	if _, err := reconcilejob.New(p.Reconcile, sc, nil); err != nil {
		return err
	}
	if t.Masquerade != nil {
		mc := routing.MasqueradeReconciler(t, n)
		mc.FullInterval = FullInterval
		// Job "reconcile-host-masquerade".
		if _, err := reconcilejob.New(p.Reconcile, mc, nil); err != nil {
			return err
		}
	}
	p.Jobs.Add(hive.Service("derive-host-routing", nil, func(ctx context.Context, h hive.Health) { d.Run(ctx, h) }))
	return nil
}
