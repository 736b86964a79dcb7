package nodediscovery

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"sync"
	"time"

	"github.com/cilium/statedb"
	corev1 "k8s.io/api/core/v1"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/cells/ipam"
	"github.com/cellium/cellium/cells/k8s"
	ipamtables "github.com/cellium/cellium/statedb/ipam"
	k8stables "github.com/cellium/cellium/statedb/k8s"
	"github.com/cellium/cellium/statedb/nodes"
	"github.com/cellium/cellium/statedb/reconciler"
	"github.com/cellium/cellium/statedb/tables"
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
	allocator   ipam.Allocator
	allocs      statedb.Table[*ipamtables.Allocation]
	autoCreate  bool
	log         *slog.Logger

	bootID string // read by the start hook

	mu      sync.Mutex
	health  netip.Addr
	router  netip.Addr
	changed chan struct{} // closed and replaced when health or router change
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
	Allocator   ipam.Allocator
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
		allocator:   p.Allocator,
		allocs:      p.Allocations,
		autoCreate:  p.Config.AutoCreateCiliumNodeResource,
		log:         p.Log,
		changed:     make(chan struct{}),
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
		hive.OneShot("health-ip", d.allocateHealthIP, hive.WithRetry(-1, time.Second, 30*time.Second)),
	)
}

// addrs returns the IPAM-derived addresses and a channel closed when they
// change.
func (d *discovery) addrs() (health, router netip.Addr, changed <-chan struct{}) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.health, d.router, d.changed
}

func (d *discovery) setAddrs(health, router netip.Addr) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.health, d.router = health, router
	close(d.changed)
	d.changed = make(chan struct{})
}

// allocateHealthIP allocates the health endpoint's address with owner
// ipam.HealthOwner, keeping the one the CiliumNode already publishes (or
// IPAM restored) so that it stays the same across restarts.
func (d *discovery) allocateHealthIP(ctx context.Context, h hive.Health) error {
	// Wait for the first list of CiliumNodes, to see the published one.
	h.OK("waiting for the CiliumNodes table")
	if err := tables.WaitInitialized(ctx, d.db, d.ciliumNodes); err != nil {
		return err
	}
	var candidates []netip.Addr
	if cn, _, found := d.ciliumNodes.Get(d.db.ReadTxn(), cnQuery(d.name)); found {
		if ip, err := netip.ParseAddr(cn.Spec.HealthAddressing.IPv4); err == nil {
			candidates = append(candidates, ip)
		}
	}
	h.OK("waiting for pod CIDRs")
	if err := tables.WaitInitialized(ctx, d.db, d.allocs); err != nil {
		return fmt.Errorf("health IP: %w", err)
	}
	held := ipamtables.OwnedBy(d.db.ReadTxn(), d.allocs, ipamtables.HealthOwner)
	candidates = append(candidates, held...)

	var ip netip.Addr
	for _, c := range candidates {
		if _, err := d.allocator.AllocateIP(ctx, c, ipam.Owner{Name: ipam.HealthOwner}); err != nil {
			d.log.Warn("cannot keep the previous health IP", "ip", c, "error", err)
			continue
		}
		ip = c
		break
	}
	if !ip.IsValid() {
		al, err := d.allocator.AllocateNext(ctx, ipam.Owner{Name: ipam.HealthOwner})
		if err != nil {
			return fmt.Errorf("health IP: %w", err)
		}
		ip = al.IP
	}
	for _, other := range held {
		if other != ip {
			if err := d.allocator.Release(other); err != nil {
				d.log.Warn("release a second health IP", "ip", other, "error", err)
			}
		}
	}
	router, _ := ipamtables.RouterIP(d.db.ReadTxn(), d.allocs)
	d.log.Info("health endpoint address", "ip", ip, "routerIP", router)
	d.setAddrs(ip, router)
	h.OK("health IP " + ip.String())
	return nil
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
		health, router, addrWatch := d.addrs()
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
