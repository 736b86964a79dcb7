package endpointmanager_test

import (
	"context"
	"net"
	"net/http"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cellium/cellium/api/v1/models"
	"github.com/cellium/cellium/cells/agentapi"
	"github.com/cellium/cellium/cells/endpointmanager"
	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/cells/hive/hivetest"
	identitycell "github.com/cellium/cellium/cells/identity"
	"github.com/cellium/cellium/cells/ipam"
	"github.com/cellium/cellium/cells/k8s"
	"github.com/cellium/cellium/cells/statedir"
	"github.com/cellium/cellium/statedb/identity"
)

// The agent boots with its state from a previous run while the API server
// is unreachable (a node reboot with the control plane down): start
// returns at once, the socket serves, CNI DEL of a restored endpoint works
// and frees its IP, an ADD that needs the API fails fast with 503 (the
// plugin's code 11), and health says why.
func TestBootWithoutAPIServer(t *testing.T) {
	dir := t.TempDir()
	live := firstAgent(t, dir)

	fipam := &fakeIPAM{owners: map[netip.Addr]ipam.Owner{}}
	socket := filepath.Join(t.TempDir(), "api.sock")
	began := time.Now()
	// 127.0.0.1:1 refuses connections: the API server is down.
	hivetest.Start(t, []string{"--state-dir=" + dir, "--socket-path=" + socket,
		"--k8s-api-server=http://127.0.0.1:1", "--k8s-client-request-timeout=1s"},
		statedir.Cell, agentapi.Cell, k8s.ClientCell, k8s.AgentResourcesCell,
		hive.Provide(
			func() ipam.Allocator { return fipam },
			func() ipam.Lookup { return fipam },
			func() identitycell.Allocator {
				return &fakeIdentities{ids: map[string]identity.NumericIdentity{}, refs: map[identity.NumericIdentity]int{}}
			},
			func() identitycell.LabelFilter { return filter{} },
			func() identitycell.ClusterName { return "default" },
			func() k8s.NodeName { return "node-a" },
		),
		endpointmanager.Cell,
	)
	t.Logf("agent started in %v without the API server", time.Since(began))
	e := &env{ipam: fipam, api: &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", socket)
	}}}}

	var h models.Health
	e.do(t, "GET", "/healthz?verbose=true", nil, &h)
	found := false
	for _, m := range h.Modules {
		if m.Module == "k8s-client" && m.Level == string(hive.LevelDegraded) && strings.Contains(m.Message, "127.0.0.1:1") {
			found = true
		}
	}
	if h.State != "Degraded" || !found {
		t.Errorf("healthz without the API server: %+v", h)
	}

	// ADD of a pod the agent knows nothing about needs the API: 503 fast.
	began = time.Now()
	var apiErr models.Error
	if code := e.do(t, "PUT", "/endpoint", addReq("c-new", "new", "10.0.0.40"), &apiErr); code != http.StatusServiceUnavailable ||
		!strings.Contains(apiErr.Message, "API server reachable") {
		t.Errorf("ADD without the API server: %d %q, want 503 saying why", code, apiErr.Message)
	}
	t.Logf("ADD failed in %v", time.Since(began))

	// DEL of the restored endpoint works and frees its IP.
	if code := e.do(t, "DELETE", "/endpoint?container-id=c-live", nil, nil); code != http.StatusOK {
		t.Fatalf("DEL of restored endpoint %d: %d", live.ID, code)
	}
	fipam.mu.Lock()
	defer fipam.mu.Unlock()
	if !slices.Contains(fipam.released, netip.MustParseAddr("10.0.0.30")) {
		t.Errorf("DEL did not free the IP: released %v", fipam.released)
	}
}
