// Package kvstore is cellium's etcd kvstore mode (--kvstore=etcd): the etcd
// client, configured with Cilium's flags and etcd.config file, and this
// agent's session lease, which every key the agent owns is attached to so
// that a dead agent's keys expire with it. It also holds the key layout
// Cilium uses under cilium/state/ and a ListerWatcher that presents the
// identities stored in etcd as CiliumIdentity objects, so that the same
// statedb table holds them in CRD and kvstore mode.
//
// With --kvstore empty the cell provides a nil *Client and does nothing.
package kvstore
