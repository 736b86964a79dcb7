// Package nodediscovery publishes this node to the cluster and tracks the
// others. It keeps the local-node table (what the agent knows about its
// own node: InternalIP from the Node object, router IP and health IP from
// IPAM, pod CIDRs from the operator, boot ID), mirrors that row into the
// node's CiliumNode with the generic reconciler, mirrors every CiliumNode
// into the nodes table, and serves GET /v1/node.
package nodediscovery
