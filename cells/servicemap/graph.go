package servicemap

import (
	"container/list"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	flowpb "github.com/cilium/cilium/api/v1/flow"
)

// DropWindow is how long a drop keeps an edge red: an edge is "dropped"
// when its last flow was dropped or when any of its flows in the last
// DropWindow was.
const DropWindow = time.Minute

// maxPolicies bounds the policy names an edge remembers per side
// (allowed-by, denied-by): the most recent ones are kept.
const maxPolicies = 8

// Edge states, the colour of an edge on the page.
const (
	// StateDropped (red): the last flow was dropped, or one was within
	// DropWindow.
	StateDropped = "dropped"
	// StateForwarded (green): flows within DropWindow, the last one
	// forwarded, no drop.
	StateForwarded = "forwarded"
	// StateIdle (grey): no flow within DropWindow, or the last one neither
	// forwarded nor dropped (AUDIT, REDIRECTED, ...), no drop.
	StateIdle = "idle"
)

// Node is a vertex of the map: a workload (namespace/name of its
// Deployment, StatefulSet, ..., or the pod's name when it has none) or a
// reserved identity (world, host, remote-node, health, ...).
type Node struct {
	// ID is "namespace/name" for workloads and "reserved:<name>" for
	// reserved identities.
	ID string `json:"id"`
	// Namespace is empty for reserved identities.
	Namespace string `json:"namespace,omitempty"`
	// Name is the workload's, the pod's or the reserved identity's name.
	Name string `json:"name"`
	// Kind is the workload kind (Deployment, ...), "Pod" without one, or
	// "reserved".
	Kind string `json:"kind"`
	// Identity is the last numeric security identity seen for it.
	Identity uint32 `json:"identity,omitempty"`
}

// Edge is the traffic seen from one node to another on one destination
// port and protocol.
type Edge struct {
	// ID is "source -> destination port/protocol".
	ID          string `json:"id"`
	Source      string `json:"source"`
	Destination string `json:"destination"`
	// Port is the destination port (0 for ICMP and protocols without
	// ports).
	Port uint32 `json:"port"`
	// Protocol is TCP, UDP, SCTP, ICMPv4, ICMPv6 or "" when the flow had
	// no layer 4.
	Protocol string `json:"protocol"`
	// Forwarded, Dropped and Other count the flows by verdict (Other:
	// AUDIT, REDIRECTED, TRACED, TRANSLATED, ERROR).
	Forwarded uint64 `json:"forwarded"`
	Dropped   uint64 `json:"dropped"`
	Other     uint64 `json:"other"`
	// LastVerdict is the verdict of the last flow (FORWARDED, DROPPED, ...).
	LastVerdict string `json:"lastVerdict"`
	// LastDropReason is the drop reason of the last drop (POLICY_DENIED, ...).
	LastDropReason string `json:"lastDropReason,omitempty"`
	// LastSeen is the time of the last flow, LastDrop of the last drop.
	LastSeen time.Time  `json:"lastSeen"`
	LastDrop *time.Time `json:"lastDrop,omitempty"`
	// AllowedBy and DeniedBy name the policies that decided the edge's
	// flows ("CiliumNetworkPolicy demo/db-allow-web"), most recent last,
	// at most 8 each.
	AllowedBy []string `json:"allowedBy,omitempty"`
	DeniedBy  []string `json:"deniedBy,omitempty"`
	// State is the edge's colour: dropped, forwarded or idle.
	State string `json:"state"`
}

// Upstream states.
const (
	// UpstreamConnecting: no stream yet (the first try, or retrying now).
	UpstreamConnecting = "connecting"
	// UpstreamConnected: flows are streaming.
	UpstreamConnected = "connected"
	// UpstreamDisconnected: the last try failed; the next is at RetryAt.
	UpstreamDisconnected = "disconnected"
)

// Upstream is the state of the connection to the flow source, shown on
// the page.
type Upstream struct {
	// Address is --hubble-relay-address.
	Address string `json:"address"`
	// State is connecting, connected or disconnected.
	State string `json:"state"`
	// Error is why the last stream ended or could not start.
	Error string `json:"error,omitempty"`
	// Since is when State was entered.
	Since time.Time `json:"since"`
	// RetryAt is when the next try starts (disconnected only).
	RetryAt *time.Time `json:"retryAt,omitempty"`
	// Version is the server's (ServerStatus), e.g. the relay's.
	Version string `json:"version,omitempty"`
	// ConnectedNodes is how many agents the relay reads from (0 when the
	// source is one agent).
	ConnectedNodes uint32 `json:"connectedNodes,omitempty"`
}

