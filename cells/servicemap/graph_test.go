package servicemap

import (
	"fmt"
	"slices"
	"testing"
	"time"

	flowpb "github.com/cilium/cilium/api/v1/flow"
	"google.golang.org/protobuf/types/known/timestamppb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// clock is a settable time source.
type clock struct{ t time.Time }

func (c *clock) now() time.Time          { return c.t }
func (c *clock) advance(d time.Duration) { c.t = c.t.Add(d) }

var t0 = time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)

func newTestGraph(t *testing.T, maxEdges int, idle time.Duration) (*Graph, *clock) {
	t.Helper()
	c := &clock{t: t0}
	g, err := NewGraph(maxEdges, idle, c.now)
	if err != nil {
		t.Fatal(err)
	}
	return g, c
}

func pod(ns, name, workload string, identity uint32) *flowpb.Endpoint {
	ep := &flowpb.Endpoint{Namespace: ns, PodName: name, Identity: identity,
		Labels: []string{"k8s:io.kubernetes.pod.namespace=" + ns}}
	if workload != "" {
		ep.Workloads = []*flowpb.Workload{{Kind: "Deployment", Name: workload}}
	}
	return ep
}

func reserved(label string, identity uint32) *flowpb.Endpoint {
	ep := &flowpb.Endpoint{Identity: identity}
	if label != "" {
		ep.Labels = []string{label}
	}
	return ep
}

var (
	web1 = pod("demo", "web-1", "web", 12001)
	web2 = pod("demo", "web-2", "web", 12001)
	db0  = pod("demo", "db-0", "db", 12002)
	solo = pod("other", "solo", "", 13000)
)

type flowOpt func(*flowpb.Flow)

func tcp(port uint32) flowOpt {
	return func(f *flowpb.Flow) {
		f.L4 = &flowpb.Layer4{Protocol: &flowpb.Layer4_TCP{TCP: &flowpb.TCP{SourcePort: 40000, DestinationPort: port}}}
	}
}

func dropped(f *flowpb.Flow) {
	f.Verdict = flowpb.Verdict_DROPPED
	f.DropReasonDesc = flowpb.DropReason_POLICY_DENIED
}

func at(t time.Time) flowOpt { return func(f *flowpb.Flow) { f.Time = timestamppb.New(t) } }

func reply(f *flowpb.Flow) { f.IsReply = wrapperspb.Bool(true) }

func flow(src, dst *flowpb.Endpoint, opts ...flowOpt) *flowpb.Flow {
	f := &flowpb.Flow{Source: src, Destination: dst, Verdict: flowpb.Verdict_FORWARDED,
		IsReply: wrapperspb.Bool(false), Time: timestamppb.New(t0)}
	for _, o := range opts {
		o(f)
	}
	return f
}

func edgeByID(t *testing.T, s Snapshot, id string) Edge {
	t.Helper()
	for _, e := range s.Edges {
		if e.ID == id {
			return e
		}
	}
	var ids []string
	for _, e := range s.Edges {
		ids = append(ids, e.ID)
	}
	t.Fatalf("no edge %q; edges: %q", id, ids)
	return Edge{}
}

func nodeIDs(s Snapshot) []string {
	var ids []string
	for _, n := range s.Nodes {
		ids = append(ids, n.ID)
	}
	return ids
}

