package hive

import "go.uber.org/fx"

// In marks a parameter struct whose fields are injected one by one; name
// it after its constructor (NewFoo takes FooParams).
type In = fx.In

// Out marks a result struct whose fields are provided one by one, e.g.
// into value groups with `group:"name"`.
type Out = fx.Out

// Shutdowner lets a cell ask the hive to stop (for example after losing
// leadership).
type Shutdowner = fx.Shutdowner

// ExitCode is the option of Shutdowner.Shutdown that sets the exit code.
var ExitCode = fx.ExitCode
