package client

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/cellium/cellium/api/v1/models"
	"github.com/cellium/cellium/cells/agentapi"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// socketDir returns a short temporary directory: a unix socket path must
// fit in 108 bytes, which t.TempDir() under a long test name may not.
func socketDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "cc")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// request is what the fake server saw.
type request struct {
	Method, Path, Query, ContentType string
	Body                             string
}

// serve starts handler on a unix socket and returns a client of it. Every
// request is recorded in *seen.
func serve(t *testing.T, handler http.HandlerFunc) (*Client, *[]request) {
	t.Helper()
	sock := filepath.Join(socketDir(t), "agent.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var seen []request
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		mu.Lock()
		seen = append(seen, request{r.Method, r.URL.Path, r.URL.RawQuery, r.Header.Get("Content-Type"), string(body)})
		mu.Unlock()
		handler(w, r)
	}))
	srv.Listener = ln
	srv.Start()
	c := New(sock)
	t.Cleanup(func() {
		c.Close()
		srv.Close()
	})
	return c, &seen
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func TestDefaultSocketPathMatchesAgent(t *testing.T) {
	if DefaultSocketPath != agentapi.DefaultSocketPath {
		t.Fatalf("client.DefaultSocketPath %q != agentapi.DefaultSocketPath %q", DefaultSocketPath, agentapi.DefaultSocketPath)
	}
	if got := New("").SocketPath(); got != DefaultSocketPath {
		t.Fatalf("New(\"\").SocketPath() = %q", got)
	}
}