func TestGraphAggregatesWorkloads(t *testing.T) {
	g, _ := newTestGraph(t, 100, time.Hour)
	f := flow(web1, db0, tcp(5432))
	f.IngressAllowedBy = []*flowpb.Policy{{Kind: "CiliumNetworkPolicy", Namespace: "demo", Name: "db-allow-web"}}
	g.Add(f)
	g.Add(flow(web2, db0, tcp(5432))) // another pod of the same Deployment
	g.Add(flow(db0, web1, tcp(5432), reply))
	d := flow(web1, db0, tcp(6379), dropped)
	d.IngressDeniedBy = []*flowpb.Policy{{Kind: "CiliumNetworkPolicy", Namespace: "demo", Name: "db-deny-redis"}}
	g.Add(d)
	e := flow(solo, reserved("reserved:world", 2), tcp(443))
	e.EgressAllowedBy = []*flowpb.Policy{{Kind: "CiliumClusterwideNetworkPolicy", Name: "egress-world"}}
	g.Add(e)
	g.Add(flow(reserved("reserved:host", 1), web1, func(f *flowpb.Flow) {
		f.L4 = &flowpb.Layer4{Protocol: &flowpb.Layer4_ICMPv4{ICMPv4: &flowpb.ICMPv4{Type: 8}}}
	}))
	g.Add(flow(reserved("", 6), db0, tcp(8080)))                            // remote-node by number
	g.Add(flow(web1, reserved("cidr:1.1.1.1/32", 16777217), tcp(53)))       // a CIDR identity: world
	g.Add(flow(web1, reserved("reserved:world-ipv4", 9), tcp(80)))          // world-ipv4: world
	g.Add(flow(web1, &flowpb.Endpoint{Namespace: "demo"}, tcp(9), dropped)) // a pod without name

	s := g.Snapshot()
	if got, want := nodeIDs(s), []string{"demo/db", "demo/unknown", "demo/web", "other/solo", "reserved:host", "reserved:remote-node", "reserved:world"}; !slices.Equal(got, want) {
		t.Errorf("nodes = %q, want %q", got, want)
	}
	if s.Stats.Flows != 9 || s.Stats.Replies != 1 {
		t.Errorf("stats = %+v, want 9 flows and 1 reply", s.Stats)
	}
	ok := edgeByID(t, s, "demo/web -> demo/db 5432/TCP")
	if ok.Forwarded != 2 || ok.Dropped != 0 || ok.State != StateForwarded || ok.LastVerdict != "FORWARDED" ||
		!slices.Equal(ok.AllowedBy, []string{"CiliumNetworkPolicy demo/db-allow-web"}) || ok.DeniedBy != nil || ok.LastDrop != nil {
		t.Errorf("allowed edge = %+v", ok)
	}
	deny := edgeByID(t, s, "demo/web -> demo/db 6379/TCP")
	if deny.Dropped != 1 || deny.State != StateDropped || deny.LastDropReason != "POLICY_DENIED" ||
		!slices.Equal(deny.DeniedBy, []string{"CiliumNetworkPolicy demo/db-deny-redis"}) || deny.LastDrop == nil {
		t.Errorf("denied edge = %+v", deny)
	}
	world := edgeByID(t, s, "other/solo -> reserved:world 443/TCP")
	if !slices.Equal(world.AllowedBy, []string{"CiliumClusterwideNetworkPolicy egress-world"}) {
		t.Errorf("world edge allowed by %q", world.AllowedBy)
	}
	icmp := edgeByID(t, s, "reserved:host -> demo/web ICMPv4")
	if icmp.Port != 0 || icmp.Protocol != "ICMPv4" {
		t.Errorf("icmp edge = %+v", icmp)
	}
	edgeByID(t, s, "reserved:remote-node -> demo/db 8080/TCP")
	edgeByID(t, s, "demo/web -> reserved:world 53/TCP")
	edgeByID(t, s, "demo/web -> reserved:world 80/TCP")
	for _, n := range s.Nodes {
		switch n.ID {
		case "demo/web":
			if n.Kind != "Deployment" || n.Name != "web" || n.Namespace != "demo" || n.Identity != 12001 {
				t.Errorf("node %+v", n)
			}
		case "other/solo":
			if n.Kind != "Pod" || n.Name != "solo" {
				t.Errorf("a pod without workload: %+v", n)
			}
		case "reserved:world":
			if n.Kind != "reserved" || n.Namespace != "" {
				t.Errorf("world: %+v", n)
			}
		}
	}
}

