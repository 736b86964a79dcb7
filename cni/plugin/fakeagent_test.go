package plugin

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"testing"

	"github.com/cellium/cellium/api/v1/models"
)

// fakeAgent implements the agent API the plugin uses, in memory, on a unix
// socket in a temporary directory. Addresses come from 10.210.0.0/16 with
// the router at 10.210.0.1.
type fakeAgent struct {
	socket string

	mu        sync.Mutex
	mtu       int
	health    string
	ips       map[string]string           // allocated IP -> owner
	ipCIDs    map[string]string           // allocated IP -> container ID, if sent
	endpoints map[string]*models.Endpoint // by container ID
	nextID    int64
	nextIP    int
	calls     []string // "METHOD path", in order
	// putFailure, when its Code is not 0, is the reply to every PUT.
	putFailure models.Error
	// putDrop makes every PUT close the connection without a reply, as an
	// agent that crashes while building the endpoint.
	putDrop bool
	// noIPAMMTU makes POST /v1/ipam answer without mtu, as older agents.
	noIPAMMTU bool
	// onPut, when set, runs before PUT /v1/endpoint answers (as the agent
	// programs the endpoint's route before it does); its error fails the PUT.
	onPut func(req models.EndpointChangeRequest) error
}

const (
	fakeGateway = "10.210.0.1"
	fakeMTU     = 1450
)

// newFakeAgent starts a fake agent that stops when t ends.
func newFakeAgent(t testing.TB) *fakeAgent {
	t.Helper()
	dir, err := os.MkdirTemp("", "cni")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	a := &fakeAgent{
		socket:    filepath.Join(dir, "agent.sock"),
		mtu:       fakeMTU,
		health:    models.HealthStateOK,
		ips:       map[string]string{},
		endpoints: map[string]*models.Endpoint{},
		ipCIDs:    map[string]string{},
		nextID:    1,
		nextIP:    2,
	}
	ln, err := net.Listen("unix", a.socket)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/config", a.getConfig)
	mux.HandleFunc("GET /v1/healthz", a.getHealthz)
	mux.HandleFunc("POST /v1/ipam", a.postIPAM)
	mux.HandleFunc("DELETE /v1/ipam/{ip}", a.deleteIPAM)
	mux.HandleFunc("PUT /v1/endpoint", a.putEndpoint)
	mux.HandleFunc("DELETE /v1/endpoint", a.deleteEndpoint)
	mux.HandleFunc("GET /v1/endpoint", a.listEndpoints)
	mux.HandleFunc("GET /v1/endpoint/{id}", a.getEndpoint)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, "no such API path %s %s", r.Method, r.URL.Path)
	})
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		a.mu.Lock()
		a.calls = append(a.calls, r.Method+" "+r.URL.RequestURI())
		a.mu.Unlock()
		mux.ServeHTTP(w, r)
	}))
	srv.Listener = ln
	srv.Start()
	t.Cleanup(srv.Close)
	return a
}

