// Package ipcache is the control-plane cell that derives the ipcache table
// (statedb/ipcache): which security identity each IP prefix has. It reads
// the endpoints, local-node, nodes, CiliumEndpoint, CiliumIdentity,
// kvstore-ipcache and policy CIDR tables and follows their change streams, so that each change
// rewrites only the prefixes it touches.
//
// What claims a prefix, by source (ipcache.Source), highest precedence
// first; when two sources claim one prefix the higher wins, between two
// claims of one source the owner that sorts first, except that
// CiliumEndpoints that disagree about a prefix cancel out (see
// state.cepConflict):
//
//   - host: the local node's addresses (InternalIPs, ExternalIPs, the
//     router IP on cilium_host, from the local-node and nodes tables) ->
//     host (1);
//   - endpoint: each local endpoint's address -> its identity, once it has
//     one;
//   - health: the health endpoint's address (this node's and other
//     nodes') -> health (4);
//   - remote-node: every address of the other nodes -> remote-node (6),
//     host IP the node's InternalIP;
//   - kvstore: with --kvstore=etcd, the ipcache keys of other nodes'
//     endpoints (cilium/state/ip/v1/default/<IP>, the kvstore-ipcache
//     table) -> their identity, host IP the key's HostIP; keys whose
//     HostIP is this node's give nothing;
//   - cilium-endpoint: the addresses of the CiliumEndpoints of other nodes
//     that pass the trust checks (see Refusal: a CiliumIdentity of the
//     CEP's namespace, addresses in the pod CIDRs of the node it names) ->
//     their status.identity.id, host IP the CEP's node IP;
//   - node-cidr: the pod CIDRs of the other nodes -> world (2), host IP
//     the node's InternalIP;
//   - policy-cidr: each prefix of the policy-cidr-identities table -> its
//     local CIDR identity.
//
// World (2) is no row: the datapath's lookup misses.
//
// Documentation/concepts/ipcache-trust.md explains the checks to users.
package ipcache
