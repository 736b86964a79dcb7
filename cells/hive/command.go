package hive

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"

	"github.com/spf13/cobra"
)

// NewDaemonCommand builds a daemon binary's command over cells: it runs the
// hive, logging text to stderr; `hive` and `hive dot-graph` print it.
// --debug switches logging to debug level. Both cellium-agent and
// cellium-operator are built with it, so neither imports the other.
func NewDaemonCommand(name, short string, cells ...Cell) *cobra.Command {
	level := new(slog.LevelVar)
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	h := NewWithOptions(Options{Logger: log}, cells...)
	cmd := RootCommand(name, short, h)
	debug := cmd.PersistentFlags().Bool("debug", false, "Enable debug logging")
	cmd.PersistentPreRun = func(*cobra.Command, []string) {
		if *debug {
			level.Set(slog.LevelDebug)
		}
	}
	return cmd
}

// RootCommand builds a daemon's command: running it runs the hive until
// SIGINT/SIGTERM; `hive` and `hive dot-graph` print the graph. Every cell's
// flags are accepted by all three, and --help lists them grouped by module.
func RootCommand(use, short string, h *Hive) *cobra.Command {
	cmd := &cobra.Command{
		Use:           use,
		Short:         short,
		SilenceUsage:  true,
		SilenceErrors: true,
		Args:          cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return h.Run(cmd.Context())
		},
	}
	cmd.PersistentFlags().AddFlagSet(h.Flags())
	cmd.SetUsageFunc(func(c *cobra.Command) error { return writeUsage(c.OutOrStderr(), c, h) })
	cmd.AddCommand(InfoCommand(h))
	return cmd
}

// InfoCommand is the `hive` command: it prints the cell tree; its
// `dot-graph` subcommand prints the dependency graph in DOT.
func InfoCommand(h *Hive) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "hive",
		Short: "Print the cells, their flags and hooks",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return h.PrintInfo(cmd.OutOrStdout())
		},
	}
	cmd.AddCommand(&cobra.Command{
		Use:   "dot-graph",
		Short: "Print the dependency graph in Graphviz DOT",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			dot, err := h.DotGraph()
			if err != nil {
				return err
			}
			_, err = io.WriteString(cmd.OutOrStdout(), dot)
			return err
		},
	})
	return cmd
}

func writeUsage(w io.Writer, c *cobra.Command, h *Hive) error {
	var b strings.Builder
	fmt.Fprintf(&b, "Usage:\n  %s\n", c.UseLine())
	if c.HasAvailableSubCommands() {
		b.WriteString("\nCommands:\n")
		for _, sub := range c.Commands() {
			if sub.IsAvailableCommand() {
				fmt.Fprintf(&b, "  %-12s %s\n", sub.Name(), sub.Short)
			}
		}
	}
	for _, g := range h.FlagGroups() {
		title := g.Title
		if g.ModuleID == "" {
			title = "hive"
		}
		fmt.Fprintf(&b, "\nFlags of %s (%s):\n%s", moduleOrRoot(g.ModuleID), title, g.Flags.FlagUsages())
	}
	if local := c.LocalNonPersistentFlags(); local.HasFlags() {
		fmt.Fprintf(&b, "\nOther flags:\n%s", local.FlagUsages())
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// Execute runs a daemon's root command with ctx and returns its error; main
// prints it and exits non-zero.
func Execute(ctx context.Context, cmd *cobra.Command, args []string) error {
	cmd.SetArgs(args)
	return cmd.ExecuteContext(ctx)
}
