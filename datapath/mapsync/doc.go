// Package mapsync reconciles statedb tables into the datapath's BPF maps
// with the generic reconciler (statedb/reconciler):
//
//   - the ipcache table (statedb/ipcache) into cellium_ipcache;
//   - the lxc-map table (statedb/mapstate), derived here from the
//     endpoints table, into cellium_lxc;
//   - the policy-maps table (statedb/mapstate), derived here from the
//     endpoint-policies table, into each endpoint's cellium_policy_<id>.
//
// Every reconciler is incremental (the table's change stream, in batches)
// and periodically reconciles everything again, pruning what is not
// desired. A policy map is updated by difference: changed and new entries
// first, then the entries no longer desired are deleted, so an endpoint's
// map is never empty while its policy changes. When a policy map's row is
// reconciled, the row records the policy revision the map now holds
// (mapstate.PolicyMap.Realized). A policy larger than its map fails
// closed: the map keeps the policy's deny entries alone (FailClosed), the
// endpoint drops all traffic, the row's status is an error wrapping
// ErrPolicyTooLarge, and PolicyCollector counts such endpoints.
//
// The package works on small interfaces (Map, PolicyMaps) so that its
// logic is tested with in-memory maps; Pinned adapts the real pinned maps
// of datapath/maps. It is plain Go; daemon/bpfmaps composes it into the
// agent.
package mapsync
