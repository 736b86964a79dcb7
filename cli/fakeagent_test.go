package cli

import (
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	"github.com/cellium/cellium/api/v1/models"
	"github.com/cellium/cellium/cells/agentapi"
	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/statedb/labels"
)

// testNow is the clock of every command run by the tests.
var testNow = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

// fakeAgent serves canned models on a unix socket with the agent's own
// response helpers (agentapi.WriteJSON, WriteError), so the CLI sees the
// agent's wire format.
type fakeAgent struct {
	Endpoints  []models.Endpoint
	Identities []models.Identity
	Nodes      []models.Node
	Config     models.DaemonConfig
	Health     models.Health
	// Parts is what GET /v1/healthz?verbose=true returns as modules.
	Parts  []hive.HealthStatus
	Tables []models.TableInfo
	Dumps  map[string]json.RawMessage
	// Missing lists patterns ("GET /identity") the agent does not serve.
	Missing []string
	// Hang makes every request wait until the client gives up.
	Hang bool
	// Monitor is what GET /v1/monitor streams, whatever the query; the
	// stream then stays open until the client goes, or ends at once when
	// MonitorEnds is set.
	Monitor     []models.MonitorEvent
	MonitorEnds bool

	mu       sync.Mutex
	requests []string
}

// request is one request the fake agent saw, as "METHOD PATH BODY".
func (f *fakeAgent) seen() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.requests)
}

// start serves the fake agent until the test ends and returns its socket.
func (f *fakeAgent) start(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "cli")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "cellium.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(f.handler())
	srv.Listener = ln
	srv.Start()
	t.Cleanup(srv.Close)
	return sock
}

func (f *fakeAgent) handler() http.Handler {
	mux := http.NewServeMux()
	handle := func(pattern string, h http.HandlerFunc) {
		if slices.Contains(f.Missing, pattern) {
			return
		}
		method, path, _ := strings.Cut(pattern, " ")
		mux.HandleFunc(method+" "+agentapi.APIVersionPrefix+path, h)
	}
	handle("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		resp := f.Health
		if r.URL.Query().Get("verbose") == "true" {
			resp.Modules = agentapi.HealthModel(f.Parts).Modules
		}
		agentapi.WriteJSON(w, r, resp)
	})
	handle("GET /config", func(w http.ResponseWriter, r *http.Request) { agentapi.WriteJSON(w, r, f.Config) })
	handle("GET /node", func(w http.ResponseWriter, r *http.Request) { agentapi.WriteJSON(w, r, f.Nodes) })
	handle("GET /identity", func(w http.ResponseWriter, r *http.Request) { agentapi.WriteJSON(w, r, f.Identities) })
	handle("GET /identity/{id}", func(w http.ResponseWriter, r *http.Request) {
		n, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
		if err != nil {
			agentapi.WriteError(w, http.StatusBadRequest, "invalid identity %q: want a number such as 40321 or a reserved name such as host", r.PathValue("id"))
			return
		}
		for _, id := range f.Identities {
			if id.ID == n {
				agentapi.WriteJSON(w, r, id)
				return
			}
		}
		agentapi.WriteError(w, http.StatusNotFound, "identity %d not found", n)
	})
	handle("GET /endpoint", func(w http.ResponseWriter, r *http.Request) { agentapi.WriteJSON(w, r, f.Endpoints) })
	handle("GET /endpoint/{id}", func(w http.ResponseWriter, r *http.Request) {
		if i, ok := f.endpoint(w, r); ok {
			agentapi.WriteJSON(w, r, f.Endpoints[i])
		}
	})
	handle("POST /endpoint/{id}/regenerate", func(w http.ResponseWriter, r *http.Request) {
		if i, ok := f.endpoint(w, r); ok {
			agentapi.WriteJSON(w, r, f.Endpoints[i])
		}
	})
	handle("PATCH /endpoint/{id}/labels", func(w http.ResponseWriter, r *http.Request) {
		i, ok := f.endpoint(w, r)
		if !ok {
			return
		}
		var patch models.LabelsPatch
		if err := json.NewDecoder(r.Body).Decode(&patch); err != nil {
			agentapi.WriteError(w, http.StatusBadRequest, "decode labels patch: %v", err)
			return
		}
		f.mu.Lock()
		ep := &f.Endpoints[i]
		var next []string
		for _, s := range ep.Status.Identity.Labels {
			l := labels.Parse(s)
			if !slices.ContainsFunc(patch.Delete, func(d string) bool { return d == l.Key || d == l.Source+":"+l.Key }) {
				next = append(next, s)
			}
		}
		for k, v := range patch.Add {
			next = append(next, labels.Parse(k+"="+v).String())
		}
		slices.Sort(next)
		ep.Status.Identity = &models.EndpointIdentity{ID: 60001, Labels: next}
		f.mu.Unlock()
		agentapi.WriteJSON(w, r, *ep)
	})
	handle("GET /monitor", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/x-ndjson")
		enc := json.NewEncoder(w)
		for _, ev := range f.Monitor {
			_ = enc.Encode(ev)
		}
		w.(http.Flusher).Flush()
		if !f.MonitorEnds {
			<-r.Context().Done()
		}
	})
	handle("GET /statedb", func(w http.ResponseWriter, r *http.Request) { agentapi.WriteJSON(w, r, f.Tables) })
	handle("GET /statedb/{table}", func(w http.ResponseWriter, r *http.Request) {
		objs, ok := f.Dumps[r.PathValue("table")]
		if !ok {
			agentapi.WriteError(w, http.StatusNotFound, "no table %q; tables: endpoints, k8s-pods", r.PathValue("table"))
			return
		}
		agentapi.WriteJSON(w, r, objs)
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		agentapi.WriteError(w, http.StatusNotFound, "no such API path %s %s", r.Method, r.URL.Path)
	})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(strings.NewReader(string(body)))
		f.mu.Lock()
		f.requests = append(f.requests, strings.TrimSpace(r.Method+" "+r.URL.RequestURI()+" "+string(body)))
		f.mu.Unlock()
		if f.Hang {
			<-r.Context().Done()
			return
		}
		mux.ServeHTTP(w, r)
	})
}

