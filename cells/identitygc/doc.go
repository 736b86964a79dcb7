// Package identitygc is the operator's CiliumIdentity garbage collector
// (CRD identity mode). While this replica leads, every
// --identity-gc-interval it looks for identities no CiliumEndpoint uses
// (status.identity.id). An identity unused for --identity-heartbeat-timeout
// is marked with the io.cilium.heartbeat annotation; if it is still unused
// and unchanged at a later pass, it is deleted with UID and resourceVersion
// preconditions, so an agent that took the identity again in the meantime
// (and removed the mark) wins. An identity found in use again is unmarked.
// Deletions are rate-limited (--identity-gc-rate-limit per
// --identity-gc-rate-interval).
//
// The "last used" heartbeats are kept in memory: a new leader counts every
// identity as used at the time it starts leading, so nothing is deleted
// less than one heartbeat timeout after a leader change. Any change to a
// CiliumIdentity by someone else also counts as use. Reserved identities
// (below 256) and node-local ones are never CiliumIdentity objects; objects
// with such names are left alone.
package identitygc
