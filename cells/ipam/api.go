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
	a     *allocator
	mtu   PodMTU
	wait  time.Duration
	grace time.Duration
}

// apiParams are what the API handlers need.
type apiParams struct {
	hive.In
	Allocator *allocator
	Config    Config
	MTU       PodMTU `optional:"true"`
}

func apiHandlers(p apiParams) agentapi.HandlersOut {
	h := &api{a: p.Allocator, mtu: p.MTU, wait: apiWaitTimeout, grace: p.Config.IPAMGCGrace}
	return agentapi.HandlersOut{Handlers: []agentapi.Handler{
		{Pattern: "POST /ipam", Handler: h.allocateNext},
		{Pattern: "POST /ipam/{ip}", Handler: h.allocateIP},
		{Pattern: "DELETE /ipam/{ip}", Handler: h.release},
		{Pattern: "GET /ipam", Handler: h.list},
		{Pattern: "GET /ipam/gc", Handler: h.gc},
	}}
}

// allocateNext is POST /v1/ipam?owner=<namespace>/<pod>[&container-id=<id>][&family=ipv4]:
// the next free address, answered with 201 and a models.IPAMResponse that
// carries the pod MTU too. The allocation records both the owner and the
// container ID.
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

// allocateIP is POST /v1/ipam/{ip}?owner=...[&container-id=...]: claim a
// given address.
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

// release is DELETE /v1/ipam/{ip}[?container-id=<id>]. Without
// container-id it frees the address whoever holds it (the admin's tool)
// and releasing a free address succeeds. With it, the address is freed
// only if that container holds it: 409 naming the holder otherwise, 404
// when it is free.
func (h *api) release(w http.ResponseWriter, r *http.Request) {
	ip, err := netip.ParseAddr(r.PathValue("ip"))
	if err != nil {
		agentapi.WriteError(w, http.StatusBadRequest, "invalid IP address %q: %v", r.PathValue("ip"), err)
		return
	}
	if cid := r.URL.Query().Get("container-id"); cid != "" {
		switch released, err := h.a.ReleaseOwned(ip, Owner{ContainerID: cid}); {
		case errors.Is(err, ErrNotOwner):
			agentapi.WriteError(w, http.StatusConflict, "%v; not released", err)
		case err != nil:
			agentapi.WriteError(w, http.StatusInternalServerError, "%v", err)
		case !released:
			agentapi.WriteError(w, http.StatusNotFound, "%v is not allocated", ip)
		default:
			w.WriteHeader(http.StatusOK)
		}
		return
	}
	if err := h.a.Release(ip); err != nil {
		releaseErrorCodes.Write(w, err)
		return
	}
	w.WriteHeader(http.StatusOK)
}

// releaseErrorCodes are the codes of DELETE /v1/ipam/{ip}.
var releaseErrorCodes = agentapi.ErrorCodes{
	{Err: pool.ErrNotInPool, Code: http.StatusBadRequest},
	{Err: pool.ErrReserved, Code: http.StatusForbidden},
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

// gc is GET /v1/ipam/gc: the garbage collector's grace and the addresses
// it freed last.
func (h *api) gc(w http.ResponseWriter, r *http.Request) {
	out := models.IPAMGC{Grace: h.grace.String(), ReleasedTotal: h.a.gcTotal.Load(), Released: []models.IPAMReleased{}}
	for _, rel := range h.a.collected() {
		out.Released = append(out.Released, models.IPAMReleased{IPAMAddress: *toModel(rel.Allocation), ReleasedAt: rel.At.UTC().Format(time.RFC3339)})
	}
	agentapi.WriteJSON(w, r, out)
}

func ownerParam(w http.ResponseWriter, r *http.Request) (Owner, bool) {
	q := r.URL.Query()
	switch fam := q.Get("family"); fam {
	case "", "ipv4":
	default:
		agentapi.WriteError(w, http.StatusBadRequest, "address family %q is not supported: cellium allocates IPv4 addresses only (family=ipv4)", fam)
		return Owner{}, false
	}
	owner := q.Get("owner")
	if owner == "" {
		agentapi.WriteError(w, http.StatusBadRequest, "missing query parameter owner: pass owner=<namespace>/<pod>")
		return Owner{}, false
	}
	if len(owner) > models.MaxOwnerLen {
		agentapi.WriteError(w, http.StatusBadRequest, "query parameter owner is %d bytes long, the limit is %d", len(owner), models.MaxOwnerLen)
		return Owner{}, false
	}
	cid := q.Get("container-id")
	if len(cid) > models.MaxContainerIDLen {
		agentapi.WriteError(w, http.StatusBadRequest, "query parameter container-id is %d bytes long, the limit is %d", len(cid), models.MaxContainerIDLen)
		return Owner{}, false
	}
	return Owner{Name: owner, ContainerID: cid}, true
}

// allocErrorCodes map allocation errors to HTTP codes: 503 for what a
// retry may fix (no pod CIDR yet, pool exhausted), 409 for an address held
// by someone else, 400 for bad input.
var allocErrorCodes = agentapi.ErrorCodes{
	{Err: ErrNoPodCIDR, Code: http.StatusServiceUnavailable},
	{Err: pool.ErrPoolExhausted, Code: http.StatusServiceUnavailable},
	{Err: pool.ErrInUse, Code: http.StatusConflict},
	{Err: pool.ErrReserved, Code: http.StatusConflict},
	{Err: pool.ErrNotInPool, Code: http.StatusBadRequest},
	{Err: pool.ErrEmptyOwner, Code: http.StatusBadRequest},
}

func writeAllocError(w http.ResponseWriter, err error) { allocErrorCodes.Write(w, err) }

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
	out := &models.IPAMAddress{IP: al.IP.String(), Gateway: al.Gateway.String(), CIDRs: cidrs, Owner: al.Owner, ContainerID: al.ContainerID}
	if !al.Since.IsZero() {
		out.Since = al.Since.UTC().Format(time.RFC3339)
	}
	return out
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
