package cli

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/cellium/cellium/api/v1/client"
	"github.com/cellium/cellium/api/v1/models"
)

func (a *app) endpointCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "endpoint",
		Aliases: []string{"ep"},
		Short:   "Inspect and manage this node's endpoints (one per pod)",
	}
	cmd.AddCommand(a.endpointListCommand(), a.endpointGetCommand(),
		a.endpointRegenerateCommand(), a.endpointLabelsCommand())
	return cmd
}

func (a *app) endpointListCommand() *cobra.Command {
	var noHeaders bool
	cmd := &cobra.Command{
		Use:     "list",
		Aliases: []string{"ls"},
		Short:   "List this node's endpoints",
		Args:    cobra.NoArgs,
	}
	out := outputFlag(cmd)
	cmd.Flags().BoolVar(&noHeaders, "no-headers", false, "Do not print the header lines")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		o, err := parseOutput(*out)
		if err != nil {
			return err
		}
		return a.call(cmd, func(ctx context.Context, c *client.Client) error {
			eps, err := c.GetEndpoints(ctx)
			if err != nil {
				return explain(err, "list endpoints", "")
			}
			slices.SortFunc(eps, func(x, y models.Endpoint) int { return cmp.Compare(x.ID, y.ID) })
			if !o.human() {
				return o.print(a.opts.Out, eps)
			}
			return writeEndpointList(a.opts.Out, eps, noHeaders)
		})
	}
	return cmd
}

// writeEndpointList prints endpoints in cilium-dbg's `endpoint list`
// shape: a two-line header, one row per endpoint with its first identity
// label, and one continuation row per further label. POLICY REVISION (the
// revision of the policy the endpoint has realized) is cellium's column.
func writeEndpointList(w io.Writer, eps []models.Endpoint, noHeaders bool) error {
	t := newTable()
	if !noHeaders {
		t.row("ENDPOINT", "POLICY (ingress)", "POLICY (egress)", "POLICY", "IDENTITY", "LABELS (source:key[=value])", "IPv6", "IPv4", "STATUS")
		t.row("", "ENFORCEMENT", "ENFORCEMENT", "REVISION", "", "", "", "", "")
	}
	for _, ep := range eps {
		st := ep.Status
		id := "<no label id>"
		var lbls []string
		if st.Identity != nil {
			id = strconv.FormatInt(st.Identity.ID, 10)
			lbls = slices.Sorted(slices.Values(st.Identity.Labels))
		}
		if len(lbls) == 0 {
			lbls = []string{"no labels"}
		}
		ipv6, ipv4 := "No address", "No address"
		if st.Networking != nil && len(st.Networking.Addressing) > 0 && st.Networking.Addressing[0] != nil {
			ipv6, ipv4 = st.Networking.Addressing[0].IPV6, st.Networking.Addressing[0].IPV4
		}
		var ingress, egress *models.EndpointPolicyDirection
		if st.Policy != nil {
			ingress, egress = st.Policy.Ingress, st.Policy.Egress
		}
		rev := ""
		if ep.Policy != nil {
			rev = strconv.FormatUint(ep.Policy.Realized.PolicyRevision, 10)
		}
		t.row(strconv.FormatInt(ep.ID, 10), enforcement(ingress), enforcement(egress), rev, id, lbls[0], ipv6, ipv4, string(st.State))
		for _, l := range lbls[1:] {
			t.row("", "", "", "", "", l, "", "", "")
		}
	}
	return t.flush(w)
}

// enforcement renders one direction of an endpoint's policy in cilium-dbg's
// words: Enabled, Disabled or Unknown. The agent writes non-enforcing for
// a direction no rule selects the endpoint for (it has no audit mode, so
// cilium-dbg's "Disabled (Audit)" never applies). No policy block means
// nothing is enforced.
func enforcement(d *models.EndpointPolicyDirection) string {
	if d == nil {
		return "Disabled"
	}
	switch d.State {
	case models.EndpointPolicyStateEnforcing:
		return "Enabled"
	case models.EndpointPolicyStateNonEnforcing, models.EndpointPolicyStateDisabled:
		return "Disabled"
	case "":
		if d.Enforcing {
			return "Enabled"
		}
		return "Disabled"
	}
	return "Unknown"
}

