// Package kvstoresync is the agent's exchange of nodes and ipcache entries
// through the etcd kvstore (--kvstore=etcd), as Cilium's agents do:
//
//   - it mirrors the other nodes' keys (cilium/state/nodes/v1/<cluster>/<name>)
//     into the kvstore-nodes table, which nodediscovery merges into the
//     nodes table;
//   - it mirrors the ipcache keys (cilium/state/ip/v1/default/<IP>) into
//     the kvstore-ipcache table, which the ipcache cell turns into rows of
//     source "kvstore";
//   - it writes an ipcache key, with the agent's session lease, for each
//     local endpoint that has an identity (the health endpoint excepted),
//     and deletes it when the endpoint goes.
//
// Keys that do not parse (garbage someone else wrote) are skipped with a
// warning and counted (cellium_kvstore_invalid_keys_total); they do not
// disturb the other keys. While etcd is unreachable the tables keep what
// they hold; when it is back the keys are listed again, and after a lost
// lease every own key is written again with the new one.
//
// Without --kvstore the tables stay empty and are initialized at once.
// Documentation/operations/kvstore.md describes it for users.
package kvstoresync
