package cli

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/cellium/cellium/api/v1/client"
	"github.com/cellium/cellium/cells/policy"
)

func (a *app) policyCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "policy",
		Short: "Inspect the network policy the agent enforces",
	}
	cmd.AddCommand(a.policyGetCommand(), a.policySelectorsCommand(), a.policyTraceCommand())
	return cmd
}

func (a *app) policyGetCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "get",
		Short: "Print the agent's rules, each with the object it came from, and the policy revision",
		Args:  cobra.NoArgs,
	}
	out := outputFlag(cmd)
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		o, err := parseOutput(*out)
		if err != nil {
			return err
		}
		return a.call(cmd, func(ctx context.Context, c *client.Client) error {
			var pi policy.PolicyInfo
			if err := c.Do(ctx, http.MethodGet, "/v1/policy", nil, &pi); err != nil {
				return explain(err, "get policy", "")
			}
			if !o.human() {
				return o.print(a.opts.Out, pi)
			}
			return writePolicy(a.opts.Out, &pi)
		})
	}
	return cmd
}

func writePolicy(w io.Writer, pi *policy.PolicyInfo) error {
	var b strings.Builder
	for _, r := range pi.Rules {
		fmt.Fprintf(&b, "%s\n  subject: %s\n", r.Name, r.Subject)
		for _, e := range r.Ingress {
			fmt.Fprintf(&b, "  ingress: %s\n", e)
		}
		for _, e := range r.Egress {
			fmt.Fprintf(&b, "  egress:  %s\n", e)
		}
		for _, warn := range r.Warnings {
			fmt.Fprintf(&b, "  not enforced: %s\n", warn)
		}
	}
	for _, r := range pi.Rejected {
		fmt.Fprintf(&b, "%s\n  rejected: %s\n", r.Source, r.Error)
	}
	fmt.Fprintf(&b, "Revision: %d\n", pi.Revision)
	_, err := io.WriteString(w, b.String())
	return err
}

func (a *app) policySelectorsCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "selectors",
		Short: "List the selectors in use with the identities each selects",
		Args:  cobra.NoArgs,
	}
	out := outputFlag(cmd)
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		o, err := parseOutput(*out)
		if err != nil {
			return err
		}
		return a.call(cmd, func(ctx context.Context, c *client.Client) error {
			var sels []policy.SelectorInfo
			if err := c.Do(ctx, http.MethodGet, "/v1/policy/selectors", nil, &sels); err != nil {
				return explain(err, "list selectors", "")
			}
			if !o.human() {
				return o.print(a.opts.Out, sels)
			}
			t := newTable()
			t.row("SELECTOR", "USERS", "IDENTITIES")
			for _, s := range sels {
				ids := make([]string, len(s.Identities))
				for i, id := range s.Identities {
					ids[i] = id.StringID()
				}
				if len(ids) == 0 {
					ids = []string{""}
				}
				for i, id := range ids {
					if i == 0 {
						t.row(s.Selector, strconv.Itoa(s.Users), id)
					} else {
						t.row("", "", id)
					}
				}
			}
			return t.flush(a.opts.Out)
		})
	}
	return cmd
}

// traceEnd holds the flags of one end of a trace.
type traceEnd struct {
	pod, identity, labels, cidr string
}

func (e *traceEnd) flags(cmd *cobra.Command, side, what string) {
	cmd.Flags().StringVar(&e.pod, side+"-k8s-pod", "", what+" pod of this node, as NAMESPACE:POD")
	cmd.Flags().StringVar(&e.identity, side+"-identity", "", what+" identity, a number or a reserved name (world, host, ...)")
	cmd.Flags().StringVar(&e.labels, side+"-labels", "", what+" identity labels, comma separated ([source:]key=value)")
	cmd.Flags().StringVar(&e.cidr, side+"-cidr", "", what+" address outside the cluster")
}

// query adds the end to q, resolving a pod to its identity through the
// agent's endpoints.
func (e *traceEnd) query(ctx context.Context, c *client.Client, side string, q url.Values) error {
	if e.pod != "" {
		if e.identity != "" || e.labels != "" || e.cidr != "" {
			return fmt.Errorf("give one of --%[1]s-k8s-pod, --%[1]s-identity, --%[1]s-labels, --%[1]s-cidr", side)
		}
		ns, name, ok := strings.Cut(e.pod, ":")
		if !ok {
			ns, name = "default", e.pod
		}
		eps, err := c.GetEndpoints(ctx)
		if err != nil {
			return explain(err, "list endpoints", "")
		}
		for _, ep := range eps {
			if ep.Status.ExternalIdentifiers != nil && ep.Status.ExternalIdentifiers.PodName == ns+"/"+name && ep.Status.Identity != nil {
				q.Set(side+"-identity", strconv.FormatInt(ep.Status.Identity.ID, 10))
				// The pod's address: CIDR rules naming it count too.
				if n := ep.Status.Networking; n != nil {
					for _, a := range n.Addressing {
						if a != nil && a.IPV4 != "" {
							q.Set(side+"-cidr", a.IPV4)
							break
						}
					}
				}
				return nil
			}
		}
		return fmt.Errorf("--%s-k8s-pod %s: no endpoint with an identity for pod %s/%s on this node ('cellium endpoint list' shows them)", side, e.pod, ns, name)
	}
	q.Set(side+"-identity", e.identity)
	q.Set(side+"-labels", e.labels)
	q.Set(side+"-cidr", e.cidr)
	return nil
}

func (a *app) policyTraceCommand() *cobra.Command {
	var src, dst traceEnd
	var dport string
	cmd := &cobra.Command{
		Use:   "trace",
		Short: "Decide a connection with the current policy: the source's egress, the destination's ingress, and the final verdict",
		Long: `Decide a connection from a source to a destination on a port with the agent's
current policy, and print which rules and which entry decided each direction:
the source's egress (when the source is an endpoint) and the destination's
ingress (when it is one). The last line is "Final verdict: ALLOWED" or
"Final verdict: DENIED".`,
		Example: `  cellium policy trace --src-k8s-pod default:client --dst-k8s-pod default:web --dport 80/TCP
  cellium policy trace --src-cidr 192.0.2.1 --dst-identity 48213 --dport 443`,
		Args: cobra.NoArgs,
	}
	src.flags(cmd, "src", "Source")
	dst.flags(cmd, "dst", "Destination")
	cmd.Flags().StringVar(&dport, "dport", "", "Destination port and protocol, PORT[/TCP|UDP|SCTP], or TYPE/ICMP such as 8/ICMP (TCP by default)")
	out := outputFlag(cmd)
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		o, err := parseOutput(*out)
		if err != nil {
			return err
		}
		if _, _, err := policy.ParseDPort(dport); err != nil {
			return err
		}
		return a.call(cmd, func(ctx context.Context, c *client.Client) error {
			q := url.Values{}
			if err := src.query(ctx, c, "src", q); err != nil {
				return err
			}
			if err := dst.query(ctx, c, "dst", q); err != nil {
				return err
			}
			for k, v := range q {
				if len(v) == 1 && v[0] == "" {
					delete(q, k)
				}
			}
			q.Set("dport", dport)
			var tr struct {
				policy.Trace
				Text string `json:"text"`
			}
			if err := c.Do(ctx, http.MethodGet, "/v1/policy/trace?"+q.Encode(), nil, &tr); err != nil {
				return explain(err, "trace", "")
			}
			if !o.human() {
				return o.print(a.opts.Out, tr.Trace)
			}
			_, err := io.WriteString(a.opts.Out, tr.Text)
			return err
		})
	}
	return cmd
}
