package agentapi_test

import (
	"net/netip"
	"testing"
	"time"

	"github.com/cilium/statedb"

	"github.com/cellium/cellium/cells/agentapi"
	"github.com/cellium/cellium/statedb/health"
)

// The cluster-health of GET /v1/healthz counts the probes and how many
// answered, and carries each one's address, error and times.
func TestClusterHealthModel(t *testing.T) {
	db := statedb.New()
	probes, err := health.NewProbesTable(db)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 12, 1, 6, 0, 0, 0, time.UTC)
	wtxn := db.WriteTxn(probes)
	_, _, _ = probes.Insert(wtxn, &health.Probe{Name: health.ProbeHealthEndpoint, IP: netip.MustParseAddr("10.0.0.7"),
		Error: "GET 10.0.0.7:4240/hello: connection refused", LastProbed: now, LastReachable: now.Add(-time.Minute)})
	_, _, _ = probes.Insert(wtxn, &health.Probe{Name: "other", Reachable: true, Latency: time.Millisecond, LastProbed: now})
	wtxn.Commit()

	m := agentapi.ClusterHealthModel(probes.All(db.ReadTxn()))
	if m.Total != 2 || m.Reachable != 1 || len(m.Probes) != 2 {
		t.Fatalf("model %+v", m)
	}
	hp := m.Probes[0]
	if hp.Name != health.ProbeHealthEndpoint || hp.IP != "10.0.0.7" || hp.Reachable || hp.Error == "" ||
		hp.LastReachable == nil || !hp.LastReachable.Equal(now.Add(-time.Minute)) {
		t.Errorf("health endpoint probe %+v", hp)
	}
	if o := m.Probes[1]; o.IP != "" || !o.Reachable || o.Latency != time.Millisecond || o.LastReachable != nil {
		t.Errorf("other probe %+v", o)
	}
}
