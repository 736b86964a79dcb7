package devnode

import (
	"context"
	"errors"
	"iter"

	"github.com/cilium/statedb"

	"github.com/cellium/cellium/datapath/healthep"
	"github.com/cellium/cellium/datapath/link"
	"github.com/cellium/cellium/datapath/routing"
	"github.com/cellium/cellium/statedb/routes"
)

// RemoveAgentHostNetwork removes what an agent with host routing
// (--enable-endpoint-routes, the health endpoint, masquerading) leaves in
// this machine's network namespace once it is stopped: cilium_host and
// cilium_net, every route it owns (its protocol), its nftables table and
// the health endpoint (the cilium-health namespace under /var/run/netns
// and the lxc_health veth). Missing ones are no error. The forwarding
// sysctls are the caller's to restore (it knows their values from before).
// Only one agent with host routing may run on the machine: this removes
// that agent's state whoever started it.
func RemoveAgentHostNetwork(ctx context.Context) error {
	none := iter.Seq2[*routes.Device, statedb.Revision](func(func(*routes.Device, statedb.Revision) bool) {})
	noRoutes := iter.Seq2[*routes.Route, statedb.Revision](func(func(*routes.Route, statedb.Revision) bool) {})
	names := healthep.Names{}.WithDefaults()
	return errors.Join(
		healthep.Remove(ctx, link.Host{}, names.NetnsPath(), names.HostIfName),
		routing.DeviceOps{}.Prune(ctx, nil, none),
		routing.RemoveNFTable(routing.Netns{}),
		routing.RouteOps{}.Prune(ctx, nil, noRoutes))
}
