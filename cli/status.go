package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/util/duration"

	"github.com/cellium/cellium/api/v1/client"
	"github.com/cellium/cellium/api/v1/models"
	"github.com/cellium/cellium/statedb/identity"
)

// Module health levels as the agent reports them (cells/hive.Level).
const (
	levelOK       = "ok"
	levelDegraded = "degraded"
	levelStopped  = "stopped"
)

// stateDisabled is the other agent state, besides models.HealthStateOK,
// that status accepts as healthy (as cilium-dbg does).
const stateDisabled = "Disabled"

// statusReport is what `status` gathers, and prints with -o.
type statusReport struct {
	// State is the agent's overall health: Ok or Degraded.
	State string `json:"state"`
	// NodeName is the agent's node.
	NodeName string `json:"node-name,omitempty"`
	// Endpoints counts this node's endpoints.
	Endpoints *endpointCounts `json:"endpoints,omitempty"`
	// Identities counts the identities the agent knows.
	Identities *identityCounts `json:"identities,omitempty"`
	// Nodes counts the nodes the agent knows.
	Nodes *int `json:"nodes,omitempty"`
	// Modules is the health of each module (of each part with --verbose).
	Modules []models.ModuleHealth `json:"modules"`
	// ClusterHealth is what probing the health endpoint found; nil when
	// the agent does not probe (Cluster health: Probe disabled).
	ClusterHealth *models.ClusterHealth `json:"cluster-health,omitempty"`
	// Unavailable says, per section, why the agent could not provide it.
	Unavailable map[string]string `json:"unavailable,omitempty"`
}

type endpointCounts struct {
	Total  int            `json:"total"`
	States map[string]int `json:"states,omitempty"`
}

type identityCounts struct {
	Total    int `json:"total"`
	Reserved int `json:"reserved"`
}

func (a *app) statusCommand() *cobra.Command {
	var verbose, brief bool
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Print the agent's health: modules, endpoints, identities, nodes",
		Long: `Print the agent's health: its overall state, node, endpoints, identities,
nodes and the health of its modules (of every part of every module with
--verbose). Exits 1 when the agent is unreachable or not healthy.`,
		Args: cobra.NoArgs,
	}
	out := outputFlag(cmd)
	cmd.Flags().BoolVar(&verbose, "verbose", false, "Print the health of every part of every module")
	cmd.Flags().BoolVar(&brief, "brief", false, "Print one line: OK, or why the agent is not healthy")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		o, err := parseOutput(*out)
		if err != nil {
			return err
		}
		return a.call(cmd, func(ctx context.Context, c *client.Client) error {
			r, err := gatherStatus(ctx, c, verbose)
			if err != nil {
				return err
			}
			unhealthy := unhealthyError(r)
			switch {
			case brief:
				if unhealthy == nil {
					fmt.Fprintln(a.opts.Out, "OK")
				}
			case !o.human():
				if err := o.print(a.opts.Out, r); err != nil {
					return err
				}
			default:
				if err := a.writeStatus(a.opts.Out, r, verbose); err != nil {
					return err
				}
			}
			return unhealthy
		})
	}
	return cmd
}

// gatherStatus asks the agent for its health, then for the counts. Only
// the health is required: a section the agent cannot provide is recorded
// in Unavailable, unless the agent stopped answering altogether.
func gatherStatus(ctx context.Context, c *client.Client, verbose bool) (*statusReport, error) {
	var h models.Health
	path := "/v1/healthz"
	if verbose {
		path += "?verbose=true"
	}
	if err := c.Do(ctx, http.MethodGet, path, nil, &h); err != nil {
		return nil, explain(err, "get agent health", "")
	}
	r := &statusReport{State: h.State, Modules: h.Modules, ClusterHealth: h.ClusterHealth, Unavailable: map[string]string{}}
	optional := func(section string, err error) error {
		if errors.Is(err, client.ErrAgentUnreachable) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
			return err
		}
		r.Unavailable[section] = explain(err, "get "+section, "").Error()
		return nil
	}

	if cfg, err := c.GetConfig(ctx); err == nil {
		r.NodeName = cfg.NodeName
	} else if err := optional("config", err); err != nil {
		return nil, err
	}
	if eps, err := c.GetEndpoints(ctx); err == nil {
		r.Endpoints = &endpointCounts{Total: len(eps), States: map[string]int{}}
		for _, ep := range eps {
			r.Endpoints.States[string(ep.Status.State)]++
		}
	} else if err := optional("endpoints", err); err != nil {
		return nil, err
	}
	if ids, err := c.GetIdentities(ctx); err == nil {
		r.Identities = &identityCounts{Total: len(ids)}
		for _, id := range ids {
			if id.ID >= 0 && id.ID <= int64(^uint32(0)) && identity.NumericIdentity(id.ID).IsReserved() {
				r.Identities.Reserved++
			}
		}
	} else if err := optional("identities", err); err != nil {
		return nil, err
	}
	if nodes, err := c.GetNodes(ctx); err == nil {
		n := len(nodes)
		r.Nodes = &n
	} else if err := optional("nodes", err); err != nil {
		return nil, err
	}
	if len(r.Unavailable) == 0 {
		r.Unavailable = nil
	}
	return r, nil
}

