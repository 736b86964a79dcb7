package identity

import (
	"net/http"

	"github.com/cellium/cellium/api/v1/models"
	"github.com/cellium/cellium/cells/agentapi"
	"github.com/cellium/cellium/statedb/identity"
)

// apiHandlers serves GET /v1/identity (every identity the agent knows,
// reserved ones included, sorted by number) and GET /v1/identity/{id}.
func apiHandlers(a *allocator) agentapi.HandlersOut {
	return agentapi.HandlersOut{Handlers: []agentapi.Handler{
		{Pattern: "GET /identity", Handler: func(w http.ResponseWriter, r *http.Request) {
			ids := a.list()
			out := make([]models.Identity, 0, len(ids))
			for _, id := range ids {
				out = append(out, toModel(id))
			}
			agentapi.WriteJSON(w, r, out)
		}},
		{Pattern: "GET /identity/{id}", Handler: func(w http.ResponseWriter, r *http.Request) {
			s := r.PathValue("id")
			n, err := identity.ParseNumericIdentity(s)
			if err != nil {
				if id, ok := identity.LookupReservedByName(s); ok {
					n, err = id, nil
				}
			}
			if err != nil {
				agentapi.WriteError(w, http.StatusBadRequest, "invalid identity %q: want a number such as 40321 or a reserved name such as host", s)
				return
			}
			id, ok := a.lookup(n)
			if !ok {
				agentapi.WriteError(w, http.StatusNotFound, "identity %d not found", n)
				return
			}
			agentapi.WriteJSON(w, r, toModel(id))
		}},
	}}
}

func toModel(id Identity) models.Identity {
	return models.Identity{ID: int64(id.ID), Labels: id.Labels.Strings()}
}
