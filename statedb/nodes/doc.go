// Package nodes defines the node tables of the agent:
//
//   - "nodes": every node of the cluster as its CiliumNode describes it
//     (addresses, pod CIDRs, health IP, boot ID), parsed into netip values.
//     nodediscovery fills it from the k8s CiliumNodes table; the CLI's
//     `node list`, and later the ipcache and routes, read it.
//   - "local-node": one row, what this agent knows and publishes about its
//     own node. nodediscovery writes it, and its reconciler mirrors the row
//     into the node's CiliumNode. The endpoint manager, the CiliumEndpoint
//     synchronizer and the health endpoint read it (the InternalIP is a
//     CiliumEndpoint's status.networking.node).
//
// Rows are immutable: writers insert new values, nobody modifies a row
// (or its slices and maps) after inserting it.
package nodes
