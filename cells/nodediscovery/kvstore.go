package nodediscovery

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"time"

	"github.com/cilium/statedb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/cells/identity"
	"github.com/cellium/cellium/cells/k8s"
	"github.com/cellium/cellium/cells/kvstore"
	"github.com/cellium/cellium/statedb/nodes"
)

// kvNode is Cilium's node JSON (kvstore.NodeJSON).
type kvNode = kvstore.NodeJSON

// kvNodeAddress is Cilium's node Address.
type kvNodeAddress = kvstore.NodeAddressJSON

// kvCIDR is Cilium's cidr.CIDR in JSON.
type kvCIDR = kvstore.CIDRJSON

func toKVCIDR(p netip.Prefix) *kvCIDR {
	bits := 32
	if p.Addr().Is6() {
		bits = 128
	}
	return &kvCIDR{IP: net.IP(p.Masked().Addr().AsSlice()), Mask: net.CIDRMask(p.Bits(), bits)}
}

func ipOrNil(a netip.Addr) net.IP {
	if !a.IsValid() {
		return nil
	}
	return net.IP(a.AsSlice())
}

// kvNodeOf converts the local-node row.
func kvNodeOf(n *nodes.LocalNode, cluster string) kvNode {
	out := kvNode{
		Name: n.Name, Cluster: cluster, Source: "local",
		IPv4HealthIP: ipOrNil(n.HealthIPv4), BootID: n.BootID,
		Labels: n.Labels, Annotations: n.Annotations,
	}
	for _, a := range n.Addresses() {
		out.IPAddresses = append(out.IPAddresses, kvNodeAddress{Type: a.Type, IP: ipOrNil(a.IP)})
	}
	for _, p := range n.PodCIDRs {
		switch {
		case p.Addr().Is4() && out.IPv4AllocCIDR == nil:
			out.IPv4AllocCIDR = toKVCIDR(p)
		case p.Addr().Is4():
			out.IPv4SecondaryAllocCIDRs = append(out.IPv4SecondaryAllocCIDRs, toKVCIDR(p))
		case out.IPv6AllocCIDR == nil:
			out.IPv6AllocCIDR = toKVCIDR(p)
		default:
			out.IPv6SecondaryAllocCIDRs = append(out.IPv6SecondaryAllocCIDRs, toKVCIDR(p))
		}
	}
	return out
}

// kvNodeParams are registerKVStoreNode's inputs.
type kvNodeParams struct {
	hive.In

	DB        *statedb.DB
	LocalNode statedb.Table[*nodes.LocalNode]
	Name      k8s.NodeName
	Log       *slog.Logger
	Jobs      hive.Jobs
	KVStore   *kvstore.Client      `optional:"true"`
	Cluster   identity.ClusterName `optional:"true"`
}

// registerKVStoreNode publishes this node in etcd with --kvstore=etcd.
func registerKVStoreNode(p kvNodeParams) {
	if p.KVStore == nil {
		return
	}
	pub := &kvNodePublisher{kv: p.KVStore, db: p.DB, table: p.LocalNode, name: string(p.Name), cluster: string(p.Cluster), log: p.Log}
	p.Jobs.Add(hive.Service("kvstore-node", nil, pub.run))
}

// kvNodePublisher writes the local-node row to
// cilium/state/nodes/v1/<cluster>/<name> with the session lease, again
// whenever the row or the lease changes (after a lease was lost with
// etcd down, the key is written anew).
type kvNodePublisher struct {
	kv      *kvstore.Client
	db      *statedb.DB
	table   statedb.Table[*nodes.LocalNode]
	name    string
	cluster string
	log     *slog.Logger
}

func (p *kvNodePublisher) run(ctx context.Context, h hive.Health) {
	var (
		written   []byte
		writtenOn clientv3.LeaseID
		retry     <-chan time.Time
	)
	key := kvstore.NodeKey(p.cluster, p.name)
	for {
		row, _, rowWatch, found := p.table.GetWatch(p.db.ReadTxn(), nodes.LocalNodeNameIndex.Query(p.name))
		lease, leaseWatch := p.kv.Session()
		if found && lease != 0 && retry == nil {
			val, err := json.Marshal(kvNodeOf(row, p.cluster))
			if err == nil && (lease != writtenOn || !bytes.Equal(val, written)) {
				wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
				_, err = p.kv.Etcd().Put(wctx, key, string(val), clientv3.WithLease(lease))
				cancel()
				if err == nil {
					written, writtenOn = val, lease
					h.OK("node key written")
				}
			}
			if err != nil && ctx.Err() == nil {
				h.Degraded("write node key", fmt.Errorf("write %s: %w", key, err))
				retry = time.After(time.Second)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-rowWatch:
		case <-leaseWatch:
		case <-retry:
			retry = nil
		}
	}
}
