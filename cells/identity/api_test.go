package identity

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/cellium/cellium/api/v1/models"
	"github.com/cellium/cellium/cells/agentapi"
	"github.com/cellium/cellium/statedb/identity"
)

func TestAPI(t *testing.T) {
	socket := filepath.Join(t.TempDir(), "cellium.sock")
	cs := newFakeClientset(cidObject("40000", time.Now(), "k8s:app=other"))
	ag := startAgentArgs(t, cs, nil, []string{"--socket-path=" + socket}, agentapi.Cell)
	id, err := ag.alloc.Allocate(ctxTimeout(t, 10*time.Second), podLabels("web", "prod"))
	if err != nil {
		t.Fatal(err)
	}

	code, body := get(t, socket, "/identity")
	if code != http.StatusOK {
		t.Fatalf("GET /identity: %d %s", code, body)
	}
	var list []models.Identity
	if err := json.Unmarshal(body, &list); err != nil {
		t.Fatal(err)
	}
	var ids []int64
	for _, m := range list {
		ids = append(ids, m.ID)
	}
	want := []int64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, int64(id.ID), 40000}
	slices.Sort(want)
	if !slices.Equal(ids, want) {
		t.Errorf("GET /identity ids = %v, want %v", ids, want)
	}
	if kube := list[6]; kube.ID != 7 || !slices.Equal(kube.Labels, []string{"reserved:kube-apiserver", "reserved:remote-node"}) {
		t.Errorf("identity 7 = %+v", kube)
	}

	// This agent's references are a statedb table.
	code, body = get(t, socket, "/statedb/"+identity.AllocationsTable)
	var rows []identity.Allocation
	if err := json.Unmarshal(body, &rows); code != http.StatusOK || err != nil {
		t.Fatalf("GET /statedb/%s = %d %s (%v)", identity.AllocationsTable, code, body, err)
	}
	if len(rows) != 1 || rows[0].ID != id.ID || rows[0].Refs != 1 || !rows[0].Labels.Equal(id.Labels) {
		t.Errorf("allocations = %s", body)
	}

	tests := []struct {
		path   string
		code   int
		labels []string
	}{
		{"/identity/4", http.StatusOK, []string{"reserved:health"}},
		{"/identity/health", http.StatusOK, []string{"reserved:health"}},
		{"/identity/40000", http.StatusOK, []string{"k8s:app=other"}},
		{"/identity/" + id.ID.StringID(), http.StatusOK, id.Labels.Strings()},
		{"/identity/39999", http.StatusNotFound, nil},
		{"/identity/web", http.StatusBadRequest, nil},
	}
	for _, tt := range tests {
		code, body := get(t, socket, tt.path)
		if code != tt.code {
			t.Errorf("GET %s = %d %s, want %d", tt.path, code, body, tt.code)
			continue
		}
		if code != http.StatusOK {
			var e models.Error
			if err := json.Unmarshal(body, &e); err != nil || e.Code != code || e.Message == "" {
				t.Errorf("GET %s: error body %s", tt.path, body)
			}
			continue
		}
		var m models.Identity
		if err := json.Unmarshal(body, &m); err != nil || !slices.Equal(m.Labels, tt.labels) {
			t.Errorf("GET %s = %s, want labels %v", tt.path, body, tt.labels)
		}
	}
}

// get fetches path from the agent API on socket.
func get(t *testing.T, socket, path string) (int, []byte) {
	t.Helper()
	tr := &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", socket)
	}}
	defer tr.CloseIdleConnections()
	c := &http.Client{Timeout: 5 * time.Second, Transport: tr}
	resp, err := c.Get("http://agent" + agentapi.APIVersionPrefix + path)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, body
}