func writeError(w http.ResponseWriter, code int, format string, args ...any) {
	writeJSON(w, code, models.Error{Code: code, Message: fmt.Sprintf(format, args...)})
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

func (a *fakeAgent) getConfig(w http.ResponseWriter, _ *http.Request) {
	a.mu.Lock()
	defer a.mu.Unlock()
	writeJSON(w, http.StatusOK, models.DaemonConfig{MTU: a.mtu, NodeName: "test-node"})
}

func (a *fakeAgent) getHealthz(w http.ResponseWriter, _ *http.Request) {
	a.mu.Lock()
	defer a.mu.Unlock()
	writeJSON(w, http.StatusOK, models.Health{State: a.health})
}

func (a *fakeAgent) postIPAM(w http.ResponseWriter, r *http.Request) {
	owner := r.URL.Query().Get("owner")
	if owner == "" {
		writeError(w, http.StatusBadRequest, "owner is required")
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	for range 65000 {
		n := a.nextIP
		a.nextIP++
		if a.nextIP > 65000 {
			a.nextIP = 2
		}
		ip := fmt.Sprintf("10.210.%d.%d", n/250, n%250+2)
		if ip == fakeGateway {
			continue
		}
		if _, used := a.ips[ip]; used {
			continue
		}
		a.ips[ip] = owner
		if cid := r.URL.Query().Get("container-id"); cid != "" {
			a.ipCIDs[ip] = cid
		}
		resp := models.IPAMResponse{IPv4: &models.IPAMAddress{
			IP: ip, Gateway: fakeGateway, CIDRs: []string{"10.210.0.0/16"}, Owner: owner,
		}}
		if !a.noIPAMMTU {
			resp.MTU = a.mtu
		}
		writeJSON(w, http.StatusCreated, resp)
		return
	}
	writeError(w, http.StatusInternalServerError, "pool exhausted")
}

func (a *fakeAgent) deleteIPAM(w http.ResponseWriter, r *http.Request) {
	ip := r.PathValue("ip")
	a.mu.Lock()
	defer a.mu.Unlock()
	if _, ok := a.ips[ip]; !ok {
		writeError(w, http.StatusNotFound, "IP %s is not allocated", ip)
		return
	}
	if cid := r.URL.Query().Get("container-id"); cid != "" && a.ipCIDs[ip] != cid {
		writeError(w, http.StatusConflict, "IP %s is held by container %q", ip, a.ipCIDs[ip])
		return
	}
	delete(a.ips, ip)
	delete(a.ipCIDs, ip)
	w.WriteHeader(http.StatusOK)
}

func (a *fakeAgent) putEndpoint(w http.ResponseWriter, r *http.Request) {
	var req models.EndpointChangeRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		writeError(w, http.StatusBadRequest, "decode: %v", err)
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.putFailure.Code != 0 {
		writeJSON(w, a.putFailure.Code, a.putFailure)
		return
	}
	if a.putDrop {
		if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
			conn.Close()
		}
		return
	}
	owner := req.K8sNamespace + "/" + req.K8sPodName
	switch {
	case req.ContainerID == "" || req.ContainerInterfaceName == "" || req.K8sNamespace == "" || req.K8sPodName == "":
		writeError(w, http.StatusBadRequest, "container and pod are required: %+v", req)
		return
	case req.InterfaceName == "" || req.InterfaceIndex <= 0 || req.MAC == "" || req.HostMAC == "" || req.NetnsPath == "":
		writeError(w, http.StatusBadRequest, "interface is required: %+v", req)
		return
	case !req.SyncBuildEndpoint:
		writeError(w, http.StatusBadRequest, "the plugin must ask for sync-build-endpoint")
		return
	case a.ips[req.Addressing.IPV4] != owner:
		writeError(w, http.StatusBadRequest, "IP %s is not allocated to %s", req.Addressing.IPV4, owner)
		return
	}
	if _, ok := a.endpoints[req.ContainerID]; ok {
		writeError(w, http.StatusConflict, "endpoint for container %s exists", req.ContainerID)
		return
	}
	if a.onPut != nil {
		if err := a.onPut(req); err != nil {
			writeError(w, http.StatusInternalServerError, "build endpoint: %v", err)
			return
		}
	}
	ep := &models.Endpoint{
		ID:   a.nextID,
		Spec: &req,
		Status: models.EndpointStatus{
			ID:    a.nextID,
			State: models.EndpointStateReady,
			ExternalIdentifiers: &models.EndpointIdentifiers{
				ContainerID: req.ContainerID,
				PodName:     owner,
			},
			Networking: &models.EndpointNetworking{
				Addressing: models.AddressPairList{{IPV4: req.Addressing.IPV4}},
			},
		},
	}
	a.nextID++
	a.endpoints[req.ContainerID] = ep
	writeJSON(w, http.StatusCreated, ep)
}

// deleteEndpoint deletes the container's endpoint and releases the
// addresses allocated to the container, as the agent does; with ip=, only
// the endpoint that has it and only that address.
func (a *fakeAgent) deleteEndpoint(w http.ResponseWriter, r *http.Request) {
	cid := r.URL.Query().Get("container-id")
	onlyIP := r.URL.Query().Get("ip")
	a.mu.Lock()
	defer a.mu.Unlock()
	did := false
	if ep, ok := a.endpoints[cid]; ok && (onlyIP == "" || ep.Spec != nil && ep.Spec.Addressing.IPV4 == onlyIP) {
		delete(a.endpoints, cid)
		if ep.Spec != nil {
			delete(a.ips, ep.Spec.Addressing.IPV4)
			delete(a.ipCIDs, ep.Spec.Addressing.IPV4)
		}
		did = true
	}
	for ip, c := range a.ipCIDs {
		if c == cid && (onlyIP == "" || ip == onlyIP) {
			delete(a.ips, ip)
			delete(a.ipCIDs, ip)
			did = true
		}
	}
	if !did {
		writeError(w, http.StatusNotFound, "container %s has no endpoint and no address", cid)
		return
	}
	w.WriteHeader(http.StatusOK)
}

func (a *fakeAgent) listEndpoints(w http.ResponseWriter, _ *http.Request) {
	a.mu.Lock()
	defer a.mu.Unlock()
	eps := []models.Endpoint{}
	for _, ep := range a.endpoints {
		eps = append(eps, *ep)
	}
	slices.SortFunc(eps, func(x, y models.Endpoint) int { return int(x.ID - y.ID) })
	writeJSON(w, http.StatusOK, eps)
}

func (a *fakeAgent) getEndpoint(w http.ResponseWriter, r *http.Request) {
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil {
		writeError(w, http.StatusBadRequest, "bad id")
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, ep := range a.endpoints {
		if ep.ID == id {
			writeJSON(w, http.StatusOK, ep)
			return
		}
	}
	writeError(w, http.StatusNotFound, "no endpoint %d", id)
}

// addEndpoint records an endpoint as if the agent had made it (the health
// endpoint, or one whose ADD the runtime forgot).
func (a *fakeAgent) addEndpoint(ep models.Endpoint) {
	a.mu.Lock()
	defer a.mu.Unlock()
	ep.ID = a.nextID
	a.nextID++
	cid := endpointContainerID(&ep)
	a.endpoints[cid] = &ep
}

// state returns copies of the allocated IPs and the endpoints' container
// IDs.
func (a *fakeAgent) state() (ips map[string]string, containers []string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	ips = make(map[string]string, len(a.ips))
	for k, v := range a.ips {
		ips[k] = v
	}
	for cid := range a.endpoints {
		containers = append(containers, cid)
	}
	slices.Sort(containers)
	return ips, containers
}

func (a *fakeAgent) endpoint(containerID string) *models.Endpoint {
	a.mu.Lock()
	defer a.mu.Unlock()
	if ep, ok := a.endpoints[containerID]; ok {
		cp := *ep
		return &cp
	}
	return nil
}

// callLog returns and clears the calls seen so far, each as
// "METHOD path?query".
func (a *fakeAgent) callLog() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	c := a.calls
	a.calls = nil
	return c
}

func (a *fakeAgent) set(f func(a *fakeAgent)) {
	a.mu.Lock()
	defer a.mu.Unlock()
	f(a)
}

// assertEmpty fails t unless no address is allocated and no endpoint
// exists.
func (a *fakeAgent) assertEmpty(t testing.TB) {
	t.Helper()
	ips, eps := a.state()
	if len(ips) != 0 || len(eps) != 0 {
		t.Errorf("agent still holds IPs %v and endpoints %v", ips, eps)
	}
}