// endpoint finds the endpoint of the {id} path value, answering 400 or 404
// as the agent does when it cannot.
func (f *fakeAgent) endpoint(w http.ResponseWriter, r *http.Request) (int, bool) {
	n, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil || n < 1 || n > 4095 {
		agentapi.WriteError(w, http.StatusBadRequest, "endpoint ID %q: want a number from 1 to 4095", r.PathValue("id"))
		return 0, false
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for i, ep := range f.Endpoints {
		if ep.ID == n {
			return i, true
		}
	}
	agentapi.WriteError(w, http.StatusNotFound, "endpoint not found: ID %d", n)
	return 0, false
}

// asModel converts a CEP status to the API's type the way the JSON does:
// the two types have the same JSON.
func asModel(st ciliumv2.EndpointStatus) models.EndpointStatus {
	data, err := json.Marshal(st)
	if err != nil {
		panic(err)
	}
	var out models.EndpointStatus
	if err := json.Unmarshal(data, &out); err != nil {
		panic(err)
	}
	return out
}

// webStatus is the status of the pod default/web-0 with every field of the
// CEP status set, so that a round trip loses nothing unnoticed.
func webStatus() ciliumv2.EndpointStatus {
	return ciliumv2.EndpointStatus{
		ID: 1090,
		Controllers: ciliumv2.ControllerList{{Name: "sync-to-k8s-ciliumendpoint (1090)", UUID: "5b0e",
			Configuration: &ciliumv2.ControllerConfiguration{ErrorRetry: true, Interval: 10_000_000_000},
			Status:        &ciliumv2.ControllerStatusStatus{SuccessCount: 3, LastSuccessTimestamp: "2026-11-29T11:59:00Z"}}},
		Encryption: ciliumv2.EncryptionSpec{Key: 2},
		ExternalIdentifiers: &ciliumv2.EndpointIdentifiers{
			CNIAttachmentID: "4f2c9a:eth0", ContainerID: "4f2c9a", PodName: "default/web-0",
		},
		Health: &ciliumv2.EndpointHealth{Bpf: ciliumv2.EndpointHealthDisabled, Policy: ciliumv2.EndpointHealthDisabled,
			OverallHealth: ciliumv2.EndpointHealthOK, Connected: true},
		Identity: &ciliumv2.EndpointIdentity{ID: 48213, Labels: []string{
			"k8s:app=web",
			"k8s:io.cilium.k8s.namespace.labels.kubernetes.io/metadata.name=default",
			"k8s:io.cilium.k8s.policy.cluster=default",
			"k8s:io.cilium.k8s.policy.serviceaccount=default",
			"k8s:io.kubernetes.pod.namespace=default",
		}},
		Log: []*ciliumv2.EndpointStatusChange{{Code: "ok", Message: "Identity resolved", State: "ready", Timestamp: "2026-11-29T11:55:00Z"}},
		Networking: &ciliumv2.EndpointNetworking{
			Addressing: ciliumv2.AddressPairList{{IPV4: "10.0.0.17"}},
			NodeIP:     "192.168.1.11",
		},
		Policy: &ciliumv2.EndpointPolicy{
			Ingress: &ciliumv2.EndpointPolicyDirection{Enforcing: true, State: ciliumv2.EndpointPolicyStateEnforcing,
				Allowed: ciliumv2.AllowedIdentityList{{Identity: 60001, DestPort: 80, Protocol: 6,
					IdentityLabels: map[string]string{"k8s:app": "db"}}}},
			Egress: &ciliumv2.EndpointPolicyDirection{Enforcing: false, State: ciliumv2.EndpointPolicyStateDisabled},
		},
		State:          ciliumv2.EndpointStateReady,
		NamedPorts:     ciliumv2.NamedPorts{{Name: "http", Port: 8080, Protocol: "TCP"}},
		ServiceAccount: "default",
	}
}

// newFakeAgent returns a healthy agent of node-a with four endpoints
// (served out of order), five identities and two nodes.
func newFakeAgent() *fakeAgent {
	web := webStatus()
	since := testNow.Add(-90 * time.Minute)
	f := &fakeAgent{
		Endpoints: []models.Endpoint{
			{ID: 3071, Status: asModel(ciliumv2.EndpointStatus{ID: 3071, State: ciliumv2.EndpointStateWaitingForIdentity,
				Networking: &ciliumv2.EndpointNetworking{Addressing: ciliumv2.AddressPairList{{IPV4: "10.0.0.23"}}, NodeIP: "192.168.1.11"}})},
			{ID: 1090, Spec: &models.EndpointChangeRequest{ContainerID: "4f2c9a", ContainerInterfaceName: "eth0",
				K8sNamespace: "default", K8sPodName: "web-0", InterfaceName: "lxc1a2b3c4d5e6f", InterfaceIndex: 17,
				Addressing: models.AddressPair{IPV4: "10.0.0.17"}}, Status: asModel(web),
				Policy: &models.EndpointPolicyRevisions{Realized: models.EndpointPolicyRevision{PolicyRevision: 12}, Spec: models.EndpointPolicyRevision{PolicyRevision: 12}}},
			{ID: 142, Status: asModel(ciliumv2.EndpointStatus{ID: 142, State: ciliumv2.EndpointStateReady,
				Identity:   &ciliumv2.EndpointIdentity{ID: 4, Labels: []string{"reserved:health"}},
				Networking: &ciliumv2.EndpointNetworking{Addressing: ciliumv2.AddressPairList{{IPV4: "10.0.0.91"}}, NodeIP: "192.168.1.11"}}),
				Policy: &models.EndpointPolicyRevisions{Realized: models.EndpointPolicyRevision{PolicyRevision: 11}, Spec: models.EndpointPolicyRevision{PolicyRevision: 12}}},
			{ID: 7, Status: asModel(ciliumv2.EndpointStatus{ID: 7, State: ciliumv2.EndpointStateRestoring,
				Identity: &ciliumv2.EndpointIdentity{ID: 48213, Labels: web.Identity.Labels},
				Policy: &ciliumv2.EndpointPolicy{
					Ingress: &ciliumv2.EndpointPolicyDirection{State: ciliumv2.EndpointPolicyStateNonEnforcing},
					Egress:  &ciliumv2.EndpointPolicyDirection{State: "bogus"},
				}})},
		},
		Identities: []models.Identity{
			{ID: 48213, Labels: web.Identity.Labels},
			{ID: 1, Labels: []string{"reserved:host"}},
			{ID: 2, Labels: []string{"reserved:world"}},
			{ID: 4, Labels: []string{"reserved:health"}},
			{ID: 60001, Labels: []string{"k8s:io.kubernetes.pod.namespace=default", "k8s:app=db"}},
		},
		Nodes: []models.Node{
			{Name: "node-b", Addresses: []models.NodeAddress{{Type: "CiliumInternalIP", IP: "10.0.1.1"}, {Type: "InternalIP", IP: "192.168.1.12"}},
				PodCIDRs: []string{"10.0.1.0/24"}, HealthIPv4: "10.0.1.92", Health: "unreachable"},
			{Name: "node-a", Local: true, Addresses: []models.NodeAddress{{Type: "InternalIP", IP: "fd00::11"}, {Type: "InternalIP", IP: "192.168.1.11"}},
				PodCIDRs: []string{"fd00:10::/64", "10.0.0.0/24"}, HealthIPv4: "10.0.0.91"},
			{Name: "node-c", Health: "unknown", Refused: []string{`spec.ipam.podCIDRs[0] "10.0.1.0/24": duplicate-pod-cidr (held by node node-b)`}},
		},
		Config: models.DaemonConfig{MTU: 1500, NodeName: "node-a", Options: map[string]string{
			"debug": "false", "k8s-client-qps": "10", "k8s-kubeconfig-path": "", "mtu": "1500",
			"socket-path": "/var/run/cellium/cellium.sock",
		}},
		Health: agentapi.HealthModel([]hive.HealthStatus{
			{ID: "agent-api", Module: "agent-api", Level: hive.LevelOK, Message: "serving", Since: since},
			{ID: "cepsync", Module: "cepsync", Level: hive.LevelOK, Message: "in sync", Since: since},
			{ID: "endpoint-manager", Module: "endpoint-manager", Level: hive.LevelOK, Since: since},
			{ID: "write-cni-conf", Module: "write-cni-conf", Level: hive.LevelStopped, Message: "wrote /etc/cni/net.d/05-cellium.conflist", Since: since},
		}),
		Parts: []hive.HealthStatus{
			{ID: "agent-api.server", Module: "agent-api", Level: hive.LevelOK, Message: "serving", Since: since},
			{ID: "cepsync.reconciler", Module: "cepsync", Level: hive.LevelOK, Message: "in sync", Since: testNow.Add(-3 * time.Second)},
			{ID: "endpoint-manager.restore", Module: "endpoint-manager", Level: hive.LevelStopped, Message: "restored 3 endpoints", Since: since},
		},
		Tables: []models.TableInfo{
			{Name: "endpoints", Objects: 4, Initialized: true, Indexes: []string{"id", "container-id", "pod"}},
			{Name: "k8s-pods", Objects: 0, Initialized: false, Pending: []string{"k8s-pods-reflector"}, Indexes: []string{"name"}},
		},
		Dumps: map[string]json.RawMessage{
			"endpoints": json.RawMessage(`[{"id":142,"state":"ready"},{"id":1090,"state":"ready","pod":"default/web-0"}]`),
			"lb-frontends": json.RawMessage(`[` +
				`{"address":{"addr":"10.96.0.10","port":53,"proto":17},"service":"kube-system/kube-dns","port-name":"dns","backends":[{"addr":"10.0.1.7","port":53,"proto":17},{"addr":"10.0.2.9","port":53,"proto":17}],"backend-ids":[3,4],"session-affinity":true,"affinity-timeout":10800,"status":{"kind":"Done","updated-at":"2026-12-01T05:00:00Z"}},` +
				`{"address":{"addr":"10.96.0.1","port":443,"proto":6},"service":"default/kubernetes","port-name":"https","backends":[{"addr":"192.168.56.11","port":6443,"proto":6}],"backend-ids":[1],"status":{"kind":"Done","updated-at":"2026-12-01T05:00:00Z"}},` +
				`{"address":{"addr":"10.96.7.7","port":80,"proto":6},"service":"default/web","backends":[],"backend-ids":[],"status":{"kind":"Done","updated-at":"2026-12-01T05:00:00Z"}}]`),
			"lb-service-states": json.RawMessage(`[` +
				`{"owner":"default/web","state":"Degraded","reason":"InvalidEndpoints","message":"skipped endpoints: EndpointSlice web-abc: endpoint address \"10.0.0.999\" is not an IP address"},` +
				`{"owner":"default/big","state":"Refused","reason":"LBMapFull","message":"its 40 frontends with their backends take 80 entries of the services map, 18 are free of --bpf-lb-map-max=20: none of its frontends is served (raise --bpf-lb-map-max, or make the Service smaller)"}]`),
			"ipcache": json.RawMessage(`[` +
				`{"prefix":"10.0.1.7/32","identity":48213,"source":"endpoint","owner":"endpoint 1090","status":{"kind":"Done","updated-at":"2026-12-01T05:00:00Z"}},` +
				`{"prefix":"10.0.2.9/32","identity":51234,"source":"cilium-endpoint","owner":"cep default/db-0","host-ip":"192.168.56.12","status":{"kind":"Done","updated-at":"2026-12-01T05:00:00Z"}},` +
				`{"prefix":"10.0.2.0/24","identity":2,"source":"node-cidr","owner":"node node-b","host-ip":"192.168.56.12","status":{"kind":"Done","updated-at":"2026-12-01T05:00:00Z"}},` +
				`{"prefix":"192.168.56.11/32","identity":1,"source":"host","owner":"local-node","status":{"kind":"Done","updated-at":"2026-12-01T05:00:00Z"}},` +
				`{"prefix":"203.0.113.0/24","identity":16777217,"source":"policy-cidr","owner":"cidr 203.0.113.0/24","status":{"kind":"Error","error":"update ipcache 203.0.113.0/24: no space left","updated-at":"2026-12-01T05:00:00Z"}}]`),
		},
	}
	f.Health.ClusterHealth = &models.ClusterHealth{Reachable: 1, Total: 1, Probes: []models.HealthProbe{{
		Name: "health-endpoint", IP: "10.0.0.12", Reachable: true, Latency: 412 * time.Microsecond,
		LastProbed: testNow.Add(-4 * time.Second),
	}}}
	probed, reached := testNow.Add(-3*time.Second), testNow.Add(-33*time.Second)
	f.Health.ClusterHealth.Total, f.Health.ClusterHealth.Reachable = 3, 2
	f.Health.ClusterHealth.Nodes = []models.NodeHealth{
		{Name: "node-b", Status: "unreachable", Paths: []models.NodePathHealth{
			{Type: "endpoint", Protocol: "http", IP: "10.0.1.92", Probed: true, LastProbed: &probed, LastReachable: &reached,
				Error: "GET 10.0.1.92:4240/hello: dial tcp 10.0.1.92:4240: i/o timeout"},
			{Type: "endpoint", Protocol: "icmp", IP: "10.0.1.92", Probed: true, LastProbed: &probed, LastReachable: &reached,
				Error: "ping 10.0.1.92: no echo reply: context deadline exceeded"},
			{Type: "node", Protocol: "icmp", IP: "192.168.1.12", Probed: true, Reachable: true, Latency: 310 * time.Microsecond,
				LastProbed: &probed, LastReachable: &probed},
		}},
		{Name: "node-d", Status: "reachable", Paths: []models.NodePathHealth{
			{Type: "endpoint", Protocol: "http", IP: "10.0.3.92", Probed: true, Reachable: true, Latency: 1200 * time.Microsecond, LastProbed: &probed, LastReachable: &probed},
			{Type: "endpoint", Protocol: "icmp", IP: "10.0.3.92", Probed: true, Reachable: true, Latency: 280 * time.Microsecond, LastProbed: &probed, LastReachable: &probed},
			{Type: "node", Protocol: "icmp", IP: "192.168.1.14", Probed: true, Reachable: true, Latency: 250 * time.Microsecond, LastProbed: &probed, LastReachable: &probed},
		}},
	}
	return f
}
