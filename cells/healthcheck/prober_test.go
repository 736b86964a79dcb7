package healthcheck_test

import (
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/cilium/statedb"
	"go.uber.org/goleak"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	"github.com/cellium/cellium/cells/healthcheck"
	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/cells/hive/hivetest"
	"github.com/cellium/cellium/statedb/endpoints"
	"github.com/cellium/cellium/statedb/health"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type env struct {
	db     *statedb.DB
	eps    statedb.RWTable[*endpoints.Endpoint]
	probes statedb.Table[*health.Probe]
}

func start(t *testing.T, o healthcheck.Options) *env {
	t.Helper()
	e := &env{}
	hivetest.Start(t, nil,
		hive.Provide(endpoints.NewTable, statedb.RWTable[*endpoints.Endpoint].ToTable),
		healthcheck.NewCell(o),
		hivetest.Capture(&e.db), hivetest.Capture(&e.eps), hivetest.Capture(&e.probes),
	)
	return e
}

func (e *env) setHealthEndpoint(ep *endpoints.Endpoint) {
	wtxn := e.db.WriteTxn(e.eps)
	_, _, _ = e.eps.Insert(wtxn, ep)
	wtxn.Commit()
}

// waitProbe waits for a probe row ok accepts.
func (e *env) waitProbe(t *testing.T, what string, ok func(*health.Probe) bool) *health.Probe {
	t.Helper()
	timeout := time.After(30 * time.Second)
	var last *health.Probe
	for {
		p, _, watch, found := e.probes.GetWatch(e.db.ReadTxn(), health.ProbeIndex.Query(health.ProbeHealthEndpoint))
		if found {
			last = p
			if ok(p) {
				return p
			}
		}
		select {
		case <-watch:
		case <-timeout:
			t.Fatalf("no probe %s within 30s; last %+v", what, last)
		}
	}
}

// Without a health endpoint, or with one that has no interface, nothing
// is sent and the probe row says why.
func TestProbeWithoutInterface(t *testing.T) {
	e := start(t, healthcheck.Options{Interval: time.Hour})
	p := e.waitProbe(t, "without an endpoint", func(*health.Probe) bool { return true })
	if p.Reachable || p.Error != "the node has no health endpoint yet" || p.IP.IsValid() {
		t.Errorf("probe %+v", p)
	}
	ip := netip.MustParseAddr("10.217.0.9")
	e.setHealthEndpoint(&endpoints.Endpoint{ID: 7, IPv4: ip, Health: true, State: ciliumv2.EndpointStateReady})
	p = e.waitProbe(t, "without an interface", func(p *health.Probe) bool { return p.IP == ip })
	if p.Reachable || !strings.Contains(p.Error, "has no interface") || !strings.Contains(p.Error, "--enable-endpoint-health-checking") {
		t.Errorf("probe %+v", p)
	}
}

// A health endpoint whose address the node does not route through its
// interface is not probed: the row says which flag to check.
func TestProbeWithoutRoute(t *testing.T) {
	// 127.0.0.2 is routed through lo, not through "lxc_nosuch".
	e := start(t, healthcheck.Options{Interval: time.Hour})
	e.setHealthEndpoint(&endpoints.Endpoint{ID: 7, IPv4: netip.MustParseAddr("127.0.0.2"), HostIfName: "lxc_nosuch", Health: true})
	p := e.waitProbe(t, "without a route", func(p *health.Probe) bool { return p.IP.IsValid() })
	if p.Reachable || !strings.Contains(p.Error, "not through the health endpoint's lxc_nosuch") || !strings.Contains(p.Error, "--enable-endpoint-routes") {
		t.Errorf("probe %+v", p)
	}
}

// A responder on loopback plays the health endpoint (its "interface" is
// lo): the probe reaches it, records the latency, and records the error
// once it is gone, keeping when it was last reachable.
func TestProbeReachableThenNot(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("binding a socket to a device needs CAP_NET_RAW on older kernels: not running as root")
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+health.Path, func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("OK\n")) })
	srv := httptest.NewServer(mux)
	defer srv.Close()
	port := srv.Listener.Addr().(*net.TCPAddr).Port

	e := start(t, healthcheck.Options{Interval: 50 * time.Millisecond, Timeout: 5 * time.Second, Port: port})
	ip := netip.MustParseAddr("127.0.0.1")
	e.setHealthEndpoint(&endpoints.Endpoint{ID: 7, IPv4: ip, HostIfName: "lo", HostIfIndex: 1, Health: true})
	p := e.waitProbe(t, "reachable", func(p *health.Probe) bool { return p.Reachable })
	if p.IP != ip || p.Latency <= 0 || p.Error != "" || p.LastReachable != p.LastProbed {
		t.Errorf("reachable probe %+v", p)
	}
	srv.Close()
	q := e.waitProbe(t, "unreachable", func(p *health.Probe) bool { return !p.Reachable })
	if !strings.Contains(q.Error, "connection refused") || q.LastReachable.IsZero() || q.LastReachable.Before(p.LastReachable) {
		t.Errorf("unreachable probe %+v (reachable one %+v)", q, p)
	}
}
