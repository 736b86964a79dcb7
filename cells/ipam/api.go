package ipam

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/netip"
	"time"

	"github.com/cellium/cellium/api/v1/models"
	"github.com/cellium/cellium/cells/agentapi"
	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/cells/ipam/pool"
)

// apiWaitTimeout bounds how long POST /v1/ipam waits for the node's pod
// CIDRs before it answers 503 with ErrNoPodCIDR's message.
const apiWaitTimeout = 30 * time.Second

// PodMTU tells the MTU of pod interfaces. POST /v1/ipam returns it with
// the address, so that the CNI plugin sets up a pod with one call before
// the endpoint's. The cni-config cell provides it; without it the reply
// has no mtu and the plugin uses its netconf's.
type PodMTU interface {
	// PodMTU returns the MTU of pod interfaces, or 0 when unknown.
	PodMTU() int
}

// api serves the IPAM routes of the agent API.
type api struct {
	a    *allocator
	mtu  PodMTU
	wait time.Duration
}

// apiParams are what the API handlers need.
type apiParams struct {
	hive.In
	Allocator *allocator
	MTU       PodMTU `optional:"true"`
}

func apiHandlers(p apiParams) agentapi.HandlersOut {
	h := &api{a: p.Allocator, mtu: p.MTU, wait: apiWaitTimeout}
	return agentapi.HandlersOut{Handlers: []agentapi.Handler{
		{Pattern: "POST /ipam", Handler: h.allocateNext},
		{Pattern: "POST /ipam/{ip}", Handler: h.allocateIP},
		{Pattern: "DELETE /ipam/{ip}", Handler: h.release},
		{Pattern: "GET /ipam", Handler: h.list},
	}}
}

// allocateNext is POST /v1/ipam?owner=<namespace>/<pod>[&family=ipv4]:
// the next free address, answered with 201 and a models.IPAMResponse that
// carries the pod MTU too.
func (h *api) allocateNext(w http.ResponseWriter, r *http.Request) {
	owner, ok := ownerParam(w, r)
	if !ok {
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), h.wait)
	defer cancel()
	al, err := h.a.AllocateNext(ctx, owner)
	if err != nil {
		writeAllocError(w, err)
		return
	}
	writeCreated(w, h.response(al))
}

// allocateIP is POST /v1/ipam/{ip}?owner=...: claim a given address.
func (h *api) allocateIP(w http.ResponseWriter, r *http.Request) {
	ip, err := netip.ParseAddr(r.PathValue("ip"))
	if err != nil {
		agentapi.WriteError(w, http.StatusBadRequest, "invalid IP address %q: %v", r.PathValue("ip"), err)
		return
	}
	owner, ok := ownerParam(w, r)
	if !ok {
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), h.wait)
	defer cancel()
	al, err := h.a.AllocateIP(ctx, ip, owner)
	if err != nil {
		writeAllocError(w, err)
		return
	}
	writeCreated(w, h.response(al))
}

// release is DELETE /v1/ipam/{ip}; releasing a free address succeeds.
func (h *api) release(w http.ResponseWriter, r *http.Request) {
	ip, err := netip.ParseAddr(r.PathValue("ip"))
	if err != nil {
		agentapi.WriteError(w, http.StatusBadRequest, "invalid IP address %q: %v", r.PathValue("ip"), err)
		return
	}
	switch err := h.a.Release(ip); {
	case err == nil:
		w.WriteHeader(http.StatusOK)
	case errors.Is(err, pool.ErrNotInPool):
		agentapi.WriteError(w, http.StatusBadRequest, "%v", err)
	case errors.Is(err, pool.ErrReserved):
		agentapi.WriteError(w, http.StatusForbidden, "%v", err)
	default:
		agentapi.WriteError(w, http.StatusInternalServerError, "%v", err)
	}
}

// list is GET /v1/ipam: every allocated address with its owner, the
// router's included; empty before the node has pod CIDRs.
func (h *api) list(w http.ResponseWriter, r *http.Request) {
	out := []models.IPAMAddress{}
	for _, al := range h.a.list() {
		out = append(out, *toModel(al))
	}
	agentapi.WriteJSON(w, r, out)
}

func ownerParam(w http.ResponseWriter, r *http.Request) (string, bool) {
	q := r.URL.Query()
	switch fam := q.Get("family"); fam {
	case "", "ipv4":
	default:
		agentapi.WriteError(w, http.StatusBadRequest, "address family %q is not supported: cellium allocates IPv4 addresses only (family=ipv4)", fam)
		return "", false
	}
	owner := q.Get("owner")
	if owner == "" {
		agentapi.WriteError(w, http.StatusBadRequest, "missing query parameter owner: pass owner=<namespace>/<pod>")
		return "", false
	}
	return owner, true
}

// writeAllocError maps allocation errors to HTTP codes: 503 for what a
// retry may fix (no pod CIDR yet, pool exhausted), 409 for an address held
// by someone else, 400 for bad input.
func writeAllocError(w http.ResponseWriter, err error) {
	code := http.StatusInternalServerError
	switch {
	case errors.Is(err, ErrNoPodCIDR), errors.Is(err, pool.ErrPoolExhausted):
		code = http.StatusServiceUnavailable
	case errors.Is(err, pool.ErrInUse), errors.Is(err, pool.ErrReserved):
		code = http.StatusConflict
	case errors.Is(err, pool.ErrNotInPool), errors.Is(err, pool.ErrEmptyOwner):
		code = http.StatusBadRequest
	}
	agentapi.WriteError(w, code, "%v", err)
}

// response is the reply to an allocation: the address and the pod MTU.
func (h *api) response(al Allocation) models.IPAMResponse {
	resp := models.IPAMResponse{IPv4: toModel(al)}
	if h.mtu != nil {
		resp.MTU = h.mtu.PodMTU()
	}
	return resp
}

func toModel(al Allocation) *models.IPAMAddress {
	cidrs := make([]string, len(al.CIDRs))
	for i, c := range al.CIDRs {
		cidrs[i] = c.String()
	}
	return &models.IPAMAddress{IP: al.IP.String(), Gateway: al.Gateway.String(), CIDRs: cidrs, Owner: al.Owner}
}

// writeCreated writes v as JSON with status 201 Created.
func writeCreated(w http.ResponseWriter, v any) {
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		agentapi.WriteError(w, http.StatusInternalServerError, "encode response: %v", err)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	_, _ = w.Write(append(data, '\n'))
}