// unhealthyError is status's error when the agent is neither Ok nor
// Disabled: which modules are degraded and why.
func unhealthyError(r *statusReport) error {
	if r.State == models.HealthStateOK || r.State == stateDisabled {
		return nil
	}
	var bad []string
	for _, m := range r.Modules {
		if m.Level == levelDegraded {
			bad = append(bad, m.ID+": "+healthMessage(m))
		}
	}
	msg := fmt.Sprintf("the cellium agent is %s", r.State)
	if len(bad) > 0 {
		msg += ": " + strings.Join(bad, "; ")
	}
	return errors.New(msg)
}

// healthMessage joins a report's message and error.
func healthMessage(m models.ModuleHealth) string {
	switch {
	case m.Error == "":
		return m.Message
	case m.Message == "":
		return m.Error
	}
	return m.Message + ": " + m.Error
}

// writeStatus prints the report as cilium-dbg lays out its status: a
// label padded to 25 columns, then the value.
func (a *app) writeStatus(w io.Writer, r *statusReport, verbose bool) error {
	var b strings.Builder
	line := func(label, value string) { fmt.Fprintf(&b, "%-25s%s\n", label+":", value) }
	unavailable := func(section string) string { return "unavailable: " + r.Unavailable[section] }

	line("Cellium", r.State)
	if _, ok := r.Unavailable["config"]; ok {
		line("Node", unavailable("config"))
	} else {
		line("Node", r.NodeName)
	}
	switch {
	case r.Endpoints != nil:
		v := strconv.Itoa(r.Endpoints.Total)
		if r.Endpoints.Total > 0 {
			var parts []string
			for _, st := range slices.Sorted(maps.Keys(r.Endpoints.States)) {
				parts = append(parts, fmt.Sprintf("%d %s", r.Endpoints.States[st], st))
			}
			v += " (" + strings.Join(parts, ", ") + ")"
		}
		line("Endpoints", v)
	default:
		line("Endpoints", unavailable("endpoints"))
	}
	switch {
	case r.Identities != nil:
		line("Identities", fmt.Sprintf("%d (%d reserved)", r.Identities.Total, r.Identities.Reserved))
	default:
		line("Identities", unavailable("identities"))
	}
	switch {
	case r.Nodes != nil:
		line("Nodes", strconv.Itoa(*r.Nodes))
	default:
		line("Nodes", unavailable("nodes"))
	}

	writeClusterHealth(line, r.ClusterHealth, verbose)

	count := map[string]int{}
	for _, m := range r.Modules {
		count[m.Level]++
	}
	line("Modules Health", fmt.Sprintf("Stopped(%d) Degraded(%d) OK(%d)", count[levelStopped], count[levelDegraded], count[levelOK]))
	if _, err := io.WriteString(w, b.String()); err != nil {
		return err
	}

	var rows []models.ModuleHealth
	for _, m := range r.Modules {
		if verbose || m.Level == levelDegraded {
			rows = append(rows, m)
		}
	}
	if len(rows) == 0 {
		return nil
	}
	t := newTable()
	t.row("  MODULE", "LEVEL", "SINCE", "MESSAGE")
	now := a.opts.Now()
	for _, m := range rows {
		since := ""
		if !m.Since.IsZero() {
			since = duration.HumanDuration(now.Sub(m.Since))
		}
		t.row("  "+m.ID, m.Level, since, healthMessage(m))
	}
	return t.flush(w)
}

// writeClusterHealth prints "Cluster health" as cilium-dbg does (N/M
// reachable, or Probe disabled), then one line per probe of this node's
// health endpoint, and one per other node that is not reachable (every
// node and every path with verbose).
func writeClusterHealth(line func(label, value string), ch *models.ClusterHealth, verbose bool) {
	if ch == nil {
		line("Cluster health", "Probe disabled")
		return
	}
	line("Cluster health", fmt.Sprintf("%d/%d reachable", ch.Reachable, ch.Total))
	for _, p := range ch.Probes {
		label := p.Name
		if p.Name == "health-endpoint" {
			label = "Health endpoint"
		}
		ip := p.IP
		if ip == "" {
			ip = "(no IP)"
		}
		switch {
		case p.Reachable:
			line("  "+label, fmt.Sprintf("%s reachable (%s)", ip, p.Latency.Round(time.Microsecond)))
		default:
			line("  "+label, fmt.Sprintf("%s unreachable: %s", ip, p.Error))
		}
	}
	for _, n := range ch.Nodes {
		if !verbose && n.Status != nodeStatusUnreachable {
			continue
		}
		line("  "+n.Name, n.Status)
		for _, p := range n.Paths {
			if !verbose && (!p.Probed || p.Reachable) {
				continue
			}
			line("    "+p.Type+" "+p.Protocol, pathText(p))
		}
	}
}

// nodeStatusUnreachable is models.NodeHealth.Status of a node a path to
// which did not answer.
const nodeStatusUnreachable = "unreachable"

// pathText says how a path to another node fared: its address, then its
// latency or its error.
func pathText(p models.NodePathHealth) string {
	switch {
	case !p.Probed:
		return p.IP + " not probed yet"
	case p.Reachable:
		return fmt.Sprintf("%s reachable (%s)", p.IP, p.Latency.Round(time.Microsecond))
	}
	s := fmt.Sprintf("%s unreachable: %s", p.IP, p.Error)
	if p.LastReachable != nil {
		s += " (last reachable " + p.LastReachable.UTC().Format(time.RFC3339) + ")"
	}
	return s
}
