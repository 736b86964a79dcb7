package endpointpolicy

import (
	"net/http"
	"strconv"

	"github.com/cilium/statedb"

	"github.com/cellium/cellium/cells/agentapi"
	"github.com/cellium/cellium/cells/policy"
	statepolicy "github.com/cellium/cellium/statedb/policy"
)

type apiParams struct {
	Engine   *policy.Engine
	DB       *statedb.DB
	Policies statedb.Table[*statepolicy.EndpointPolicyRow]
	Rejected *rejections
}

// APIHandlers returns the policy engine's agent API handlers: GET
// /v1/policy (rules and revision), /v1/policy/selectors,
// /v1/policy/endpoint/{id} (an endpoint's computed policy) and
// /v1/policy/trace.
func APIHandlers(e *policy.Engine, db *statedb.DB, policies statedb.Table[*statepolicy.EndpointPolicyRow]) agentapi.HandlersOut {
	return apiHandlers(e, db, policies, newRejections())
}

// apiHandlers is APIHandlers showing the controller's rejections.
func apiHandlers(e *policy.Engine, db *statedb.DB, policies statedb.Table[*statepolicy.EndpointPolicyRow], rejected *rejections) agentapi.HandlersOut {
	p := apiParams{Engine: e, DB: db, Policies: policies, Rejected: rejected}
	return agentapi.HandlersOut{Handlers: []agentapi.Handler{
		{Pattern: "GET /policy", Handler: p.getPolicy},
		{Pattern: "GET /policy/selectors", Handler: func(w http.ResponseWriter, r *http.Request) {
			agentapi.WriteJSON(w, r, p.Engine.Selectors())
		}},
		{Pattern: "GET /policy/endpoint/{id}", Handler: p.getEndpoint},
		{Pattern: "GET /policy/trace", Handler: p.trace},
	}}
}

func (p apiParams) getPolicy(w http.ResponseWriter, r *http.Request) {
	info := p.Engine.Info()
	info.Rejected = p.Rejected.list()
	agentapi.WriteJSON(w, r, info)
}

func (p apiParams) getEndpoint(w http.ResponseWriter, r *http.Request) {
	n, err := strconv.ParseUint(r.PathValue("id"), 10, 16)
	if err != nil {
		agentapi.WriteError(w, http.StatusBadRequest, "invalid endpoint ID %q: want a number such as 1090", r.PathValue("id"))
		return
	}
	row, _, ok := p.Policies.Get(p.DB.ReadTxn(), statepolicy.EndpointIDIndex.Query(uint16(n)))
	if !ok {
		agentapi.WriteError(w, http.StatusNotFound, "no policy for endpoint %d (no such endpoint, or it has no identity yet)", n)
		return
	}
	agentapi.WriteJSON(w, r, row)
}

func (p apiParams) trace(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	src, err := policy.ParseTraceEnd("src", q.Get("src-identity"), q.Get("src-labels"), q.Get("src-cidr"))
	if err != nil {
		agentapi.WriteError(w, http.StatusBadRequest, "%v", err)
		return
	}
	dst, err := policy.ParseTraceEnd("dst", q.Get("dst-identity"), q.Get("dst-labels"), q.Get("dst-cidr"))
	if err != nil {
		agentapi.WriteError(w, http.StatusBadRequest, "%v", err)
		return
	}
	proto, port, err := policy.ParseDPort(q.Get("dport"))
	if err != nil {
		agentapi.WriteError(w, http.StatusBadRequest, "%v", err)
		return
	}
	tr := p.Engine.Trace(src, dst, proto, port)
	out := struct {
		policy.Trace
		Text string `json:"text"`
	}{tr, tr.Format()}
	agentapi.WriteJSON(w, r, out)
}
