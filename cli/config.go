package cli

import (
	"context"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/cellium/cellium/api/v1/client"
	"github.com/cellium/cellium/api/v1/models"
)

// readOnlyHeading starts `cellium config`'s listing, as in cilium-dbg.
// cellium has no options that can be changed at run time, so there is no
// read-write section.
const readOnlyHeading = "#### Read-only configurations ####"

func (a *app) configCommand() *cobra.Command {
	var all, readOnly bool
	cmd := &cobra.Command{
		Use:   "config",
		Short: "Print the agent's configuration: every flag with its value",
		Long: `Print the agent's configuration: every flag with its current value, the
node name and the pod MTU. cellium's options are all read-only at run time;
-r and -a are accepted for compatibility with cilium-dbg and change nothing.`,
		Args: cobra.NoArgs,
	}
	out := outputFlag(cmd)
	cmd.Flags().BoolVarP(&all, "all", "a", false, "Print every configuration (the same as without it)")
	cmd.Flags().BoolVarP(&readOnly, "read-only", "r", false, "Print the read-only configuration (the same as without it)")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		o, err := parseOutput(*out)
		if err != nil {
			return err
		}
		return a.call(cmd, func(ctx context.Context, c *client.Client) error {
			cfg, err := c.GetConfig(ctx)
			if err != nil {
				return explain(err, "get configuration", "")
			}
			if !o.human() {
				return o.print(a.opts.Out, cfg)
			}
			return writeConfig(a.opts.Out, cfg)
		})
	}
	cmd.AddCommand(a.configGetCommand())
	return cmd
}

func (a *app) configGetCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "get NAME",
		Short: "Print the value of one configuration (case and dashes do not matter: k8s-client-qps, K8sClientQPS)",
		Args:  exactlyOne("configuration name", "cellium config"),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.call(cmd, func(ctx context.Context, c *client.Client) error {
				cfg, err := c.GetConfig(ctx)
				if err != nil {
					return explain(err, "get configuration", "")
				}
				want := normalizeOption(args[0])
				opts := configOptions(cfg)
				for _, name := range slices.Sorted(maps.Keys(opts)) {
					if normalizeOption(name) == want {
						fmt.Fprintln(a.opts.Out, opts[name])
						return nil
					}
				}
				return fmt.Errorf("configuration %q does not exist: 'cellium config' lists them", args[0])
			})
		},
	}
}

// normalizeOption lower-cases a name and drops dashes and underscores, so
// that a flag can be named like its Go field.
func normalizeOption(s string) string {
	return strings.NewReplacer("-", "", "_", "").Replace(strings.ToLower(s))
}

// configOptions returns every configuration by name: the agent's flags
// plus the node name and MTU when no flag has those names.
func configOptions(cfg *models.DaemonConfig) map[string]string {
	opts := maps.Clone(cfg.Options)
	if opts == nil {
		opts = map[string]string{}
	}
	if _, ok := opts["node-name"]; !ok && cfg.NodeName != "" {
		opts["node-name"] = cfg.NodeName
	}
	if _, ok := opts["mtu"]; !ok && cfg.MTU != 0 {
		opts["mtu"] = strconv.Itoa(cfg.MTU)
	}
	return opts
}

// writeConfig prints the heading and one `name : value` line per option,
// sorted, the name padded to 34 columns as cilium-dbg does.
func writeConfig(w io.Writer, cfg *models.DaemonConfig) error {
	opts := configOptions(cfg)
	var b strings.Builder
	b.WriteString(readOnlyHeading + "\n")
	for _, name := range slices.Sorted(maps.Keys(opts)) {
		fmt.Fprintf(&b, "%-34s: %s\n", name, opts[name])
	}
	_, err := io.WriteString(w, b.String())
	return err
}
