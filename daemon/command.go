package daemon

import (
	"log/slog"
	"os"

	"github.com/spf13/cobra"

	"github.com/cellium/cellium/cells/hive"
)

// NewCommand builds the cellium-agent command over the given cells.
func NewCommand(cells ...hive.Cell) *cobra.Command {
	return NewDaemonCommand("cellium-agent", "Run the cellium agent: per-node networking and network policy", cells...)
}

// NewDaemonCommand builds a daemon command: it runs the hive; `hive` and
// `hive dot-graph` print it. --debug switches logging to debug level.
func NewDaemonCommand(name, short string, cells ...hive.Cell) *cobra.Command {
	level := new(slog.LevelVar)
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	h := hive.NewWithOptions(hive.Options{Logger: log}, cells...)
	cmd := hive.RootCommand(name, short, h)
	debug := cmd.PersistentFlags().Bool("debug", false, "Enable debug logging")
	cmd.PersistentPreRun = func(*cobra.Command, []string) {
		if *debug {
			level.Set(slog.LevelDebug)
		}
	}
	return cmd
}
