package scale

import (
	"context"
	"encoding/json"
	"fmt"
	"net"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/cellium/cellium/cells/kvstore"
	"github.com/cellium/cellium/statedb/identity"
	"github.com/cellium/cellium/statedb/labels"
	"github.com/cellium/cellium/statedb/nodes"
)

// In kvstore mode the simulation does in etcd what the other nodes'
// agents do in Cilium's kvstore mode: each simulated node has a session
// lease (Cilium's --kvstore-lease-ttl default, kept alive for the run),
// and its node key, its identities' value keys and its pods' ipcache
// keys are attached to it. The agent under test runs with cellium's
// default --cluster-name, the cluster of the node keys.
const kvCluster = labels.DefaultClusterName

// kvServiceAccount is the ServiceAccount of every simulated pod (its
// identity's label).
const kvServiceAccount = "default"

// grantLeases grants each simulated node's session lease and keeps them
// alive until ctx ends (or the etcd client closes).
func (r *runner) grantLeases(ctx context.Context) error {
	r.leases = make([]clientv3.LeaseID, r.cfg.Nodes)
	return r.parallel(ctx, r.cfg.Nodes, func(pctx context.Context, n int) error {
		l, err := r.etcd.Grant(pctx, int64(kvstore.DefaultLeaseTTL.Seconds()))
		if err != nil {
			return fmt.Errorf("grant the session lease of %s: %w", nodeName(n), err)
		}
		// ctx, not parallel's pctx: the keep-alive lasts the run.
		ka, err := r.etcd.KeepAlive(ctx, l.ID)
		if err != nil {
			return fmt.Errorf("keep the session lease of %s alive: %w", nodeName(n), err)
		}
		go func() {
			for range ka { // closed when the run ends or the client closes
			}
		}()
		r.leases[n] = l.ID
		return nil
	})
}

// lease is node n's session lease; none (clientv3.NoLease) before
// grantLeases.
func (r *runner) lease(n int) clientv3.LeaseID {
	if n < len(r.leases) {
		return r.leases[n]
	}
	return clientv3.NoLease
}

// kvstoreIdentity writes the i-th identity as the agents' kvstore
// allocator leaves it (Cilium's layout): its master key id/<ID> holding
// the labels key (no lease), and a value key value/<labels key>/<node IP>
// holding the ID, with the node's session lease, for each node one of
// its pods would run on (the pods of identity i are spread over the
// nodes as populate spreads them).
func (r *runner) kvstoreIdentity(ctx context.Context, i int) error {
	key := labelsKeyOf(i)
	id := identity.NumericIdentity(identityID(i))
	ops := []clientv3.Op{clientv3.OpPut(kvstore.IdentityIDKey(id), key)}
	for _, n := range r.identityNodes(i) {
		ops = append(ops, clientv3.OpPut(kvstore.IdentityValueKey(key, nodeIP(n).String()), id.StringID(), clientv3.WithLease(r.lease(n))))
	}
	if _, err := r.etcd.Txn(ctx).Then(ops...).Commit(); err != nil {
		return fmt.Errorf("write kvstore identity %d: %w", id, err)
	}
	return nil
}

// labelsKeyOf is the i-th identity's labels key: a master key's value.
func labelsKeyOf(i int) string { return labels.FromMap(identityLabels(i), "").SortedList() }

// identityNodes are the nodes the pods of identity i are placed on by
// populate (pod j: node j%nodes, identity j%podIdentities), at most 8;
// none for an identity without pods.
func (r *runner) identityNodes(i int) []int {
	podIdentities := min(r.cfg.Identities, max(1, r.cfg.Pods/podsPerIdentity))
	if i >= podIdentities {
		return nil // no pod: no node uses it (the operator's GC is off)
	}
	var nodes []int
	seen := map[int]bool{}
	for j := i; j < r.cfg.Pods && len(nodes) < 8; j += podIdentities {
		if n := j % r.cfg.Nodes; !seen[n] {
			seen[n] = true
			nodes = append(nodes, n)
		}
	}
	return nodes
}

