package nodediscovery

import (
	"context"
	"fmt"
	"net/netip"

	"github.com/cilium/statedb"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/cells/k8s"
	"github.com/cellium/cellium/statedb/nodes"
)

// nodesSyncParams are registerNodesSync's inputs.
type nodesSyncParams struct {
	hive.In

	NodeName    k8s.NodeName
	DB          *statedb.DB
	CiliumNodes statedb.Table[*ciliumv2.CiliumNode]
	Nodes       statedb.RWTable[*nodes.Node]
	Jobs        hive.Jobs
}

// registerNodesSync mirrors every CiliumNode into the nodes table, which
// is marked initialized once the CiliumNodes table is and its content has
// been copied.
func registerNodesSync(p nodesSyncParams) {
	txn := p.DB.WriteTxn(p.Nodes)
	initDone := p.Nodes.RegisterInitializer(txn, "ciliumnodes")
	txn.Commit()

	var changes statedb.ChangeIterator[*ciliumv2.CiliumNode]
	p.Jobs.Add(hive.Service("nodes-table",
		func() error {
			wtxn := p.DB.WriteTxn(p.CiliumNodes)
			var err error
			changes, err = p.CiliumNodes.Changes(wtxn)
			wtxn.Commit()
			if err != nil {
				return fmt.Errorf("subscribe to %s: %w", p.CiliumNodes.Name(), err)
			}
			return nil
		},
		func(ctx context.Context, h hive.Health) {
			defer changes.Close()
			h.OK("mirroring CiliumNodes")
			local := string(p.NodeName)
			for {
				wtxn := p.DB.WriteTxn(p.Nodes)
				seq, watch := changes.Next(wtxn)
				for change := range seq {
					var err error
					if change.Deleted {
						_, _, err = p.Nodes.Delete(wtxn, &nodes.Node{Name: change.Object.Name})
					} else {
						_, _, err = p.Nodes.Insert(wtxn, nodeFromCiliumNode(change.Object, local))
					}
					if err != nil {
						h.Degraded("write the nodes table", err)
					}
				}
				init, initWatch := p.CiliumNodes.Initialized(wtxn)
				if init && initDone != nil {
					initDone(wtxn)
					initDone = nil
				}
				wtxn.Commit()
				if init {
					initWatch = nil
				}
				select {
				case <-ctx.Done():
					return
				case <-watch:
				case <-initWatch:
				}
			}
		}))
}

// nodeFromCiliumNode parses a CiliumNode into a nodes row; what does not
// parse is left out.
func nodeFromCiliumNode(cn *ciliumv2.CiliumNode, local string) *nodes.Node {
	n := &nodes.Node{Name: cn.Name, BootID: cn.Spec.BootID, Source: nodes.SourceCustomResource}
	if cn.Name == local {
		n.Local, n.Source = true, nodes.SourceLocal
	}
	for _, a := range cn.Spec.Addresses {
		if ip, err := netip.ParseAddr(a.IP); err == nil {
			n.Addresses = append(n.Addresses, nodes.Address{Type: string(a.Type), IP: ip})
		}
	}
	for _, s := range cn.Spec.IPAM.PodCIDRs {
		if p, err := netip.ParsePrefix(s); err == nil {
			n.PodCIDRs = append(n.PodCIDRs, p)
		}
	}
	if ip, err := netip.ParseAddr(cn.Spec.HealthAddressing.IPv4); err == nil {
		n.HealthIPv4 = ip
	}
	return n
}
