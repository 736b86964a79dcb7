package endpointmanager_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cilium/statedb"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	"github.com/cellium/cellium/api/v1/models"
	"github.com/cellium/cellium/cells/agentapi"
	"github.com/cellium/cellium/cells/endpointmanager"
	"github.com/cellium/cellium/cells/endpointpolicy/endpointpolicytest"
	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/cells/hive/hivetest"
	identitycell "github.com/cellium/cellium/cells/identity"
	"github.com/cellium/cellium/cells/ipam"
	"github.com/cellium/cellium/cells/k8s"
	"github.com/cellium/cellium/cells/statedir"
	"github.com/cellium/cellium/statedb/endpoints"
	"github.com/cellium/cellium/statedb/identity"
	"github.com/cellium/cellium/statedb/labels"
	"github.com/cellium/cellium/statedb/nodes"
)

// restoringIdentities is an allocator without its API server: only the
// identities restored from the endpoints' state files resolve; any other
// allocation waits for the API until ctx ends.
type restoringIdentities struct {
	fakeIdentities
	restored map[string]identity.NumericIdentity
}

func (r *restoringIdentities) Restore(l labels.Labels, id identity.NumericIdentity) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.restored[l.String()] = id
}

func (r *restoringIdentities) Allocate(ctx context.Context, l labels.Labels) (identitycell.Identity, error) {
	r.mu.Lock()
	id, ok := r.restored[l.String()]
	r.mu.Unlock()
	if !ok {
		<-ctx.Done()
		return identitycell.Identity{}, fmt.Errorf("wait for the CiliumIdentities to be listed: %w", ctx.Err())
	}
	return identitycell.Identity{ID: id, Labels: l}, nil
}

func (r *restoringIdentities) Release(context.Context, identity.NumericIdentity) error { return nil }

// The agent boots with its state from a previous run while the API server
// is unreachable (a node reboot with the control plane down): start
// returns at once, the socket serves, the restored endpoint is ready again
// with its saved identity and the endpoints table is initialized (so the
// CNI configuration is written) without the API, CNI DEL of a restored
// endpoint works and frees its IP, an ADD that needs the API fails fast
// with 503 (the plugin's code 11), and health says why.
func TestBootWithoutAPIServer(t *testing.T) {
	dir := t.TempDir()
	live := firstAgent(t, dir)
	ids := &restoringIdentities{restored: map[string]identity.NumericIdentity{}}
	var (
		db  *statedb.DB
		eps statedb.Table[*endpoints.Endpoint]
	)

	fipam := &fakeIPAM{owners: map[netip.Addr]ipam.Owner{}}
	socket := filepath.Join(t.TempDir(), "api.sock")
	began := time.Now()
	// 127.0.0.1:1 refuses connections: the API server is down.
	hivetest.Start(t, []string{"--state-dir=" + dir, "--socket-path=" + socket,
		"--k8s-api-server=http://127.0.0.1:1", "--k8s-client-request-timeout=1s"},
		statedir.Cell, agentapi.Cell, k8s.ClientCell, k8s.AgentResourcesCell,
		hive.Provide(
			func() ipam.Allocator { return fipam },
			allocationsTable,
			func() identitycell.Allocator { return ids },
			func() identitycell.LabelFilter { return filter{} },
			func() identitycell.ClusterName { return "default" },
			func() k8s.NodeName { return "node-a" },
			nodes.NewLocalNodeTable, statedb.RWTable[*nodes.LocalNode].ToTable,
		),
		endpointpolicytest.New().Cell(),
		endpointmanager.Cell, identitycell.Responder, ipam.Responder,
		hivetest.Capture(&db), hivetest.Capture(&eps),
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

	// The restored endpoint is ready with its saved identity, and restore
	// is done as far as the node can tell, without the API server.
	waitFor(t, "the restored endpoint ready with its saved identity", func() bool {
		ep, _, ok := eps.Get(db.ReadTxn(), endpoints.IDIndex.Query(uint16(live.ID)))
		return ok && ep.State == ciliumv2.EndpointStateReady && live.Status.Identity != nil && int64(ep.Identity) == live.Status.Identity.ID
	})
	waitFor(t, "the endpoints table initialized", func() bool {
		ok, _ := eps.Initialized(db.ReadTxn())
		return ok
	})
	t.Logf("restored endpoint ready and endpoints table initialized %v after start", time.Since(began))

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