// TestMethods checks each typed method's request (method, path, query,
// body) and the decoding of its reply.
func TestMethods(t *testing.T) {
	ep := models.Endpoint{ID: 7, Status: models.EndpointStatus{ID: 7, State: models.EndpointStateReady}}
	replies := map[string]any{
		"GET /v1/healthz":                models.Health{State: "Ok", Modules: []models.ModuleHealth{{ID: "agent-api", Module: "agent-api", Level: "ok"}}},
		"GET /v1/config":                 models.DaemonConfig{MTU: 1450, NodeName: "n1"},
		"POST /v1/ipam":                  models.IPAMResponse{IPv4: &models.IPAMAddress{IP: "10.0.0.5", Gateway: "10.0.0.1", CIDRs: []string{"10.0.0.0/24"}}, MTU: 1450},
		"DELETE /v1/ipam/10.0.0.5":       nil,
		"PUT /v1/endpoint":               ep,
		"DELETE /v1/endpoint":            nil,
		"GET /v1/endpoint":               []models.Endpoint{ep},
		"GET /v1/endpoint/7":             ep,
		"PATCH /v1/endpoint/7/labels":    map[string]string{"ignored": "yes"},
		"POST /v1/endpoint/7/regenerate": nil,
		"GET /v1/identity":               []models.Identity{{ID: 1, Labels: []string{"reserved:host"}}},
		"GET /v1/identity/1":             models.Identity{ID: 1, Labels: []string{"reserved:host"}},
		"GET /v1/node":                   []models.Node{{Name: "n1", Local: true}},
		"GET /v1/statedb/endpoints":      []map[string]int{{"id": 7}},
	}
	c, seen := serve(t, func(w http.ResponseWriter, r *http.Request) {
		reply, ok := replies[r.Method+" "+r.URL.Path]
		if !ok {
			writeJSON(w, http.StatusNotFound, models.Error{Code: 404, Message: "no route"})
			return
		}
		status := http.StatusOK
		if r.Method == http.MethodPut {
			status = http.StatusCreated
		}
		if reply == nil {
			w.WriteHeader(status)
			return
		}
		writeJSON(w, status, reply)
	})
	ctx := context.Background()
	check := func(name string, got, want any) {
		t.Helper()
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s = %#v, want %#v", name, got, want)
		}
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}

	h, err := c.GetHealthz(ctx)
	must(err)
	check("GetHealthz", *h, replies["GET /v1/healthz"])
	cfg, err := c.GetConfig(ctx)
	must(err)
	check("GetConfig", *cfg, replies["GET /v1/config"])
	ipam, err := c.AllocateIP(ctx, "default/pod-a", "c1")
	must(err)
	check("AllocateIP", *ipam, replies["POST /v1/ipam"])
	must(c.ReleaseIP(ctx, "10.0.0.5"))
	req := &models.EndpointChangeRequest{ContainerID: "c1", K8sNamespace: "default", K8sPodName: "pod-a", SyncBuildEndpoint: true}
	got, err := c.PutEndpoint(ctx, req)
	must(err)
	check("PutEndpoint", *got, ep)
	found, err := c.DeleteEndpointByContainerID(ctx, "c1")
	must(err)
	check("DeleteEndpointByContainerID found", found, true)
	eps, err := c.GetEndpoints(ctx)
	must(err)
	check("GetEndpoints", eps, []models.Endpoint{ep})
	got, err = c.GetEndpoint(ctx, "7")
	must(err)
	check("GetEndpoint", *got, ep)
	must(c.PatchEndpointLabels(ctx, "7", &models.LabelsPatch{Add: map[string]string{"k8s:app": "web"}}))
	must(c.RegenerateEndpoint(ctx, "7"))
	ids, err := c.GetIdentities(ctx)
	must(err)
	check("GetIdentities", ids, replies["GET /v1/identity"])
	id, err := c.GetIdentity(ctx, "1")
	must(err)
	check("GetIdentity", *id, replies["GET /v1/identity/1"])
	nodes, err := c.GetNodes(ctx)
	must(err)
	check("GetNodes", nodes, replies["GET /v1/node"])
	tbl, err := c.GetStatedbTable(ctx, "endpoints")
	must(err)
	check("GetStatedbTable", strings.TrimSpace(string(tbl)), `[{"id":7}]`)

	reqBody, _ := json.Marshal(req)
	want := []request{
		{Method: "GET", Path: "/v1/healthz"},
		{Method: "GET", Path: "/v1/config"},
		{Method: "POST", Path: "/v1/ipam", Query: "container-id=c1&owner=default%2Fpod-a"},
		{Method: "DELETE", Path: "/v1/ipam/10.0.0.5"},
		{Method: "PUT", Path: "/v1/endpoint", ContentType: "application/json", Body: string(reqBody)},
		{Method: "DELETE", Path: "/v1/endpoint", Query: "container-id=c1"},
		{Method: "GET", Path: "/v1/endpoint"},
		{Method: "GET", Path: "/v1/endpoint/7"},
		{Method: "PATCH", Path: "/v1/endpoint/7/labels", ContentType: "application/json", Body: `{"add":{"k8s:app":"web"}}`},
		{Method: "POST", Path: "/v1/endpoint/7/regenerate"},
		{Method: "GET", Path: "/v1/identity"},
		{Method: "GET", Path: "/v1/identity/1"},
		{Method: "GET", Path: "/v1/node"},
		{Method: "GET", Path: "/v1/statedb/endpoints"},
	}
	if !reflect.DeepEqual(*seen, want) {
		t.Errorf("requests:\n got %+v\nwant %+v", *seen, want)
	}
}