// kvNode is the n-th remote node's key and value as its agent writes
// them (cells/nodediscovery: Cilium's Node JSON, source local): the same
// address and pod CIDR as its CiliumNode.
func kvNode(n int) (string, []byte, error) {
	cidr := podCIDR(n)
	v, err := json.Marshal(kvstore.NodeJSON{
		Name: nodeName(n), Cluster: kvCluster, Source: nodes.SourceLocal,
		IPAddresses:   []kvstore.NodeAddressJSON{{Type: nodes.AddressInternalIP, IP: net.IP(nodeIP(n).AsSlice())}},
		IPv4AllocCIDR: &kvstore.CIDRJSON{IP: net.IP(cidr.Masked().Addr().AsSlice()), Mask: net.CIDRMask(cidr.Bits(), 32)},
	})
	if err != nil {
		return "", nil, fmt.Errorf("node key of %s: %w", nodeName(n), err)
	}
	return kvstore.NodeKey(kvCluster, nodeName(n)), v, nil
}

// ipcacheKV is the pod's ipcache key and value as its agent writes them
// (cells/kvstoresync: Cilium's IPIdentityPair JSON): its address, its
// node's IP, its identity, its endpoint on its node, its pod.
func (p remotePod) ipcacheKV() (string, []byte, error) {
	v, err := json.Marshal(kvstore.IPIdentityPair{
		IP: net.IP(p.ip.AsSlice()), HostIP: net.IP(nodeIP(p.node).AsSlice()),
		ID:           identity.NumericIdentity(identityID(p.identity)),
		Metadata:     kvstore.EndpointMetadata(nodeName(p.node), p.endpointID()),
		K8sNamespace: p.namespace(), K8sPodName: p.name, K8sServiceAccount: kvServiceAccount,
	})
	if err != nil {
		return "", nil, fmt.Errorf("ipcache key of %s: %w", p.name, err)
	}
	return kvstore.IPKey(p.ip), v, nil
}

// putNodeKey writes node n's key with its session lease.
func (r *runner) putNodeKey(ctx context.Context, n int) error {
	k, v, err := kvNode(n)
	if err != nil {
		return err
	}
	if _, err := r.etcd.Put(ctx, k, string(v), clientv3.WithLease(r.lease(n))); err != nil {
		return fmt.Errorf("write %s: %w", k, err)
	}
	return nil
}

// putIPCacheKey writes the pod's ipcache key with its node's session
// lease.
func (r *runner) putIPCacheKey(ctx context.Context, p remotePod) error {
	k, v, err := p.ipcacheKV()
	if err != nil {
		return err
	}
	if _, err := r.etcd.Put(ctx, k, string(v), clientv3.WithLease(r.lease(p.node))); err != nil {
		return fmt.Errorf("write %s: %w", k, err)
	}
	return nil
}

// deleteIPCacheKey deletes the pod's ipcache key, as its agent does when
// the pod's endpoint goes.
func (r *runner) deleteIPCacheKey(ctx context.Context, p remotePod) error {
	k := kvstore.IPKey(p.ip)
	if _, err := r.etcd.Delete(ctx, k); err != nil {
		return fmt.Errorf("delete %s: %w", k, err)
	}
	return nil
}

// kvstoreSize counts the keys under cilium/ in etcd and their keys' and
// values' bytes.
func (r *runner) kvstoreSize(ctx context.Context) (keys, bytes int64, err error) {
	resp, err := r.etcd.Get(ctx, kvstore.StatePrefix+"/", clientv3.WithPrefix())
	if err != nil {
		return 0, 0, fmt.Errorf("read the kvstore: %w", err)
	}
	for _, kv := range resp.Kvs {
		bytes += int64(len(kv.Key) + len(kv.Value))
	}
	return int64(len(resp.Kvs)), bytes, nil
}
