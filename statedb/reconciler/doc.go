// Package reconciler turns the desired state in a statedb table into real
// state somewhere else (a BPF map, the kernel, the Kubernetes API).
//
// Writers insert objects with a pending Status. The reconciler follows the
// table's change stream: a pending object is passed to Operations.Update, a
// deleted one to Operations.Delete, and the outcome is written back into the
// object's Status. Failures are retried with exponential backoff. Every
// FullInterval the whole table is reconciled again (Update on every object)
// and Operations.Prune removes what exists but is not desired. The full
// pass goes in rounds (RoundLimit objects or 10 ms, whichever comes first)
// with the changes that came meanwhile applied between them, so a change
// never waits for the whole pass of a large table. A target whose prune is
// long (a BPF map of 100,000s of entries) implements RoundPruner: its
// prune then goes in rounds of about 10 ms too, with the changes applied
// between them; such a target lists first and leaves alone what the
// changes between its rounds wrote.
//
// A deletion that fails is not only remembered in memory: the object goes
// back into the table with status PendingDelete and the error, so that
// `cellium statedb` dumps, health and readers see it, until a retry (or a
// prune) deletes it and the reconciler removes the row. Readers of a
// desired-state table skip PendingDelete rows; inserting the key again
// makes the object desired again.
//
// cells/hive/reconcilejob runs a reconciler in a hive with the hive's
// metrics and health.
//
// It is the one piece of code that writes to targets; every target
// implements only Operations.
package reconciler