func TestGraphEdgeStates(t *testing.T) {
	g, c := newTestGraph(t, 100, time.Hour)
	id := "demo/web -> demo/db 6379/TCP"
	state := func() string { return edgeByID(t, g.Snapshot(), id).State }
	g.Add(flow(web1, db0, tcp(6379), dropped, at(c.t)))
	if s := state(); s != StateDropped {
		t.Fatalf("after a drop: %s", s)
	}
	c.advance(10 * time.Second)
	g.Add(flow(web1, db0, tcp(6379), at(c.t)))
	if s := state(); s != StateDropped {
		t.Errorf("forwarded 10 s after a drop (within DropWindow): %s, want dropped", s)
	}
	c.advance(DropWindow + time.Second)
	if s := state(); s != StateIdle {
		t.Errorf("no flow for DropWindow, the last forwarded: %s, want idle", s)
	}
	g.Add(flow(web1, db0, tcp(6379), at(c.t)))
	if s := state(); s != StateForwarded {
		t.Errorf("a forwarded flow after DropWindow: %s, want forwarded", s)
	}
	c.advance(5 * time.Second)
	g.Add(flow(web1, db0, tcp(6379), dropped, at(c.t)))
	c.advance(2 * DropWindow)
	if s := state(); s != StateDropped {
		t.Errorf("the last flow dropped, long ago: %s, want dropped (red until a forwarded flow)", s)
	}
	// A flow that arrives late (an older time) does not become the last.
	g.Add(flow(web1, db0, tcp(6379), at(c.t.Add(-time.Hour))))
	if e := edgeByID(t, g.Snapshot(), id); e.LastVerdict != "DROPPED" || e.Forwarded != 3 {
		t.Errorf("after a late flow: %+v", e)
	}
	// Other verdicts are grey.
	g.Add(flow(web1, db0, tcp(80), at(c.t), func(f *flowpb.Flow) { f.Verdict = flowpb.Verdict_AUDIT }))
	if e := edgeByID(t, g.Snapshot(), "demo/web -> demo/db 80/TCP"); e.State != StateIdle || e.Other != 1 {
		t.Errorf("an audited flow: %+v", e)
	}
}

func TestGraphEvictsLeastRecentlySeenEdge(t *testing.T) {
	g, _ := newTestGraph(t, 3, time.Hour)
	for port := uint32(1); port <= 3; port++ {
		g.Add(flow(web1, db0, tcp(port)))
	}
	g.Add(flow(web1, db0, tcp(1)))  // port 1 is seen again: port 2 is now the oldest
	g.Add(flow(solo, web1, tcp(4))) // evicts port 2
	g.Add(flow(solo, web1, tcp(5))) // evicts port 3
	s := g.Snapshot()
	var ids []string
	for _, e := range s.Edges {
		ids = append(ids, e.ID)
	}
	want := []string{"demo/web -> demo/db 1/TCP", "other/solo -> demo/web 4/TCP", "other/solo -> demo/web 5/TCP"}
	if !slices.Equal(ids, want) {
		t.Errorf("edges = %q, want %q", ids, want)
	}
	if s.Stats.Evicted != 2 || s.Stats.MaxEdges != 3 {
		t.Errorf("stats = %+v, want 2 evicted of max 3", s.Stats)
	}
	// Evicting the last edge of a node removes the node.
	g.Add(flow(solo, web1, tcp(6)))
	if got, want := nodeIDs(g.Snapshot()), []string{"demo/web", "other/solo"}; !slices.Equal(got, want) {
		t.Errorf("nodes after evicting demo/db's last edge = %q, want %q", got, want)
	}
}

func TestGraphBoundedUnderManyEdges(t *testing.T) {
	g, _ := newTestGraph(t, 50, time.Hour)
	for i := range 10000 {
		g.Add(flow(pod("ns", fmt.Sprintf("p%d", i), "", 1), db0, tcp(uint32(i%65535))))
	}
	s := g.Snapshot()
	if len(s.Edges) != 50 || len(s.Nodes) != 51 || s.Stats.Evicted != 10000-50 {
		t.Errorf("%d edges, %d nodes, %d evicted; want 50, 51, %d", len(s.Edges), len(s.Nodes), s.Stats.Evicted, 10000-50)
	}
	if len(g.edges) != g.lru.Len() {
		t.Errorf("index and list disagree: %d vs %d", len(g.edges), g.lru.Len())
	}
}

func TestGraphExpiresIdleEdges(t *testing.T) {
	g, c := newTestGraph(t, 100, 10*time.Minute)
	g.Add(flow(web1, db0, tcp(5432), at(c.t)))
	c.advance(6 * time.Minute)
	g.Add(flow(solo, db0, tcp(5432), at(c.t)))
	c.advance(5 * time.Minute) // web -> db idle 11 minutes, solo -> db 5
	s := g.Snapshot()
	if len(s.Edges) != 1 || s.Edges[0].Source != "other/solo" || s.Stats.Expired != 1 {
		t.Fatalf("after 11 idle minutes: edges %+v, stats %+v", s.Edges, s.Stats)
	}
	if got, want := nodeIDs(s), []string{"demo/db", "other/solo"}; !slices.Equal(got, want) {
		t.Errorf("nodes = %q, want %q (demo/web has no edge left)", got, want)
	}
	// Flows older than the idle timeout (history at start) do not stay.
	g.Add(flow(web1, db0, tcp(1), at(c.t.Add(-time.Hour))))
	g.Add(flow(web1, db0, tcp(2), at(c.t)))
	if s := g.Snapshot(); len(s.Edges) != 2 || s.Stats.Stale != 1 {
		t.Errorf("an hour-old flow stayed: %+v, stats %+v", s.Edges, s.Stats)
	}
}

