package cli

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"slices"

	"github.com/spf13/cobra"

	"github.com/cellium/cellium/api/v1/client"
	"github.com/cellium/cellium/statedb/ipcache"
)

func (a *app) ipcacheCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "ipcache",
		Short: "Inspect the agent's ipcache: which security identity each IP prefix has",
	}
	list := &cobra.Command{
		Use:     "list",
		Aliases: []string{"ls"},
		Short:   "List the ipcache's prefixes with their identity, source and reconciliation status (an address in no prefix is world)",
		Example: `  cellium ipcache list
  cellium ipcache list -o json`,
		Args: cobra.NoArgs,
	}
	out := outputFlag(list)
	list.RunE = func(cmd *cobra.Command, _ []string) error {
		o, err := parseOutput(*out)
		if err != nil {
			return err
		}
		return a.call(cmd, func(ctx context.Context, c *client.Client) error {
			raw, err := c.GetStatedbTable(ctx, ipcache.TableName)
			if err != nil {
				return explain(err, "list the ipcache", "")
			}
			var entries []*ipcache.Entry
			if err := json.Unmarshal(raw, &entries); err != nil {
				return fmt.Errorf("list the ipcache: decode the agent's answer: %w", err)
			}
			slices.SortFunc(entries, func(x, y *ipcache.Entry) int {
				return cmp.Or(x.Prefix.Addr().Compare(y.Prefix.Addr()), cmp.Compare(x.Prefix.Bits(), y.Prefix.Bits()))
			})
			if !o.human() {
				return o.print(a.opts.Out, entries)
			}
			return writeIPCache(a.opts.Out, entries)
		})
	}
	cmd.AddCommand(list)
	return cmd
}

// writeIPCache prints one line per prefix.
func writeIPCache(w io.Writer, entries []*ipcache.Entry) error {
	t := newTable()
	t.row("PREFIX", "IDENTITY", "SOURCE", "OWNER", "TUNNEL ENDPOINT", "STATUS")
	for _, e := range entries {
		host := ""
		if e.HostIP.IsValid() {
			host = e.HostIP.String()
		}
		t.row(e.Prefix.String(), e.Identity.String(), string(e.Source), e.Owner, host, e.Status.String())
	}
	return t.flush(w)
}
