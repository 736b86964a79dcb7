// Package reconciler turns the desired state in a statedb table into real
// state somewhere else (a BPF map, the kernel, the Kubernetes API).
//
// Writers insert objects with a pending Status. The reconciler follows the
// table's change stream: a pending object is passed to Operations.Update, a
// deleted one to Operations.Delete, and the outcome is written back into the
// object's Status. Failures are retried with exponential backoff. Every
// FullInterval the whole table is reconciled again (Update on every object)
// and Operations.Prune removes what exists but is not desired.
//
// It is the one piece of code that writes to targets; every target
// implements only Operations.
package reconciler
