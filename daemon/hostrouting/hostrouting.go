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
	"fmt"
	"net/netip"
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
	// RoutingMode is how pods reach other nodes' pods: "tunnel" (VXLAN,
	// the default) or "native".
	RoutingMode string
	// TunnelProtocol is the encapsulation of tunnel mode: "vxlan" only.
	TunnelProtocol string
	// TunnelPort is the VXLAN UDP port (Cilium's default 8472).
	TunnelPort int
	// AutoDirectNodeRoutes routes remote pod CIDRs via their nodes'
	// InternalIPs in native mode (nodes on the same L2 subnet).
	AutoDirectNodeRoutes bool
	// IPv4NativeRoutingCIDR is the range routed natively, never
	// masqueraded; required in native mode with masquerading.
	IPv4NativeRoutingCIDR string `flag:"ipv4-native-routing-cidr"`
	// Devices name the uplink; empty: the device holding the node's
	// InternalIP, else the default route's.
	Devices []string
}

// DefaultConfig masquerades and tunnels over VXLAN on port 8472, as
// Cilium does.
var DefaultConfig = Config{
	EnableIPv4Masquerade: true,
	RoutingMode:          routes.RoutingModeTunnel,
	TunnelProtocol:       "vxlan",
	TunnelPort:           8472,
}

// Flags registers --enable-ipv4-masquerade, --routing-mode,
// --tunnel-protocol, --tunnel-port, --auto-direct-node-routes,
// --ipv4-native-routing-cidr and --devices.
func (def Config) Flags(fs *pflag.FlagSet) {
	fs.Bool("enable-ipv4-masquerade", def.EnableIPv4Masquerade,
		"Masquerade IPv4 traffic from the node's pod CIDR to destinations outside it (nftables table ip cellium)")
	fs.String("routing-mode", def.RoutingMode,
		`How pods reach pods of other nodes: "tunnel" (encapsulated in VXLAN between node IPs, the source identity in the VNI) or "native" (routed by the network, or by --auto-direct-node-routes)`)
	fs.String("tunnel-protocol", def.TunnelProtocol, `Encapsulation of --routing-mode=tunnel: "vxlan"`)
	fs.Int("tunnel-port", def.TunnelPort, "UDP port of the tunnel (VXLAN) between nodes")
	fs.Bool("auto-direct-node-routes", def.AutoDirectNodeRoutes,
		"In native routing mode, route each other node's pod CIDR via its InternalIP when that node is on the uplink's subnet")
	fs.String("ipv4-native-routing-cidr", def.IPv4NativeRoutingCIDR,
		"The IPv4 range the network routes natively between nodes (never masqueraded); required with --routing-mode=native and --enable-ipv4-masquerade")
	fs.StringSlice("devices", def.Devices,
		"The node's uplink device (the first one named); empty: the device holding the node's InternalIP, else the default route's")
}

// Validate checks the routing mode and its settings.
func (c Config) Validate() error {
	switch c.RoutingMode {
	case routes.RoutingModeTunnel:
		switch c.TunnelProtocol {
		case "vxlan":
		case "geneve":
			return fmt.Errorf("invalid --tunnel-protocol=geneve: cellium supports vxlan only (set --tunnel-protocol=vxlan, or --routing-mode=native)")
		default:
			return fmt.Errorf("invalid --tunnel-protocol=%q: supported is vxlan", c.TunnelProtocol)
		}
		if c.TunnelPort < 1 || c.TunnelPort > 65535 {
			return fmt.Errorf("invalid --tunnel-port=%d: must be a UDP port between 1 and 65535", c.TunnelPort)
		}
	case routes.RoutingModeNative:
	default:
		return fmt.Errorf("invalid --routing-mode=%q: supported modes are tunnel and native", c.RoutingMode)
	}
	if c.IPv4NativeRoutingCIDR != "" {
		p, err := netip.ParsePrefix(c.IPv4NativeRoutingCIDR)
		if err != nil || !p.Addr().Is4() {
			return fmt.Errorf("invalid --ipv4-native-routing-cidr=%q: must be an IPv4 CIDR such as 10.0.0.0/8", c.IPv4NativeRoutingCIDR)
		}
	}
	if c.RoutingMode == routes.RoutingModeNative && c.EnableIPv4Masquerade && c.IPv4NativeRoutingCIDR == "" {
		return fmt.Errorf("--routing-mode=native with --enable-ipv4-masquerade needs --ipv4-native-routing-cidr: the range the network routes without masquerading (usually the cluster's pod CIDR), or turn masquerading off")
	}
	return nil
}

// Remote is the routing package's configuration for the flags, acting on
// n (the uplink detected there).
func (c Config) Remote(n routing.Netns) *routing.RemoteConfig {
	r := &routing.RemoteConfig{
		Remote:  routes.Remote{Mode: c.RoutingMode, TunnelPort: c.TunnelPort, AutoDirectNodeRoutes: c.AutoDirectNodeRoutes},
		Devices: c.Devices, Netns: n,
	}
	if c.IPv4NativeRoutingCIDR != "" {
		r.NativeRoutingCIDR = netip.MustParsePrefix(c.IPv4NativeRoutingCIDR).Masked()
	}
	return r
}

type params struct {
	hive.In
	Config     Config
	Masquerade statedb.RWTable[*routes.Masquerade]
	DB         *statedb.DB
	Endpoints  statedb.Table[*endpoints.Endpoint]
	LocalNode  statedb.Table[*nodes.LocalNode]
	Nodes      statedb.Table[*nodes.Node] `optional:"true"`
	Routes     statedb.RWTable[*routes.Route]
	Devices    statedb.RWTable[*routes.Device]
	Sysctls    statedb.RWTable[*routes.Sysctl]
	Jobs       hive.Jobs
	Reconcile  reconcilejob.Params
}

func register(p params, n routing.Netns) error {
	t := routing.Tables{DB: p.DB, Endpoints: p.Endpoints, LocalNode: p.LocalNode,
		Routes: p.Routes, Devices: p.Devices, Sysctls: p.Sysctls,
		Nodes: p.Nodes, Remote: p.Config.Remote(n)}
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
