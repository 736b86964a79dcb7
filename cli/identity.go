package cli

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"slices"
	"strconv"

	"github.com/spf13/cobra"

	"github.com/cellium/cellium/api/v1/client"
	"github.com/cellium/cellium/api/v1/models"
	"github.com/cellium/cellium/statedb/labels"
)

func (a *app) identityCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "identity",
		Aliases: []string{"id"},
		Short:   "Inspect security identities",
	}
	cmd.AddCommand(a.identityListCommand(), a.identityGetCommand())
	return cmd
}

// identityRow is an identity as `identity list --endpoints` prints it.
type identityRow struct {
	models.Identity
	// RefCount is how many of this node's endpoints use the identity.
	RefCount int `json:"refcount"`
}

func (a *app) identityListCommand() *cobra.Command {
	var endpoints bool
	cmd := &cobra.Command{
		Use:     "list [LABELS...]",
		Aliases: []string{"ls"},
		Short:   "List the identities the agent knows, reserved ones included",
		Long: `List the identities the agent knows, reserved ones included. Given labels
([source:]key[=value]; without a source any source matches), list only the
identities that have all of them. --endpoints lists only the identities of
this node's endpoints, with how many endpoints use each.`,
		Example: `  cellium identity list k8s:app=web
  cellium identity list --endpoints`,
	}
	out := outputFlag(cmd)
	cmd.Flags().BoolVar(&endpoints, "endpoints", false, "Only identities used by this node's endpoints, with a REFCOUNT column")
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		o, err := parseOutput(*out)
		if err != nil {
			return err
		}
		var sel []labels.Label
		for _, s := range args {
			sel = append(sel, labels.ParseSelect(s))
		}
		return a.call(cmd, func(ctx context.Context, c *client.Client) error {
			ids, err := c.GetIdentities(ctx)
			if err != nil {
				return explain(err, "list identities", "")
			}
			ids = slices.DeleteFunc(ids, func(id models.Identity) bool { return !hasAll(id.Labels, sel) })
			slices.SortFunc(ids, func(x, y models.Identity) int { return cmp.Compare(x.ID, y.ID) })
			if !endpoints {
				if !o.human() {
					return o.print(a.opts.Out, ids)
				}
				return writeIdentities(a.opts.Out, ids, nil)
			}
			eps, err := c.GetEndpoints(ctx)
			if err != nil {
				return explain(err, "list endpoints", "")
			}
			refs := map[int64]int{}
			for _, ep := range eps {
				if ep.Status.Identity != nil {
					refs[ep.Status.Identity.ID]++
				}
			}
			ids = slices.DeleteFunc(ids, func(id models.Identity) bool { return refs[id.ID] == 0 })
			if !o.human() {
				rows := make([]identityRow, 0, len(ids))
				for _, id := range ids {
					rows = append(rows, identityRow{Identity: id, RefCount: refs[id.ID]})
				}
				return o.print(a.opts.Out, rows)
			}
			return writeIdentities(a.opts.Out, ids, refs)
		})
	}
	return cmd
}

// hasAll reports whether the labels (as the API writes them) include a
// match for every selector.
func hasAll(lbls []string, sel []labels.Label) bool {
	for _, s := range sel {
		if !slices.ContainsFunc(lbls, func(l string) bool { return s.Matches(labels.Parse(l)) }) {
			return false
		}
	}
	return true
}

// writeIdentities prints identities as cilium-dbg does: ID and the sorted
// labels one per line; with refs, a REFCOUNT column on each identity's
// first line.
func writeIdentities(w io.Writer, ids []models.Identity, refs map[int64]int) error {
	t := newTable()
	if refs != nil {
		t.row("ID", "LABELS", "REFCOUNT")
	} else {
		t.row("ID", "LABELS")
	}
	for _, id := range ids {
		lbls := slices.Sorted(slices.Values(id.Labels))
		if len(lbls) == 0 {
			lbls = []string{""}
		}
		for i, l := range lbls {
			first, ref := "", ""
			if i == 0 {
				first, ref = strconv.FormatInt(id.ID, 10), strconv.Itoa(refs[id.ID])
			}
			if refs != nil {
				t.row(first, l, ref)
			} else {
				t.row(first, l)
			}
		}
	}
	return t.flush(w)
}

func (a *app) identityGetCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "get ID",
		Short: "Print one identity, by number or reserved name (host, world, health, ...)",
		Args:  exactlyOne("identity (a number or a reserved name)", "cellium identity list"),
	}
	out := outputFlag(cmd)
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		o, err := parseOutput(*out)
		if err != nil {
			return err
		}
		return a.call(cmd, func(ctx context.Context, c *client.Client) error {
			id, err := c.GetIdentity(ctx, args[0])
			if err != nil {
				return explain(err, "get identity "+args[0],
					fmt.Sprintf("identity %s not found: 'cellium identity list' shows the identities the agent knows", args[0]))
			}
			if !o.human() {
				return o.print(a.opts.Out, id)
			}
			return writeIdentities(a.opts.Out, []models.Identity{*id}, nil)
		})
	}
	return cmd
}
