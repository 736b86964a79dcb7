// Package nodesgc is the operator's garbage collector of node keys in the
// etcd kvstore (Cilium's kvstore-nodes-gc, --synchronize-k8s-nodes).
//
// Each agent writes its node's key, cilium/state/nodes/v1/<cluster>/<node>,
// with its session lease. When a node leaves the cluster the key would
// stay until that lease expires (--kvstore-lease-ttl, 15 minutes by
// default), and the other nodes would keep the node and its routes
// meanwhile. While this replica leads, the collector watches the node keys
// of its own cluster (--cluster-name) and deletes a key once
//
//   - the operator's CiliumNodes and pods tables hold a complete first list,
//   - there is no CiliumNode of that name,
//   - no agent pod (--cilium-pod-labels) runs on that node (it would write
//     the key again), and
//   - its CiliumNode was seen and deleted, or else the key was written at
//     least a grace period (a minute) ago, so that a new node's CiliumNode
//     has time to appear.
//
// A key is checked a grace period after it is (re)written or first seen,
// and at once when its CiliumNode is deleted. While an agent pod
// still runs on the node the check is retried with a backoff (1 s doubling
// to 2 minutes). The deletion is a transaction that fails if the key was
// rewritten meanwhile. Keys of other clusters, and keys whose value is not
// the node named by the key (garbage), are left alone. The node's ipcache
// keys (cilium/state/ip/v1/default/) are not touched, as in Cilium: they go
// with the agent's lease.
//
// Documentation/operations/kvstore.md describes it for users.
package nodesgc
