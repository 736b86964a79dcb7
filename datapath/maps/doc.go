// Package maps gives typed Go access to cellium's BPF maps (the ABI of
// bpf/include/maps.h): the pinned global maps (ipcache, endpoints,
// conntrack, metrics, events), one policy map per endpoint, and the decoding
// of ring buffer events with drop reasons in Cilium's words.
//
// Keys and values use Go types: net/netip for addresses, statedb/policy.Key
// for policy entries, statedb/identity for identities. Deleting a key that
// is not there is not an error. The package keeps no state of its own and
// starts no goroutines; the loader and the map reconcilers build on it.
//
// Maps live under a bpffs directory (EnsureBPFFS mounts one if needed),
// pinned by name, so a restarted agent finds them again with Open and
// OpenPolicyMap and the datapath keeps enforcing in between.
package maps