func TestGraphPolicyNamesBounded(t *testing.T) {
	g, _ := newTestGraph(t, 10, time.Hour)
	for i := range 12 {
		f := flow(web1, db0, tcp(6379), dropped)
		f.EgressDeniedBy = []*flowpb.Policy{{Kind: "CiliumNetworkPolicy", Namespace: "demo", Name: fmt.Sprintf("p%d", i)}}
		g.Add(f)
	}
	f := flow(web1, db0, tcp(6379), dropped)
	f.EgressDeniedBy = []*flowpb.Policy{{Kind: "CiliumNetworkPolicy", Namespace: "demo", Name: "p5"}, {Name: ""}}
	f.IngressDeniedBy = []*flowpb.Policy{{Kind: "NetworkPolicy", Namespace: "demo", Name: "np"}}
	g.Add(f)
	e := edgeByID(t, g.Snapshot(), "demo/web -> demo/db 6379/TCP")
	want := []string{"p6", "p7", "p8", "p9", "p10", "p11"}
	for i := range want {
		want[i] = "CiliumNetworkPolicy demo/" + want[i]
	}
	// Ingress before egress within one flow.
	want = append(want, "NetworkPolicy demo/np", "CiliumNetworkPolicy demo/p5")
	if !slices.Equal(e.DeniedBy, want) {
		t.Errorf("denied by %q, want %q", e.DeniedBy, want)
	}
}

func TestGraphChangedWakesWatchers(t *testing.T) {
	g, _ := newTestGraph(t, 10, time.Hour)
	ch := g.Changed()
	v := g.Snapshot().Version
	g.Add(flow(web1, db0, tcp(1)))
	select {
	case <-ch:
	default:
		t.Fatal("Add did not close the Changed channel")
	}
	if g.Snapshot().Version <= v {
		t.Error("the version did not grow")
	}
	ch = g.Changed()
	g.SetUpstream(Upstream{Address: "x", State: UpstreamConnected})
	select {
	case <-ch:
	default:
		t.Fatal("SetUpstream did not close the Changed channel")
	}
	g.AddLost(7)
	if s := g.Snapshot(); s.Stats.Lost != 7 || s.Upstream.State != UpstreamConnected {
		t.Errorf("snapshot %+v", s)
	}
}

func TestNewGraphRejectsBadBounds(t *testing.T) {
	if _, err := NewGraph(0, time.Minute, nil); err == nil {
		t.Error("0 edges accepted")
	}
	if _, err := NewGraph(1, 0, nil); err == nil {
		t.Error("0 idle timeout accepted")
	}
}

// BenchmarkGraphAdd is the cost of folding one flow into an existing edge,
// the common case.
func BenchmarkGraphAdd(b *testing.B) {
	c := &clock{t: t0}
	g, err := NewGraph(2000, time.Hour, c.now)
	if err != nil {
		b.Fatal(err)
	}
	flows := make([]*flowpb.Flow, 100)
	for i := range flows {
		flows[i] = flow(web1, db0, tcp(uint32(i)), dropped)
		flows[i].IngressDeniedBy = []*flowpb.Policy{{Kind: "CiliumNetworkPolicy", Namespace: "demo", Name: "deny"}}
	}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		g.Add(flows[i%len(flows)])
	}
}

// BenchmarkSnapshot is the cost of one push to a page: a snapshot of a
// graph of 2000 edges (the JSON encoding not included).
func BenchmarkSnapshot(b *testing.B) {
	c := &clock{t: t0}
	g, err := NewGraph(2000, time.Hour, c.now)
	if err != nil {
		b.Fatal(err)
	}
	for i := range 2000 {
		g.Add(flow(pod("ns", fmt.Sprintf("p%d", i%200), "", 1), db0, tcp(uint32(i))))
	}
	b.ReportAllocs()
	for b.Loop() {
		g.Snapshot()
	}
}
