package endpointmanager

import (
	"net/http"
	"net/netip"

	"github.com/cilium/statedb"

	"github.com/cellium/cellium/api/v1/models"
	"github.com/cellium/cellium/cells/agentapi"
	"github.com/cellium/cellium/statedb/bpfprog"
	"github.com/cellium/cellium/statedb/endpoints"
	"github.com/cellium/cellium/statedb/nodes"
	statepolicy "github.com/cellium/cellium/statedb/policy"
)

type apiParams struct {
	Manager   *Manager
	DB        *statedb.DB
	LocalNode statedb.Table[*nodes.LocalNode]
	Policies  statedb.Table[*statepolicy.EndpointPolicyRow]
}

// model renders an endpoint as the API returns it; its Status is what
// the CEP carries, policy included (from the policy engine's table).
func (p apiParams) model(ep *endpoints.Endpoint) models.Endpoint {
	txn := p.DB.ReadTxn()
	st := ep.Status(p.Manager.NodeIP(txn, p.LocalNode))
	st.Policy = statepolicy.EndpointStatus(txn, p.Policies, ep.ID, ep.Identity)
	st.Health.Bpf = bpfprog.Health(txn, p.Manager.programs, ep)
	out := models.Endpoint{ID: int64(ep.ID), Status: statusModel(st)}
	if ep.Identity != 0 {
		revs := &models.EndpointPolicyRevisions{Realized: models.EndpointPolicyRevision{PolicyRevision: ep.PolicyRevision}}
		if row, _, ok := p.Policies.Get(txn, statepolicy.EndpointIDIndex.Query(ep.ID)); ok && row.Identity == ep.Identity && row.Policy != nil {
			revs.Spec.PolicyRevision = row.Policy.Revision
		}
		out.Policy = revs
	}
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

// errorCodes are the API's codes for the manager's errors.
var errorCodes = agentapi.ErrorCodes{
	{Err: ErrInvalidRequest, Code: http.StatusBadRequest},
	{Err: ErrNotFound, Code: http.StatusNotFound},
	{Err: ErrConflict, Code: http.StatusConflict},
	{Err: ErrUnavailable, Code: http.StatusServiceUnavailable},
	{Err: ErrIDsExhausted, Code: http.StatusServiceUnavailable},
}

func writeErr(w http.ResponseWriter, err error) { errorCodes.Write(w, err) }

func (p apiParams) id(w http.ResponseWriter, r *http.Request) (uint16, bool) {
	n, ok := agentapi.PathUint(w, r, "id", "endpoint ID", 1, MaxEndpointID)
	return uint16(n), ok
}

func apiHandlers(m *Manager, db *statedb.DB, local statedb.Table[*nodes.LocalNode], policies statedb.Table[*statepolicy.EndpointPolicyRow]) agentapi.HandlersOut {
	p := apiParams{Manager: m, DB: db, LocalNode: local, Policies: policies}
	return agentapi.HandlersOut{Handlers: []agentapi.Handler{
		{Pattern: "PUT /endpoint", Handler: func(w http.ResponseWriter, r *http.Request) {
			var req models.EndpointChangeRequest
			if !agentapi.DecodeJSON(w, r, "endpoint request", &req) {
				return
			}
			ep, err := m.Create(r.Context(), &req)
			if err != nil {
				writeErr(w, err)
				return
			}
			agentapi.WriteJSONStatus(w, r, http.StatusCreated, p.model(ep))
		}},
		// DELETE /v1/endpoint?container-id=<id>[&ip=<addr>]: the
		// container's endpoint and addresses (with ip: only that address,
		// and the endpoint only if it has it). 404 when nothing was held.
		{Pattern: "DELETE /endpoint", Handler: func(w http.ResponseWriter, r *http.Request) {
			cid, ok := agentapi.QueryString(w, r, "container-id", models.MaxContainerIDLen, true)
			if !ok {
				return
			}
			ipStr, ok := agentapi.QueryString(w, r, "ip", models.MaxAddressLen, false)
			if !ok {
				return
			}
			var ip netip.Addr
			if s := ipStr; s != "" {
				var err error
				if ip, err = netip.ParseAddr(s); err != nil {
					agentapi.WriteError(w, http.StatusBadRequest, "ip=%q is not an IP address", s)
					return
				}
			}
			if err := m.DeleteByContainer(r.Context(), cid, ip); err != nil {
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
			if !agentapi.DecodeJSON(w, r, "labels patch", &patch) {
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
