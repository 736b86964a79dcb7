// Package policy holds the computed form of network policy that the
// control plane hands to the datapath: per-endpoint map entries keyed like
// Cilium's BPF policy map (remote identity, direction, protocol, destination
// port prefix) with an allow or deny verdict, and the endpoint-policy value
// that groups them per direction.
//
// The values are immutable once built (the constructors sort and copy), so
// they can live in statedb tables and be shared between readers. The policy
// cell computes them; the datapath reconciler and the CEP synchronizer read
// them.
package policy