func TestAPIErrors(t *testing.T) {
	c, _ := serve(t, func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/v1/ipam":
			writeJSON(w, http.StatusServiceUnavailable, models.Error{Code: 503, Message: "IPAM not ready: no pod CIDR yet"})
		case "/v1/config":
			w.WriteHeader(http.StatusInternalServerError)
			_, _ = io.WriteString(w, "plain text failure\n")
		default:
			writeJSON(w, http.StatusNotFound, models.Error{Code: 404, Message: "not found"})
		}
	})
	ctx := context.Background()

	_, err := c.AllocateIP(ctx, "ns/p", "")
	var ae *APIError
	if !errors.As(err, &ae) || ae.StatusCode != 503 || ae.Method != "POST" || ae.Path != "/v1/ipam" {
		t.Fatalf("AllocateIP error = %#v, want *APIError 503", err)
	}
	var me *models.Error
	if !errors.As(err, &me) || me.Message != "IPAM not ready: no pod CIDR yet" {
		t.Fatalf("errors.As(*models.Error) = %v", me)
	}
	if StatusCode(err) != 503 || IsNotFound(err) || errors.Is(err, ErrAgentUnreachable) {
		t.Fatalf("StatusCode=%d IsNotFound=%v unreachable=%v", StatusCode(err), IsNotFound(err), errors.Is(err, ErrAgentUnreachable))
	}
	if want := "agent API POST /v1/ipam: 503: IPAM not ready: no pod CIDR yet"; err.Error() != want {
		t.Fatalf("message %q, want %q", err, want)
	}

	_, err = c.GetConfig(ctx)
	if !errors.As(err, &me) || me.Code != 500 || me.Message != "plain text failure" {
		t.Fatalf("non-JSON error body: %v", err)
	}

	_, err = c.GetEndpoint(ctx, "42")
	if !IsNotFound(err) {
		t.Fatalf("GetEndpoint: %v, want 404", err)
	}
	// Idempotent deletes take 404 as done.
	if err := c.ReleaseIP(ctx, "10.0.0.9"); err != nil {
		t.Fatalf("ReleaseIP of an unknown IP: %v", err)
	}
	found, err := c.DeleteEndpointByContainerID(ctx, "gone")
	if err != nil || found {
		t.Fatalf("DeleteEndpointByContainerID of an unknown container = %v, %v; want false, nil", found, err)
	}
}

func TestBadReplies(t *testing.T) {
	c, _ := serve(t, func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/v1/ipam":
			writeJSON(w, http.StatusCreated, models.IPAMResponse{})
		case "/v1/config":
			w.WriteHeader(http.StatusOK)
		default:
			_, _ = io.WriteString(w, "{not json")
		}
	})
	ctx := context.Background()
	if _, err := c.AllocateIP(ctx, "ns/p", ""); err == nil || !strings.Contains(err.Error(), "no IPv4 address") {
		t.Errorf("AllocateIP with an empty reply: %v", err)
	}
	if _, err := c.GetConfig(ctx); err == nil || !strings.Contains(err.Error(), "empty reply") {
		t.Errorf("GetConfig with no body: %v", err)
	}
	if _, err := c.GetNodes(ctx); err == nil || !strings.Contains(err.Error(), "decode reply") {
		t.Errorf("GetNodes with bad JSON: %v", err)
	}
}

func TestAgentUnreachable(t *testing.T) {
	dir := socketDir(t)

	// A socket file nobody listens on: connection refused.
	stale := filepath.Join(dir, "stale.sock")
	ln, err := net.Listen("unix", stale)
	if err != nil {
		t.Fatal(err)
	}
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	ln.Close()

	for name, sock := range map[string]string{
		"missing socket": filepath.Join(dir, "missing.sock"),
		"stale socket":   stale,
	} {
		t.Run(name, func(t *testing.T) {
			c := New(sock)
			defer c.Close()
			_, err := c.GetConfig(context.Background())
			if !errors.Is(err, ErrAgentUnreachable) {
				t.Fatalf("err = %v, want ErrAgentUnreachable", err)
			}
			if !strings.Contains(err.Error(), sock) {
				t.Fatalf("error %q does not name the socket", err)
			}
			if StatusCode(err) != 0 {
				t.Fatalf("StatusCode = %d", StatusCode(err))
			}
		})
	}
}

func TestContextDeadline(t *testing.T) {
	release := make(chan struct{})
	c, _ := serve(t, func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	})
	defer close(release)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	_, err := c.PutEndpoint(ctx, &models.EndpointChangeRequest{ContainerID: "c"})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want context.DeadlineExceeded", err)
	}
	if errors.Is(err, ErrAgentUnreachable) {
		t.Fatalf("a slow agent is not unreachable: %v", err)
	}
}

// TestConcurrent shares one client between goroutines (run with -race).
func TestConcurrent(t *testing.T) {
	c, _ := serve(t, func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, models.DaemonConfig{MTU: 1500})
	})
	var wg sync.WaitGroup
	errs := make(chan error, 20)
	for range 20 {
		wg.Go(func() {
			if _, err := c.GetConfig(context.Background()); err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}
