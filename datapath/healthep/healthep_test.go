package healthep_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"testing"

	"go.uber.org/goleak"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	"github.com/cellium/cellium/datapath/healthep"
	"github.com/cellium/cellium/statedb/endpoints"
	"github.com/cellium/cellium/statedb/health"
	"github.com/cellium/cellium/statedb/nodes"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The zero Names are Cilium's: /var/run/netns/cilium-health, lxc_health
// to cilium, port 4240.
func TestNamesDefaults(t *testing.T) {
	n := healthep.Names{}.WithDefaults()
	if n.NetnsPath() != "/var/run/netns/cilium-health" || n.HostIfName != "lxc_health" || n.IfName != "cilium" ||
		n.Port != 4240 || n.ContainerID != "cilium-health" {
		t.Errorf("defaults %+v", n)
	}
	o := healthep.Names{NetnsDir: "/tmp/x", NetnsName: "h1", HostIfName: "lxc_h1", Port: 14240}.WithDefaults()
	if o.NetnsPath() != "/tmp/x/h1" || o.HostIfName != "lxc_h1" || o.Port != 14240 || o.IfName != "cilium" {
		t.Errorf("overrides %+v", o)
	}
}

// The desired row needs the health endpoint's IPv4 address and the router
// IP, and goes away while the endpoint is being deleted.
func TestDesired(t *testing.T) {
	ip, router := netip.MustParseAddr("10.0.0.7"), netip.MustParseAddr("10.0.0.1")
	ep := &endpoints.Endpoint{ID: 3, IPv4: ip, Health: true, State: ciliumv2.EndpointStateReady}
	local := &nodes.LocalNode{Name: "n1", RouterIP: router}
	got := healthep.Desired(healthep.Names{}, ep, local)
	want := &health.Netns{NetnsPath: "/var/run/netns/cilium-health", HostIfName: "lxc_health", IfName: "cilium",
		ContainerID: "cilium-health", IPv4: ip, Gateway: router, Port: 4240}
	if got == nil || !got.SameAs(want) {
		t.Errorf("Desired = %+v, want %+v", got, want)
	}
	for name, tc := range map[string]struct {
		ep    *endpoints.Endpoint
		local *nodes.LocalNode
	}{
		"no endpoint":       {nil, local},
		"no local node":     {ep, nil},
		"no router IP":      {ep, &nodes.LocalNode{Name: "n1"}},
		"no endpoint IP":    {&endpoints.Endpoint{ID: 3, Health: true}, local},
		"endpoint deleting": {&endpoints.Endpoint{ID: 3, IPv4: ip, Health: true, State: ciliumv2.EndpointStateDisconnecting}, local},
	} {
		if got := healthep.Desired(healthep.Names{}, tc.ep, tc.local); got != nil {
			t.Errorf("%s: Desired = %+v, want nil", name, got)
		}
	}
}

// The responder answers GET /hello with 200 and nothing else.
func TestHandler(t *testing.T) {
	srv := httptest.NewServer(healthep.Handler())
	defer srv.Close()
	for _, tc := range []struct {
		method, path string
		code         int
	}{
		{http.MethodGet, health.Path, http.StatusOK},
		{http.MethodGet, "/", http.StatusNotFound},
		{http.MethodPost, health.Path, http.StatusMethodNotAllowed},
	} {
		req, _ := http.NewRequest(tc.method, srv.URL+tc.path, nil)
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tc.code {
			t.Errorf("%s %s: %d %q, want %d", tc.method, tc.path, resp.StatusCode, body, tc.code)
		}
	}
	srv.Client().CloseIdleConnections()
}
