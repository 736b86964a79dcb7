// Package policy is cellium's policy engine: it turns NetworkPolicy,
// CiliumNetworkPolicy and CiliumClusterwideNetworkPolicy objects into
// internal rules (ParseNetworkPolicy, ParseCNP, ParseCCNP), keeps the
// selector cache (which identities each selector selects, updated as
// identities come and go), and computes each endpoint's policy: the exact
// allow and deny entries per direction, keyed like the datapath's policy
// map (package statedb/policy).
//
// The engine is plain Go, usable without fx: NewEngine, then feed it
// policies and identities and ask it for endpoint policies. It keeps no
// global state and starts no goroutines; an Engine is safe for concurrent
// use.
package policy
