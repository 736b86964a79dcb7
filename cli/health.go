package cli

import (
	"context"
	"errors"
	"io"
	"net/http"

	"github.com/spf13/cobra"

	"github.com/cellium/cellium/api/v1/client"
	"github.com/cellium/cellium/api/v1/models"
)

func (a *app) healthCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "health",
		Short: "Inspect what the agent's probes of the other nodes found (cilium-health)",
	}
	status := &cobra.Command{
		Use:   "status",
		Short: "List every other node with each path's reachability, latency and last error",
		Long: `List every node the agent probes: its address by ICMP (type node) and its
health endpoint by ICMP and GET /hello on port 4240 (type endpoint), with the
last probe's outcome. A node is reachable when every path answered.`,
		Example: `  cellium health status
  cellium health status -o json`,
		Args: cobra.NoArgs,
	}
	out := outputFlag(status)
	status.RunE = func(cmd *cobra.Command, _ []string) error {
		o, err := parseOutput(*out)
		if err != nil {
			return err
		}
		return a.call(cmd, func(ctx context.Context, c *client.Client) error {
			var h models.Health
			if err := c.Do(ctx, http.MethodGet, "/v1/healthz", nil, &h); err != nil {
				return explain(err, "get the node health", "")
			}
			if h.ClusterHealth == nil {
				return errors.New("the agent does not probe other nodes: start it with --enable-health-checking=true")
			}
			if !o.human() {
				return o.print(a.opts.Out, h.ClusterHealth)
			}
			return writeNodeHealth(a.opts.Out, h.ClusterHealth)
		})
	}
	cmd.AddCommand(status)
	return cmd
}

// writeNodeHealth prints one line per path of every node.
func writeNodeHealth(w io.Writer, ch *models.ClusterHealth) error {
	t := newTable()
	t.row("NODE", "STATUS", "TYPE", "PROTOCOL", "IP", "REACHABLE", "LATENCY", "LAST REACHABLE", "ERROR")
	for _, n := range ch.Nodes {
		for _, p := range n.Paths {
			reach, latency, last := "unknown", "", ""
			if p.Probed {
				reach = "false"
				if p.Reachable {
					reach, latency = "true", p.Latency.String()
				}
			}
			if p.LastReachable != nil {
				last = p.LastReachable.UTC().Format("2006-01-02T15:04:05Z")
			}
			t.row(n.Name, n.Status, p.Type, p.Protocol, p.IP, reach, latency, last, p.Error)
		}
	}
	return t.flush(w)
}
