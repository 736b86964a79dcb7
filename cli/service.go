package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/netip"
	"slices"

	"github.com/spf13/cobra"

	"github.com/cellium/cellium/api/v1/client"
	"github.com/cellium/cellium/statedb/lb"
)

func (a *app) serviceCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "service",
		Short: "Inspect the socket load balancer: Service ClusterIPs and their backends",
	}
	list := &cobra.Command{
		Use:     "list",
		Aliases: []string{"ls"},
		Short:   "List the ClusterIP frontends with their session affinity (None, or ClientIP and its timeout), their backends (by backend ID) and the reconciliation status of their map entries",
		Example: `  cellium service list
  cellium service list -o json`,
		Args: cobra.NoArgs,
	}
	out := outputFlag(list)
	list.RunE = func(cmd *cobra.Command, _ []string) error {
		o, err := parseOutput(*out)
		if err != nil {
			return err
		}
		return a.call(cmd, func(ctx context.Context, c *client.Client) error {
			raw, err := c.GetStatedbTable(ctx, lb.FrontendsTableName)
			if err != nil {
				return explain(err, "list the services", "list the services: the agent has no table "+lb.FrontendsTableName+": its eBPF datapath is off (--enable-bpf-datapath=false)")
			}
			var fes []*lb.Frontend
			if err := json.Unmarshal(raw, &fes); err != nil {
				return fmt.Errorf("list the services: decode the agent's answer: %w", err)
			}
			slices.SortFunc(fes, func(x, y *lb.Frontend) int { return x.Address.Compare(y.Address) })
			if !o.human() {
				return o.print(a.opts.Out, fes)
			}
			return writeServices(a.opts.Out, fes)
		})
	}
	cmd.AddCommand(list)
	return cmd
}

// writeServices prints one line per frontend and backend, like Cilium's
// `cilium-dbg service list`.
func writeServices(w io.Writer, fes []*lb.Frontend) error {
	t := newTable()
	t.row("FRONTEND", "SERVICE TYPE", "SERVICE", "AFFINITY", "BACKEND", "STATUS")
	for _, f := range fes {
		svc := f.Service
		if f.PortName != "" {
			svc += ":" + f.PortName
		}
		if len(f.Backends) == 0 {
			t.row(f.Address.String(), "ClusterIP", svc, f.AffinityString(), "(none)", f.Status.String())
			continue
		}
		for i, b := range f.Backends {
			id := uint32(0)
			if i < len(f.BackendIDs) {
				id = f.BackendIDs[i]
			}
			be := fmt.Sprintf("%d => %s/%s", id, netip.AddrPortFrom(b.Addr, b.Port), lb.ProtoName(b.Proto))
			if i == 0 {
				t.row(f.Address.String(), "ClusterIP", svc, f.AffinityString(), be, f.Status.String())
			} else {
				t.row("", "", "", "", be, "")
			}
		}
	}
	return t.flush(w)
}