// Stats count what the graph did with the flows it was given.
type Stats struct {
	// Flows is how many flows made it into an edge.
	Flows uint64 `json:"flows"`
	// Replies is how many flows were skipped as replies of a connection.
	Replies uint64 `json:"replies"`
	// Lost is the events the source reported lost (LostEvent).
	Lost uint64 `json:"lost"`
	// Stale is how many flows were older than the idle timeout when they
	// came (history read at start) and made no new edge.
	Stale uint64 `json:"stale"`
	// Evicted is how many edges were removed to stay within MaxEdges,
	// Expired how many were removed after IdleTimeout without a flow.
	Evicted uint64 `json:"evicted"`
	Expired uint64 `json:"expired"`
	// MaxEdges and IdleTimeout are the bounds in force.
	MaxEdges    int    `json:"maxEdges"`
	IdleTimeout string `json:"idleTimeout"`
}

// Snapshot is the whole map at one instant: what /api/graph returns and
// /api/events pushes.
type Snapshot struct {
	// Time is when the snapshot was taken; states are computed for it.
	Time time.Time `json:"time"`
	// Version grows with every change of the graph.
	Version  uint64   `json:"version"`
	Upstream Upstream `json:"upstream"`
	Stats    Stats    `json:"stats"`
	// Nodes are sorted by ID, Edges by ID.
	Nodes []Node `json:"nodes"`
	Edges []Edge `json:"edges"`
}

type edgeKey struct {
	src, dst string
	port     uint32
	proto    string
}

type edge struct {
	key       edgeKey
	elem      *list.Element // in Graph.lru, most recently seen at the front
	forwarded uint64
	dropped   uint64
	other     uint64
	last      flowpb.Verdict
	dropWhy   string
	lastSeen  time.Time
	lastDrop  time.Time
	allowedBy []string
	deniedBy  []string
}

type nodeEntry struct {
	Node
	refs int // edges that name it
}

// Graph is the bounded service map. It is safe for concurrent use.
type Graph struct {
	maxEdges int
	idle     time.Duration
	now      func() time.Time

	mu       sync.Mutex
	edges    map[edgeKey]*edge
	lru      *list.List // of *edge
	nodes    map[string]*nodeEntry
	stats    Stats
	upstream Upstream
	version  uint64
	changed  chan struct{} // closed at the next change
}

// NewGraph returns an empty graph that keeps at most maxEdges edges (the
// least recently seen goes first) and forgets an edge idle for longer
// than idle. now is the clock (time.Now when nil).
func NewGraph(maxEdges int, idle time.Duration, now func() time.Time) (*Graph, error) {
	if maxEdges < 1 {
		return nil, fmt.Errorf("max edges %d: keep at least one edge", maxEdges)
	}
	if idle <= 0 {
		return nil, fmt.Errorf("idle timeout %s: give a positive duration", idle)
	}
	if now == nil {
		now = time.Now
	}
	return &Graph{
		maxEdges: maxEdges, idle: idle, now: now,
		edges:   map[edgeKey]*edge{},
		lru:     list.New(),
		nodes:   map[string]*nodeEntry{},
		stats:   Stats{MaxEdges: maxEdges, IdleTimeout: idle.String()},
		changed: make(chan struct{}),
	}, nil
}

// changedLocked records a change and wakes the watchers.
func (g *Graph) changedLocked() {
	g.version++
	close(g.changed)
	g.changed = make(chan struct{})
}

// Changed returns a channel closed at the next change of the graph.
func (g *Graph) Changed() <-chan struct{} {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.changed
}

// SetUpstream records the state of the flow source.
func (g *Graph) SetUpstream(u Upstream) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.upstream = u
	g.changedLocked()
}

// AddLost counts events the source reported lost.
func (g *Graph) AddLost(n uint64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.stats.Lost += n
	g.changedLocked()
}

