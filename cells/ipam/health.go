package ipam

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"

	"github.com/cilium/statedb"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	"github.com/cellium/cellium/cells/hive"
	k8stables "github.com/cellium/cellium/statedb/k8s"
	"github.com/cellium/cellium/statedb/tables"
)

// allocateHealthIP allocates the health endpoint's address with owner
// HealthOwner, keeping the one this node's CiliumNode already publishes
// (or IPAM restored) so that it stays the same across restarts, and
// releases any second one. Node discovery and the endpoint manager read
// it from the allocations table.
func allocateHealthIP(ctx context.Context, h hive.Health, db *statedb.DB, cns statedb.Table[*ciliumv2.CiliumNode], a *allocator, log *slog.Logger) error {
	// Wait for the first list of CiliumNodes, to see the published one.
	h.OK("waiting for the CiliumNodes table")
	if err := tables.WaitInitialized(ctx, db, cns); err != nil {
		return err
	}
	var candidates []netip.Addr
	if cn, _, found := cns.Get(db.ReadTxn(), k8stables.NameIndex[*ciliumv2.CiliumNode]().Query(a.node)); found {
		if ip, err := netip.ParseAddr(cn.Spec.HealthAddressing.IPv4); err == nil {
			candidates = append(candidates, ip)
		}
	}
	h.OK("waiting for pod CIDRs")
	held, err := a.ownedBy(ctx, HealthOwner)
	if err != nil {
		return fmt.Errorf("health IP: %w", err)
	}
	candidates = append(candidates, held...)

	var ip netip.Addr
	for _, c := range candidates {
		if _, err := a.AllocateIP(ctx, c, Owner{Name: HealthOwner}); err != nil {
			log.Warn("cannot keep the previous health IP", "ip", c, "error", err)
			continue
		}
		ip = c
		break
	}
	if !ip.IsValid() {
		al, err := a.AllocateNext(ctx, Owner{Name: HealthOwner})
		if err != nil {
			return fmt.Errorf("health IP: %w", err)
		}
		ip = al.IP
	}
	for _, other := range held {
		if other != ip {
			if err := a.Release(other); err != nil {
				log.Warn("release a second health IP", "ip", other, "error", err)
			}
		}
	}
	router, _ := a.RouterIP()
	log.Info("health endpoint address", "ip", ip, "routerIP", router)
	h.OK("health IP " + ip.String())
	return nil
}
