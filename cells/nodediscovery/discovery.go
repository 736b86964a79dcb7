package nodediscovery

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"

	"github.com/cilium/statedb"
	corev1 "k8s.io/api/core/v1"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/cells/k8s"
	ipamtables "github.com/cellium/cellium/statedb/ipam"
	k8stables "github.com/cellium/cellium/statedb/k8s"
	"github.com/cellium/cellium/statedb/nodes"
	"github.com/cellium/cellium/statedb/reconciler"
)

// discovery computes the local-node row from its inputs: the Node object
// (addresses, labels, UID), this node's CiliumNode (pod CIDRs; its health
// IP at start), IPAM (router IP, health IP) and the boot ID.
type discovery struct {
	name        string
	db          *statedb.DB
	k8sNodes    statedb.Table[*corev1.Node]
	ciliumNodes statedb.Table[*ciliumv2.CiliumNode]
	local       statedb.RWTable[*nodes.LocalNode]
	allocs      statedb.Table[*ipamtables.Allocation]
	autoCreate  bool
	log         *slog.Logger

	bootID string // read by the start hook
}

// discoveryParams are registerDiscovery's inputs.
type discoveryParams struct {
	hive.In

	Config      Config
	NodeName    k8s.NodeName
	DB          *statedb.DB
	K8sNodes    statedb.Table[*corev1.Node]
	CiliumNodes statedb.Table[*ciliumv2.CiliumNode]
	LocalNode   statedb.RWTable[*nodes.LocalNode]
	Allocations statedb.Table[*ipamtables.Allocation]
	Lifecycle   hive.Lifecycle
	Jobs        hive.Jobs
	Log         *slog.Logger
}

func registerDiscovery(p discoveryParams) {
	d := &discovery{
		name:        string(p.NodeName),
		db:          p.DB,
		k8sNodes:    p.K8sNodes,
		ciliumNodes: p.CiliumNodes,
		local:       p.LocalNode,
		allocs:      p.Allocations,
		autoCreate:  p.Config.AutoCreateCiliumNodeResource,
		log:         p.Log,
	}
	p.Lifecycle.Append(hive.Hook{
		Name: "read-boot-id",
		OnStart: func(context.Context) error {
			id, err := nodes.ReadBootID(nodes.BootIDPath)
			if err != nil {
				p.Log.Warn("boot ID unknown; the CiliumNode will have no spec.bootid", "error", err)
			}
			d.bootID = id
			return nil
		},
	})
	p.Jobs.Add(
		hive.Service("local-node", nil, d.run),
	)
}

// addrs returns the health endpoint's address and the router IP from
// IPAM's allocations table, and a channel closed when they may have
// changed. Both are invalid until IPAM has settled on exactly one health
// address (it allocates it at start, releasing any second one).
func (d *discovery) addrs(txn statedb.ReadTxn) (health, router netip.Addr, changed <-chan struct{}) {
	rows, watch := d.allocs.ListWatch(txn, ipamtables.OwnerIndex.Query(ipamtables.HealthOwner))
	n := 0
	for row := range rows {
		health = row.IP
		n++
	}
	if n != 1 {
		return netip.Addr{}, netip.Addr{}, watch
	}
	router, _ = ipamtables.RouterIP(txn, d.allocs)
	return health, router, watch
}

func cnQuery(name string) statedb.Query[*ciliumv2.CiliumNode] {
	return k8stables.NameIndex[*ciliumv2.CiliumNode]().Query(name)
}

// errNoInternalIP says what the agent waits for.
var errNoInternalIP = errors.New("no InternalIP")

// run keeps the local-node row up to date until ctx ends.
func (d *discovery) run(ctx context.Context, h hive.Health) {
	nodeQ := k8stables.NameIndex[*corev1.Node]().Query(d.name)
	for {
		txn := d.db.ReadTxn()
		node, _, nodeWatch, nodeFound := d.k8sNodes.GetWatch(txn, nodeQ)
		cn, _, cnWatch, cnFound := d.ciliumNodes.GetWatch(txn, cnQuery(d.name))
		cnInit, cnInitWatch := d.ciliumNodes.Initialized(txn)
		health, router, addrWatch := d.addrs(txn)
		if cnInit {
			cnInitWatch = nil // closed for good: waiting on it would spin
		}
		if !cnFound {
			cn = nil
		}

		var desired *nodes.LocalNode
		if nodeFound {
			desired = buildLocalNode(node, cn, health, router, d.bootID)
		}
		if desired == nil || !desired.InternalIP.IsValid() {
			h.Degraded("waiting for the Node object",
				fmt.Errorf("%w: Node %q is missing or has no InternalIP in status.addresses yet; is the kubelet registered?", errNoInternalIP, d.name))
		} else {
			d.write(desired, cn, cnInit)
			h.OK(fmt.Sprintf("InternalIP %s", desired.InternalIP))
		}
		select {
		case <-ctx.Done():
			return
		case <-nodeWatch:
		case <-cnWatch:
		case <-cnInitWatch:
		case <-addrWatch:
		}
	}
}

// buildLocalNode computes the local-node row; cn may be nil.
func buildLocalNode(node *corev1.Node, cn *ciliumv2.CiliumNode, health, router netip.Addr, bootID string) *nodes.LocalNode {
	n := &nodes.LocalNode{
		Name:        node.Name,
		UID:         string(node.UID),
		Labels:      node.Labels,
		Annotations: node.Annotations,
		RouterIP:    router,
		HealthIPv4:  health,
		BootID:      bootID,
	}
	for _, a := range node.Status.Addresses {
		if a.Type != corev1.NodeInternalIP && a.Type != corev1.NodeExternalIP {
			continue
		}
		ip, err := netip.ParseAddr(a.Address)
		if err != nil {
			continue
		}
		n.NodeAddresses = append(n.NodeAddresses, nodes.Address{Type: string(a.Type), IP: ip})
	}
	// The one InternalIP rule (the first IPv4 InternalIP, else the first
	// InternalIP), shared with readers of the Node object.
	n.InternalIP, _ = netip.ParseAddr(k8stables.NodeInternalIP(node))
	if cn != nil {
		for _, s := range cn.Spec.IPAM.PodCIDRs {
			if p, err := netip.ParsePrefix(s); err == nil {
				n.PodCIDRs = append(n.PodCIDRs, p)
			}
		}
	}
	return n
}

// write stores desired when it differs from the row, and marks the row
// pending again when the CiliumNode in the API no longer carries it
// (someone changed or deleted it).
func (d *discovery) write(desired *nodes.LocalNode, cn *ciliumv2.CiliumNode, cnInit bool) {
	wtxn := d.db.WriteTxn(d.local)
	defer wtxn.Abort()
	cur, _, found := d.local.Get(wtxn, nodes.LocalNodeNameIndex.Query(desired.Name))
	switch {
	case !found || !cur.SameContent(desired):
		desired = desired.WithStatus(reconciler.Pending())
	case d.autoCreate && cnInit && cur.Status.Kind == reconciler.StatusDone && !upToDate(cn, desired):
		d.log.Debug("CiliumNode differs from what the agent publishes; updating it", "node", desired.Name)
		desired = cur.WithStatus(reconciler.Pending())
	default:
		return
	}
	if _, _, err := d.local.Insert(wtxn, desired); err != nil {
		d.log.Error("write the local-node table", "error", err)
		return
	}
	wtxn.Commit()
}
