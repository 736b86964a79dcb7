// Package statedir provides the agent's state directory (--state-dir),
// where cells persist what must survive an agent restart: endpoints, IP
// allocations. Each cell uses a sub-directory of its own.
package statedir

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/spf13/pflag"

	"github.com/cellium/cellium/cells/hive"
)

// Default is the default state directory.
const Default = "/var/run/cellium/state"

// Config is the state directory's configuration.
type Config struct {
	// StateDir is the directory.
	StateDir string
}

// Flags registers --state-dir.
func (def Config) Flags(fs *pflag.FlagSet) {
	fs.String("state-dir", def.StateDir, "Directory where the agent keeps state that survives restarts (endpoints, IP allocations)")
}

// Validate requires an absolute path.
func (c Config) Validate() error {
	if !filepath.IsAbs(c.StateDir) {
		return fmt.Errorf("invalid --state-dir=%q: must be an absolute path", c.StateDir)
	}
	return nil
}

// Dir is the state directory.
type Dir string

// Sub returns the path of a cell's sub-directory, creating it (0750).
func (d Dir) Sub(name string) (string, error) {
	p := filepath.Join(string(d), name)
	if err := os.MkdirAll(p, 0o750); err != nil {
		return "", fmt.Errorf("create state directory %s: %w", p, err)
	}
	return p, nil
}

// Cell provides Dir from --state-dir, locked for the agent's lifetime.
var Cell = hive.Module("state-dir", "Agent state directory",
	hive.Config(Config{StateDir: Default}),
	// The directory value others build their paths from; its start hook
	// locks the directory, and runs before the hooks of every cell that
	// uses Dir, since those are registered after Dir is built.
	hive.Provide(newDir),
)

func newDir(c Config, lc hive.Lifecycle) Dir {
	l := NewLock(c.StateDir)
	lc.Append(hive.Hook{
		Name:    "state-dir-lock",
		OnStart: func(context.Context) error { return l.Acquire() },
		OnStop:  func(context.Context) error { return l.Release() },
	})
	return Dir(c.StateDir)
}
