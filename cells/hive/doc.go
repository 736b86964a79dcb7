// Package hive is cellium's cell framework: a thin layer over go.uber.org/fx
// that gives every subsystem the same shape.
//
// A cell is a Module with an id and a one-line title that provides
// constructors, invokes functions, declares a Config struct whose fields
// become command-line flags, and runs background jobs through a Lifecycle.
// Every module gets its own scoped *slog.Logger, Lifecycle, Health and Jobs.
// A Feature wraps cells that exist only when a boolean flag is on: when it is
// off they are absent from the graph, not idle.
//
// fx does the dependency injection; this package adds flags, per-hook
// timeouts and durations, jobs, health, and introspection (the `hive` and
// `hive dot-graph` commands).
package hive
