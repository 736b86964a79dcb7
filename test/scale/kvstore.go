package scale

import (
	"context"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/cellium/cellium/cells/kvstore"
	"github.com/cellium/cellium/statedb/identity"
	"github.com/cellium/cellium/statedb/labels"
)

// kvstoreIdentity writes the i-th identity as the agents' kvstore
// allocator leaves it (Cilium's layout): its master key id/<ID> holding
// the labels key, and a value key value/<labels key>/<node IP> holding
// the ID for each node one of its pods would run on (the pods of
// identity i are spread over the nodes as populate spreads them). The
// value keys have no lease: the simulated nodes' sessions would outlive
// the run.
func (r *runner) kvstoreIdentity(ctx context.Context, i int) error {
	key := labelsKeyOf(i)
	id := identity.NumericIdentity(identityID(i))
	ops := []clientv3.Op{clientv3.OpPut(kvstore.IdentityIDKey(id), key)}
	for _, n := range r.identityNodes(i) {
		ops = append(ops, clientv3.OpPut(kvstore.IdentityValueKey(key, nodeIP(n).String()), id.StringID()))
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
