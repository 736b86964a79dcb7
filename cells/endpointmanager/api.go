package endpointmanager

import (
	"encoding/json"
	"errors"
	"net/http"
	"strconv"

	"github.com/cilium/statedb"
	corev1 "k8s.io/api/core/v1"

	"github.com/cellium/cellium/api/v1/models"
	"github.com/cellium/cellium/cells/agentapi"
	"github.com/cellium/cellium/statedb/endpoints"
)

type apiParams struct {
	Manager *Manager
	DB      *statedb.DB
	Nodes   statedb.Table[*corev1.Node]
}

// model renders an endpoint as the API returns it; its Status is what
// the CEP carries.
func (p apiParams) model(ep *endpoints.Endpoint) models.Endpoint {
	out := models.Endpoint{ID: int64(ep.ID), Status: statusModel(ep.Status(p.Manager.NodeIP(p.DB.ReadTxn(), p.Nodes)))}
	if ep.ContainerID != "" {
		out.Spec = &models.EndpointChangeRequest{
			ContainerID: ep.ContainerID, ContainerInterfaceName: ep.ContainerIfName,
			K8sNamespace: ep.PodNamespace, K8sPodName: ep.PodName, K8sUID: ep.PodUID,
			InterfaceName: ep.HostIfName, InterfaceIndex: ep.HostIfIndex,
			MAC: ep.MAC, HostMAC: ep.HostMAC, NetnsPath: ep.NetnsPath,
		}
		out.Spec.Addressing.IPV4 = ep.IPv4.String()
	}
	return out
}

func writeErr(w http.ResponseWriter, err error) {
	code := http.StatusInternalServerError
	switch {
	case errors.Is(err, ErrInvalidRequest):
		code = http.StatusBadRequest
	case errors.Is(err, ErrNotFound):
		code = http.StatusNotFound
	case errors.Is(err, ErrConflict):
		code = http.StatusConflict
	case errors.Is(err, ErrUnavailable), errors.Is(err, ErrIDsExhausted):
		code = http.StatusServiceUnavailable
	}
	agentapi.WriteError(w, code, "%s", err.Error())
}

func (p apiParams) id(w http.ResponseWriter, r *http.Request) (uint16, bool) {
	n, err := strconv.ParseUint(r.PathValue("id"), 10, 16)
	if err != nil || n == 0 {
		agentapi.WriteError(w, http.StatusBadRequest, "endpoint ID %q: want a number from 1 to %d", r.PathValue("id"), MaxEndpointID)
		return 0, false
	}
	return uint16(n), true
}

func apiHandlers(m *Manager, db *statedb.DB, nodes statedb.Table[*corev1.Node]) agentapi.HandlersOut {
	p := apiParams{Manager: m, DB: db, Nodes: nodes}
	return agentapi.HandlersOut{Handlers: []agentapi.Handler{
		{Pattern: "PUT /endpoint", Handler: func(w http.ResponseWriter, r *http.Request) {
			var req models.EndpointChangeRequest
			dec := json.NewDecoder(r.Body)
			dec.DisallowUnknownFields()
			if err := dec.Decode(&req); err != nil {
				agentapi.WriteError(w, http.StatusBadRequest, "decode endpoint request: %v", err)
				return
			}
			ep, err := m.Create(r.Context(), &req)
			if err != nil {
				writeErr(w, err)
				return
			}
			agentapi.WriteJSONStatus(w, r, http.StatusCreated, p.model(ep))
		}},
		{Pattern: "DELETE /endpoint", Handler: func(w http.ResponseWriter, r *http.Request) {
			cid := r.URL.Query().Get("container-id")
			if cid == "" {
				agentapi.WriteError(w, http.StatusBadRequest, "DELETE /v1/endpoint needs ?container-id=<id>")
				return
			}
			if err := m.DeleteByContainer(r.Context(), cid); err != nil {
				writeErr(w, err)
				return
			}
			w.WriteHeader(http.StatusOK)
		}},
		{Pattern: "DELETE /endpoint/{id}", Handler: func(w http.ResponseWriter, r *http.Request) {
			if id, ok := p.id(w, r); ok {
				if err := m.Delete(r.Context(), id); err != nil {
					writeErr(w, err)
				}
			}
		}},
		{Pattern: "GET /endpoint", Handler: func(w http.ResponseWriter, r *http.Request) {
			out := []models.Endpoint{}
			for _, ep := range m.List() {
				out = append(out, p.model(ep))
			}
			agentapi.WriteJSON(w, r, out)
		}},
		{Pattern: "GET /endpoint/{id}", Handler: func(w http.ResponseWriter, r *http.Request) {
			id, ok := p.id(w, r)
			if !ok {
				return
			}
			ep, found := m.Get(id)
			if !found {
				writeErr(w, ErrNotFound)
				return
			}
			agentapi.WriteJSON(w, r, p.model(ep))
		}},
		{Pattern: "PATCH /endpoint/{id}/labels", Handler: func(w http.ResponseWriter, r *http.Request) {
			id, ok := p.id(w, r)
			if !ok {
				return
			}
			var patch models.LabelsPatch
			if err := json.NewDecoder(r.Body).Decode(&patch); err != nil {
				agentapi.WriteError(w, http.StatusBadRequest, "decode labels patch: %v", err)
				return
			}
			ep, err := m.PatchLabels(r.Context(), id, patch)
			if err != nil {
				writeErr(w, err)
				return
			}
			agentapi.WriteJSON(w, r, p.model(ep))
		}},
		{Pattern: "POST /endpoint/{id}/regenerate", Handler: func(w http.ResponseWriter, r *http.Request) {
			id, ok := p.id(w, r)
			if !ok {
				return
			}
			ep, err := m.Regenerate(r.Context(), id)
			if err != nil {
				writeErr(w, err)
				return
			}
			agentapi.WriteJSON(w, r, p.model(ep))
		}},
	}}
}