// Add folds one flow into the graph. Replies (is_reply true) are counted
// and skipped: an edge goes from the side that opened the connection.
func (g *Graph) Add(f *flowpb.Flow) {
	if f == nil {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	defer g.changedLocked()
	if f.GetIsReply().GetValue() {
		g.stats.Replies++
		return
	}
	now := g.now()
	g.expireLocked(now)
	seen := now
	if t := f.GetTime(); t != nil && t.IsValid() {
		seen = t.AsTime()
	}
	src := endpointNode(f.GetSource())
	dst := endpointNode(f.GetDestination())
	port, proto := layer4(f.GetL4())
	key := edgeKey{src: src.ID, dst: dst.ID, port: port, proto: proto}
	e, ok := g.edges[key]
	if !ok && now.Sub(seen) > g.idle {
		g.stats.Stale++
		return
	}
	if !ok {
		for len(g.edges) >= g.maxEdges {
			g.removeLocked(g.lru.Back().Value.(*edge))
			g.stats.Evicted++
		}
		e = &edge{key: key}
		e.elem = g.lru.PushFront(e)
		g.edges[key] = e
		g.refNode(src)
		g.refNode(dst)
	} else {
		g.lru.MoveToFront(e.elem)
		g.updateNode(src)
		g.updateNode(dst)
	}
	g.stats.Flows++
	if seen.After(e.lastSeen) {
		e.lastSeen = seen
		e.last = f.GetVerdict()
	}
	switch f.GetVerdict() {
	case flowpb.Verdict_FORWARDED:
		e.forwarded++
	case flowpb.Verdict_DROPPED:
		e.dropped++
		if seen.After(e.lastDrop) {
			e.lastDrop = seen
			e.dropWhy = f.GetDropReasonDesc().String()
		}
	default:
		e.other++
	}
	for _, p := range f.GetIngressAllowedBy() {
		e.allowedBy = remember(e.allowedBy, policyName(p))
	}
	for _, p := range f.GetEgressAllowedBy() {
		e.allowedBy = remember(e.allowedBy, policyName(p))
	}
	for _, p := range f.GetIngressDeniedBy() {
		e.deniedBy = remember(e.deniedBy, policyName(p))
	}
	for _, p := range f.GetEgressDeniedBy() {
		e.deniedBy = remember(e.deniedBy, policyName(p))
	}
}

// remember appends name to names, moving it to the end when present and
// dropping the oldest beyond maxPolicies.
func remember(names []string, name string) []string {
	if name == "" {
		return names
	}
	if i := slices.Index(names, name); i >= 0 {
		names = slices.Delete(names, i, i+1)
	}
	names = append(names, name)
	if len(names) > maxPolicies {
		names = slices.Delete(names, 0, len(names)-maxPolicies)
	}
	return names
}

// policyName is "Kind namespace/name", or "Kind name" for cluster-wide
// policies.
func policyName(p *flowpb.Policy) string {
	name := p.GetName()
	if name == "" {
		return ""
	}
	if ns := p.GetNamespace(); ns != "" {
		name = ns + "/" + name
	}
	if k := p.GetKind(); k != "" {
		name = k + " " + name
	}
	return name
}

func (g *Graph) refNode(n Node) {
	e, ok := g.nodes[n.ID]
	if !ok {
		e = &nodeEntry{}
		g.nodes[n.ID] = e
	}
	e.refs++
	g.setNode(e, n)
}

func (g *Graph) updateNode(n Node) {
	if e, ok := g.nodes[n.ID]; ok {
		g.setNode(e, n)
	}
}

func (g *Graph) setNode(e *nodeEntry, n Node) {
	id := n.Identity
	if id == 0 {
		id = e.Identity
	}
	e.Node = n
	e.Identity = id
}

func (g *Graph) removeLocked(e *edge) {
	g.lru.Remove(e.elem)
	delete(g.edges, e.key)
	for _, id := range []string{e.key.src, e.key.dst} {
		if n, ok := g.nodes[id]; ok {
			if n.refs--; n.refs <= 0 {
				delete(g.nodes, id)
			}
		}
	}
}

// expireLocked removes edges idle for longer than the idle timeout; it
// reports whether it removed any. It walks from the least recently
// updated edge and stops at the first one still fresh: flows come roughly
// in time order, so an edge behind it that a late flow kept old goes at a
// later call.
func (g *Graph) expireLocked(now time.Time) bool {
	removed := false
	for el := g.lru.Back(); el != nil; el = g.lru.Back() {
		e := el.Value.(*edge)
		if now.Sub(e.lastSeen) <= g.idle {
			break
		}
		g.removeLocked(e)
		g.stats.Expired++
		removed = true
	}
	return removed
}

// Snapshot returns the graph now, after expiring idle edges.
func (g *Graph) Snapshot() Snapshot {
	g.mu.Lock()
	defer g.mu.Unlock()
	now := g.now()
	if g.expireLocked(now) {
		g.changedLocked()
	}
	s := Snapshot{Time: now, Version: g.version, Upstream: g.upstream, Stats: g.stats,
		Nodes: make([]Node, 0, len(g.nodes)), Edges: make([]Edge, 0, len(g.edges))}
	for _, n := range g.nodes {
		s.Nodes = append(s.Nodes, n.Node)
	}
	for _, e := range g.edges {
		s.Edges = append(s.Edges, e.export(now))
	}
	slices.SortFunc(s.Nodes, func(a, b Node) int { return strings.Compare(a.ID, b.ID) })
	slices.SortFunc(s.Edges, func(a, b Edge) int { return strings.Compare(a.ID, b.ID) })
	return s
}

func (e *edge) export(now time.Time) Edge {
	out := Edge{
		ID:          edgeID(e.key),
		Source:      e.key.src,
		Destination: e.key.dst,
		Port:        e.key.port,
		Protocol:    e.key.proto,
		Forwarded:   e.forwarded,
		Dropped:     e.dropped,
		Other:       e.other,
		LastVerdict: e.last.String(),
		LastSeen:    e.lastSeen,
		AllowedBy:   slices.Clone(e.allowedBy),
		DeniedBy:    slices.Clone(e.deniedBy),
		State:       e.state(now),
	}
	if e.dropped > 0 {
		t := e.lastDrop
		out.LastDrop = &t
		out.LastDropReason = e.dropWhy
	}
	return out
}

func (e *edge) state(now time.Time) string {
	switch {
	case e.last == flowpb.Verdict_DROPPED:
		return StateDropped
	case e.dropped > 0 && now.Sub(e.lastDrop) <= DropWindow:
		return StateDropped
	case e.last == flowpb.Verdict_FORWARDED && now.Sub(e.lastSeen) <= DropWindow:
		return StateForwarded
	}
	return StateIdle
}

func edgeID(k edgeKey) string {
	var b strings.Builder
	b.WriteString(k.src)
	b.WriteString(" -> ")
	b.WriteString(k.dst)
	switch {
	case k.proto != "" && k.port != 0:
		fmt.Fprintf(&b, " %d/%s", k.port, k.proto)
	case k.proto != "":
		b.WriteString(" " + k.proto)
	}
	return b.String()
}

// layer4 returns the destination port and protocol of a flow.
func layer4(l4 *flowpb.Layer4) (uint32, string) {
	switch {
	case l4.GetTCP() != nil:
		return l4.GetTCP().GetDestinationPort(), "TCP"
	case l4.GetUDP() != nil:
		return l4.GetUDP().GetDestinationPort(), "UDP"
	case l4.GetSCTP() != nil:
		return l4.GetSCTP().GetDestinationPort(), "SCTP"
	case l4.GetICMPv4() != nil:
		return 0, "ICMPv4"
	case l4.GetICMPv6() != nil:
		return 0, "ICMPv6"
	}
	return 0, ""
}

// reservedIdentities are Cilium's reserved numeric identities by name.
var reservedIdentities = map[uint32]string{
	1: "host", 2: "world", 3: "unmanaged", 4: "health", 5: "init",
	6: "remote-node", 7: "kube-apiserver", 8: "ingress", 9: "world", 10: "world",
}

// localIdentityScope is the first identity of the node-local scope (CIDR
// identities): traffic to and from outside the cluster.
const localIdentityScope = 1 << 24

// endpointNode maps a flow endpoint to its node of the map.
func endpointNode(ep *flowpb.Endpoint) Node {
	if ns := ep.GetNamespace(); ns != "" || ep.GetPodName() != "" {
		n := Node{Namespace: ns, Name: ep.GetPodName(), Kind: "Pod", Identity: ep.GetIdentity()}
		if w := ep.GetWorkloads(); len(w) > 0 && w[0].GetName() != "" {
			n.Name, n.Kind = w[0].GetName(), w[0].GetKind()
		}
		if n.Name == "" {
			n.Name = "unknown"
		}
		n.ID = ns + "/" + n.Name
		return n
	}
	name := ""
	for _, l := range ep.GetLabels() {
		if r, ok := strings.CutPrefix(l, "reserved:"); ok {
			name = r
			break
		}
		if strings.HasPrefix(l, "cidr:") || strings.HasPrefix(l, "fqdn:") {
			name = "world"
		}
	}
	if name == "" {
		name = reservedIdentities[ep.GetIdentity()]
	}
	if name == "" && ep.GetIdentity() >= localIdentityScope {
		name = "world"
	}
	if strings.HasPrefix(name, "world") {
		name = "world" // world-ipv4, world-ipv6
	}
	if name == "" {
		name = "unknown"
	}
	return Node{ID: "reserved:" + name, Name: name, Kind: "reserved", Identity: ep.GetIdentity()}
}
