package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/netip"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/cellium/cellium/api/v1/client"
	"github.com/cellium/cellium/statedb/lb"
)

func (a *app) serviceCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "service",
		Short: "Inspect the load balancer: Service frontends (ClusterIPs; with --kube-proxy-replacement also NodePorts, LoadBalancer IPs, externalIPs) and their backends",
	}
	list := &cobra.Command{
		Use:     "list",
		Aliases: []string{"ls"},
		Short:   "List the frontends (headed, with kube-proxy replacement, by the backend selection for traffic from outside the node: Random, or Maglev and its table size) with their type (ClusterIP, NodePort, LoadBalancer, ExternalIPs), session affinity (None, or ClientIP and its timeout), backends (by backend ID) and the reconciliation status of their map entries, then the Services (or pods' hostPorts) the load balancer refuses (STATE Refused: too large for --bpf-lb-map-max, or a frontend owned by another) or serves degraded (Degraded: endpoints skipped, or a host socket on one of its NodePorts or hostPorts that gets none of their traffic from outside, reason HostPortInUse, listed as SERVICE/host-socket); a frontend with two scopes (a traffic policy Local) has a second line, its address suffixed /i, with the backends clients inside the cluster get",
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
			// The backend selection heads the list when the agent
			// says (its flags); an agent that does not is listed
			// without it.
			if cfg, err := c.GetConfig(ctx); err == nil {
				if line := backendSelection(cfg.Options); line != "" {
					fmt.Fprintln(a.opts.Out, line)
				}
			}
			if err := writeServices(a.opts.Out, fes); err != nil {
				return err
			}
			// The Services refused or degraded; an agent without the
			// table (older) lists none.
			raw, err = c.GetStatedbTable(ctx, lb.ServiceStatesTableName)
			if err != nil {
				return nil
			}
			var states []*lb.ServiceState
			if err := json.Unmarshal(raw, &states); err != nil {
				return fmt.Errorf("list the service states: decode the agent's answer: %w", err)
			}
			return writeServiceStates(a.opts.Out, states)
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
		typ := f.TypeName()
		if f.Local {
			typ += " (Local)"
		}
		serviceRows(t, f.Address.String(), typ, svc, f.AffinityString(), f.Backends, f.BackendIDs, f.Status.String())
		if f.TwoScopes {
			// The internal scope, as Cilium shows it: the address with /i.
			serviceRows(t, f.Address.String()+"/i", f.TypeName(), svc, f.AffinityString(), f.IntBackends, f.IntBackendIDs, f.Status.String())
		}
	}
	return t.flush(w)
}

// writeServiceStates prints, after a blank line, the Services (and pods'
// hostPorts) not served as asked, with their state (Refused: none of
// their frontends is in the maps; Degraded: endpoints skipped, or a host
// socket on a NodePort or hostPort), reason
// and message; nothing when there are none.
func writeServiceStates(w io.Writer, states []*lb.ServiceState) error {
	if len(states) == 0 {
		return nil
	}
	slices.SortFunc(states, func(x, y *lb.ServiceState) int { return strings.Compare(x.Owner, y.Owner) })
	fmt.Fprintln(w)
	t := newTable()
	t.row("SERVICE", "STATE", "REASON", "MESSAGE")
	for _, s := range states {
		t.row(s.Owner, s.State, s.Reason, s.Message)
	}
	return t.flush(w)
}

// serviceRows adds the lines of one frontend scope: one per backend.
func serviceRows(t *table, fe, typ, svc, affinity string, bs []lb.L4Addr, ids []uint32, status string) {
	if len(bs) == 0 {
		t.row(fe, typ, svc, affinity, "(none)", status)
		return
	}
	for i, b := range bs {
		id := uint32(0)
		if i < len(ids) {
			id = ids[i]
		}
		be := fmt.Sprintf("%d => %s/%s", id, netip.AddrPortFrom(b.Addr, b.Port), lb.ProtoName(b.Proto))
		if i == 0 {
			t.row(fe, typ, svc, affinity, be, status)
		} else {
			t.row("", "", "", "", be, "")
		}
	}
}

// backendSelection is the line naming how the uplink program picks
// backends (--bpf-lb-algorithm, --bpf-lb-maglev-table-size), from the
// agent's flags: "" without kube-proxy replacement (no uplink program)
// or when the agent does not have the flag.
func backendSelection(opts map[string]string) string {
	if opts["kube-proxy-replacement"] != "true" {
		return ""
	}
	switch alg := opts["bpf-lb-algorithm"]; alg {
	case "":
		return ""
	case "maglev":
		return fmt.Sprintf("Backend selection (external traffic): Maglev (table size %s)", opts["bpf-lb-maglev-table-size"])
	case "random":
		return "Backend selection (external traffic): Random"
	default:
		return "Backend selection (external traffic): " + alg
	}
}
