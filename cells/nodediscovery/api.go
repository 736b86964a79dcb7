package nodediscovery

import (
	"net/http"

	"github.com/cilium/statedb"

	"github.com/cellium/cellium/api/v1/models"
	"github.com/cellium/cellium/cells/agentapi"
	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/statedb/health"
	"github.com/cellium/cellium/statedb/nodes"
)

// nodeHandlerParams are nodeHandlers' inputs.
type nodeHandlerParams struct {
	hive.In
	DB    *statedb.DB
	Table statedb.Table[*nodes.Node]
	// Paths are the health probes of the other nodes; absent with
	// --enable-health-checking=false.
	Paths statedb.Table[*health.NodePath] `optional:"true"`
}

// nodeHandlers serves GET /v1/node: every node of the nodes table, by
// name, with what of its CiliumNode is refused and its health.
func nodeHandlers(p nodeHandlerParams) agentapi.HandlersOut {
	return agentapi.HandlersOut{Handlers: []agentapi.Handler{{
		Pattern: "GET /node",
		Handler: func(w http.ResponseWriter, r *http.Request) {
			out := []models.Node{}
			txn := p.DB.ReadTxn()
			for n := range p.Table.All(txn) {
				m := toModel(n)
				if p.Paths != nil && !n.Local {
					m.Health = nodeHealth(statedb.Collect(p.Paths.List(txn, health.NodePathNodeIndex.Query(n.Name))))
				}
				out = append(out, m)
			}
			agentapi.WriteJSON(w, r, out)
		},
	}}}
}

func toModel(n *nodes.Node) models.Node {
	m := models.Node{Name: n.Name, BootID: n.BootID, Local: n.Local, Addresses: []models.NodeAddress{}}
	for _, a := range n.Addresses {
		m.Addresses = append(m.Addresses, models.NodeAddress{Type: a.Type, IP: a.IP.String()})
	}
	for _, p := range n.PodCIDRs {
		m.PodCIDRs = append(m.PodCIDRs, p.String())
	}
	if n.HealthIPv4.IsValid() {
		m.HealthIPv4 = n.HealthIPv4.String()
	}
	for _, r := range n.Refused {
		m.Refused = append(m.Refused, r.String())
	}
	return m
}

// nodeHealth is reachable when every path to the node answered its last
// probe, unreachable when one did not, unknown while one is not probed
// yet (or none is probed at all).
func nodeHealth(paths []*health.NodePath) string {
	if len(paths) == 0 {
		return agentapi.NodeStatusUnknown
	}
	st := agentapi.NodeStatusReachable
	for _, p := range paths {
		switch {
		case p.Probed && !p.Reachable:
			return agentapi.NodeStatusUnreachable
		case !p.Probed:
			st = agentapi.NodeStatusUnknown
		}
	}
	return st
}
