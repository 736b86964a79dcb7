package cli

import (
	"cmp"
	"context"
	"io"
	"net/netip"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/cellium/cellium/api/v1/client"
	"github.com/cellium/cellium/api/v1/models"
)

// Node sources as cilium-dbg names them: the agent's own node, and nodes
// learnt from their CiliumNode objects.
const (
	sourceLocal          = "local"
	sourceCustomResource = "custom-resource"
)

// Node address types, in the order a node's primary address is chosen.
var primaryAddressTypes = []string{"InternalIP", "ExternalIP", "CiliumInternalIP"}

func (a *app) nodeCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "node",
		Short: "Inspect the cluster's nodes as this agent sees them",
	}
	list := &cobra.Command{
		Use:     "list",
		Aliases: []string{"ls"},
		Short:   "List the nodes with their addresses and pod CIDRs",
		Args:    cobra.NoArgs,
	}
	out := outputFlag(list)
	list.RunE = func(cmd *cobra.Command, _ []string) error {
		o, err := parseOutput(*out)
		if err != nil {
			return err
		}
		return a.call(cmd, func(ctx context.Context, c *client.Client) error {
			nodes, err := c.GetNodes(ctx)
			if err != nil {
				return explain(err, "list nodes", "")
			}
			slices.SortFunc(nodes, func(x, y models.Node) int { return cmp.Compare(x.Name, y.Name) })
			if !o.human() {
				return o.print(a.opts.Out, nodes)
			}
			return writeNodes(a.opts.Out, nodes)
		})
	}
	cmd.AddCommand(list)
	return cmd
}

// writeNodes prints nodes in cilium-dbg's `node list` columns, then the
// health endpoint's address, the node's health as this agent's probes
// found it, and what of its CiliumNode the agent refuses.
func writeNodes(w io.Writer, nodes []models.Node) error {
	t := newTable()
	t.row("Name", "IPv4 Address", "Endpoint CIDR", "IPv6 Address", "Endpoint CIDR", "Health IP", "Health", "Source", "Refused")
	for _, n := range nodes {
		src := sourceCustomResource
		if n.Local {
			src = sourceLocal
		}
		t.row(n.Name, nodeIP(n, false), podCIDR(n, false), nodeIP(n, true), podCIDR(n, true), n.HealthIPv4, n.Health, src,
			strings.Join(n.Refused, "; "))
	}
	return t.flush(w)
}

// nodeIP returns the node's primary address of one family: the first
// InternalIP, else ExternalIP, else CiliumInternalIP.
func nodeIP(n models.Node, ipv6 bool) string {
	for _, typ := range primaryAddressTypes {
		for _, addr := range n.Addresses {
			if ip, err := netip.ParseAddr(addr.IP); err == nil && addr.Type == typ && ip.Is6() == ipv6 {
				return addr.IP
			}
		}
	}
	return ""
}

// podCIDR returns the node's first pod CIDR of one family.
func podCIDR(n models.Node, ipv6 bool) string {
	for _, s := range n.PodCIDRs {
		if p, err := netip.ParsePrefix(s); err == nil && p.Addr().Is6() == ipv6 {
			return s
		}
	}
	return ""
}