func (a *app) endpointGetCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "get ID",
		Aliases: []string{"inspect", "show"},
		Short:   "Print an endpoint (JSON unless -o says otherwise); its .status is the CiliumEndpoint's .status",
		Args:    exactlyOne("endpoint ID", "cellium endpoint list"),
	}
	out := outputFlag(cmd)
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		o, err := parseOutput(*out)
		if err != nil {
			return err
		}
		if o.human() {
			o.format = formatJSON
		}
		return a.call(cmd, func(ctx context.Context, c *client.Client) error {
			ep, err := c.GetEndpoint(ctx, args[0])
			if err != nil {
				return explain(err, "get endpoint "+args[0], endpointNotFound(args[0]))
			}
			return o.print(a.opts.Out, ep)
		})
	}
	return cmd
}

func endpointNotFound(id string) string {
	return fmt.Sprintf("endpoint %s not found on this node: 'cellium endpoint list' shows its endpoints", id)
}

func (a *app) endpointRegenerateCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "regenerate ID",
		Short: "Resolve an endpoint's identity and policy again",
		Args:  exactlyOne("endpoint ID", "cellium endpoint list"),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.call(cmd, func(ctx context.Context, c *client.Client) error {
				if err := c.RegenerateEndpoint(ctx, args[0]); err != nil {
					return explain(err, "regenerate endpoint "+args[0], endpointNotFound(args[0]))
				}
				fmt.Fprintf(a.opts.Out, "Endpoint %s successfully regenerated\n", args[0])
				return nil
			})
		},
	}
}

func (a *app) endpointLabelsCommand() *cobra.Command {
	var add, del []string
	cmd := &cobra.Command{
		Use:   "labels ID",
		Short: "Print an endpoint's identity labels, or add and delete labels (the endpoint moves to the matching identity)",
		Long: `Without flags, print the endpoint's identity labels. --add [source:]key[=value]
adds a label (source "unspec" when none is given); --delete [source:]key
removes the labels with that key. Reserved labels cannot be changed.`,
		Example: `  cellium endpoint labels 1234 --add k8s:team=blue --delete k8s:team-old`,
		Args:    exactlyOne("endpoint ID", "cellium endpoint list"),
	}
	cmd.Flags().StringArrayVar(&add, "add", nil, "Label to add, as [source:]key[=value] (repeatable)")
	cmd.Flags().StringArrayVar(&del, "delete", nil, "Key of labels to delete, as [source:]key (repeatable)")
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		id := args[0]
		patch, err := labelsPatch(add, del)
		if err != nil {
			return err
		}
		return a.call(cmd, func(ctx context.Context, c *client.Client) error {
			if patch != nil {
				if err := c.PatchEndpointLabels(ctx, id, patch); err != nil {
					return explain(err, "change labels of endpoint "+id, endpointNotFound(id))
				}
			}
			ep, err := c.GetEndpoint(ctx, id)
			if err != nil {
				return explain(err, "get endpoint "+id, endpointNotFound(id))
			}
			var lbls []string
			if ep.Status.Identity != nil {
				lbls = slices.Sorted(slices.Values(ep.Status.Identity.Labels))
			}
			t := newTable()
			t.row("LABELS (source:key[=value])")
			for _, l := range lbls {
				t.row(l)
			}
			return t.flush(a.opts.Out)
		})
	}
	return cmd
}

// labelsPatch builds the PATCH body from --add and --delete, or nil when
// both are empty.
func labelsPatch(add, del []string) (*models.LabelsPatch, error) {
	if len(add) == 0 && len(del) == 0 {
		return nil, nil
	}
	p := &models.LabelsPatch{}
	for _, s := range add {
		k, v, _ := strings.Cut(s, "=")
		if k == "" || strings.HasSuffix(k, ":") {
			return nil, fmt.Errorf("invalid --add %q: want [source:]key[=value], e.g. --add k8s:team=blue", s)
		}
		if p.Add == nil {
			p.Add = map[string]string{}
		}
		p.Add[k] = v
	}
	for _, k := range del {
		if k == "" || strings.Contains(k, "=") || strings.HasSuffix(k, ":") {
			return nil, fmt.Errorf("invalid --delete %q: want [source:]key without a value, e.g. --delete k8s:team", k)
		}
		p.Delete = append(p.Delete, k)
	}
	return p, nil
}

// exactlyOne accepts one argument, named what; the error points at the
// command that lists candidates.
func exactlyOne(what, lister string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) != 1 {
			return fmt.Errorf("%s takes one %s, got %d arguments ('%s' lists them)", cmd.CommandPath(), what, len(args), lister)
		}
		return nil
	}
}
