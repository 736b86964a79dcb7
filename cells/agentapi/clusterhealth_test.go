package agentapi_test

import (
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/cilium/statedb"

	"github.com/cellium/cellium/api/v1/models"
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

// The other nodes count in Cluster health: a node is reachable when every
// path answered, unreachable when one did not, unknown while one is not
// probed; nodes and paths are sorted.
func TestAddNodeHealth(t *testing.T) {
	ip := netip.MustParseAddr
	now := time.Now()
	rows := []*health.NodePath{
		{Node: "c", Type: health.PathNode, Protocol: health.ProtocolICMP, IP: ip("192.168.0.3")},
		{Node: "b", Type: health.PathEndpoint, Protocol: health.ProtocolHTTP, IP: ip("10.0.2.9"), Probed: true, Error: "refused", LastProbed: now},
		{Node: "b", Type: health.PathNode, Protocol: health.ProtocolICMP, IP: ip("192.168.0.2"), Probed: true, Reachable: true, LastProbed: now, LastReachable: now},
		{Node: "a", Type: health.PathNode, Protocol: health.ProtocolICMP, IP: ip("192.168.0.1"), Probed: true, Reachable: true, Latency: time.Millisecond, LastProbed: now, LastReachable: now},
	}
	ch := &models.ClusterHealth{Reachable: 1, Total: 1}
	agentapi.AddNodeHealth(ch, rows)
	if ch.Total != 4 || ch.Reachable != 2 {
		t.Errorf("reachable %d/%d, want 2/4", ch.Reachable, ch.Total)
	}
	var got []string
	for _, n := range ch.Nodes {
		s := n.Name + ":" + n.Status
		for _, p := range n.Paths {
			s += " " + p.Type + "/" + p.Protocol
		}
		got = append(got, s)
	}
	want := []string{"a:reachable node/icmp", "b:unreachable endpoint/http node/icmp", "c:unknown node/icmp"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("nodes %v, want %v", got, want)
	}
	if p := ch.Nodes[1].Paths[0]; p.Error != "refused" || p.LastReachable != nil || p.LastProbed == nil {
		t.Errorf("b's endpoint path %+v", p)
	}
}
