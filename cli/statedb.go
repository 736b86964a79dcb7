package cli

import (
	"context"
	"io"
	"net/http"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/cellium/cellium/api/v1/client"
	"github.com/cellium/cellium/api/v1/models"
)

func (a *app) statedbCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "statedb [TABLE]",
		Short: "List the agent's statedb tables, or dump the objects of one (JSON unless -o says otherwise)",
		Example: `  cellium statedb
  cellium statedb endpoints -o yaml
  cellium statedb k8s-pods -o jsonpath='{[*].metadata.name}'`,
		Args: cobra.MaximumNArgs(1),
	}
	out := outputFlag(cmd)
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		o, err := parseOutput(*out)
		if err != nil {
			return err
		}
		return a.call(cmd, func(ctx context.Context, c *client.Client) error {
			if len(args) == 0 {
				var tables []models.TableInfo
				if err := c.Do(ctx, http.MethodGet, "/v1/statedb", nil, &tables); err != nil {
					return explain(err, "list statedb tables", "")
				}
				if !o.human() {
					return o.print(a.opts.Out, tables)
				}
				return writeTables(a.opts.Out, tables)
			}
			objs, err := c.GetStatedbTable(ctx, args[0])
			if err != nil {
				return explain(err, "dump statedb table "+args[0], "")
			}
			if o.human() {
				o.format = formatJSON
			}
			return o.print(a.opts.Out, objs)
		})
	}
	return cmd
}

// writeTables prints the table list: name, object count, whether the
// table is initialized (else who it waits for) and its indexes.
func writeTables(w io.Writer, tables []models.TableInfo) error {
	t := newTable()
	t.row("TABLE", "OBJECTS", "INITIALIZED", "INDEXES")
	for _, ti := range tables {
		init := "yes"
		if !ti.Initialized {
			init = "no"
			if len(ti.Pending) > 0 {
				init += " (waiting for " + strings.Join(ti.Pending, ", ") + ")"
			}
		}
		t.row(ti.Name, strconv.Itoa(ti.Objects), init, strings.Join(ti.Indexes, ", "))
	}
	return t.flush(w)
}
