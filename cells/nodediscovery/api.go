package nodediscovery

import (
	"net/http"

	"github.com/cilium/statedb"

	"github.com/cellium/cellium/api/v1/models"
	"github.com/cellium/cellium/cells/agentapi"
	"github.com/cellium/cellium/statedb/nodes"
)

// nodeHandlers serves GET /v1/node: every node of the nodes table, by
// name.
func nodeHandlers(db *statedb.DB, table statedb.Table[*nodes.Node]) agentapi.HandlersOut {
	return agentapi.HandlersOut{Handlers: []agentapi.Handler{{
		Pattern: "GET /node",
		Handler: func(w http.ResponseWriter, r *http.Request) {
			out := []models.Node{}
			for n := range table.All(db.ReadTxn()) {
				out = append(out, toModel(n))
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
	return m
}
