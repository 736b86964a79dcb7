package servicemap_test

import (
	"bufio"
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"

	flowpb "github.com/cilium/cilium/api/v1/flow"
	"github.com/cilium/statedb"
	"google.golang.org/protobuf/types/known/timestamppb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/cellium/cellium/cells/agentapi"
	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/cells/hive/hivetest"
	"github.com/cellium/cellium/cells/hubble"
	"github.com/cellium/cellium/cells/hubble/observer"
	"github.com/cellium/cellium/cells/identity"
	"github.com/cellium/cellium/cells/k8s"
	"github.com/cellium/cellium/cells/servicemap"
	"github.com/cellium/cellium/statedb/nodes"
)

// agent is the agent's real Hubble server: the observer cell (ring buffer,
// Observer and Peer gRPC services on a unix socket) in a partial hive, with
// stand-ins for the node name, the cluster name and the nodes table. Flows
// go in through its sink, as the agent's flow producer writes them.
type agent struct {
	h      *hive.Hive
	sinks  []hubble.Sink
	socket string
	db     *statedb.DB
	nodes  statedb.RWTable[*nodes.Node]
}

// newAgent starts the agent's Hubble server on socket, with more agent
// flags in args (--hubble-listen-address, ...).
func newAgent(t *testing.T, socket string, args ...string) *agent {
	t.Helper()
	dir := filepath.Dir(socket)
	a := &agent{socket: socket}
	var in hubble.SinksIn
	a.h = hivetest.New(t, append([]string{"--hubble-socket-path=" + socket}, args...),
		hive.Provide(
			func() agentapi.Config { return agentapi.Config{SocketPath: filepath.Join(dir, "cellium.sock")} },
			func() k8s.NodeName { return "node-1" },
			func() identity.ClusterName { return "default" },
			nodes.NewNodesTable, statedb.RWTable[*nodes.Node].ToTable,
		),
		hive.Config(hubble.DefaultConfig), observer.Cell,
		hivetest.Capture(&in), hivetest.Capture(&a.db), hivetest.Capture(&a.nodes),
	)
	if err := a.h.Start(context.Background()); err != nil {
		t.Fatalf("start the agent's Hubble server: %v", err)
	}
	a.sinks = in.Sinks
	return a
}

// startAgent starts an agent that stops when the test ends.
func startAgent(t *testing.T, socket string, args ...string) *agent {
	t.Helper()
	a := newAgent(t, socket, args...)
	t.Cleanup(func() { a.stop(t) })
	return a
}

func (a *agent) stop(t *testing.T) {
	t.Helper()
	if a.h == nil {
		return
	}
	if err := a.h.Stop(context.Background()); err != nil {
		t.Errorf("stop the agent: %v", err)
	}
	a.h = nil
}

// addNode puts a node into the agent's nodes table: its Peer service
// announces it to hubble-relay.
func (a *agent) addNode(t *testing.T, name, ip string) {
	t.Helper()
	txn := a.db.WriteTxn(a.nodes)
	n := &nodes.Node{Name: name, Source: nodes.SourceCustomResource,
		Addresses: []nodes.Address{{Type: nodes.AddressInternalIP, IP: netip.MustParseAddr(ip)}}}
	if _, _, err := a.nodes.Insert(txn, n); err != nil {
		t.Fatal(err)
	}
	txn.Commit()
}

func (a *agent) send(f *flowpb.Flow) {
	for _, s := range a.sinks {
		s.OnFlow(f)
	}
}

func endpoint(ns, pod, workload string, id uint32) *flowpb.Endpoint {
	return &flowpb.Endpoint{Namespace: ns, PodName: pod, Identity: id, ClusterName: "default",
		Labels:    []string{"k8s:app=" + workload, "k8s:io.kubernetes.pod.namespace=" + ns},
		Workloads: []*flowpb.Workload{{Kind: "Deployment", Name: workload}}}
}

var (
	web1 = endpoint("demo", "web-1", "web", 12001)
	db0  = endpoint("demo", "db-0", "db", 12002)
)

// deniedFlow is web-1 to db-0 on TCP 6379 dropped by db-deny-redis, as the
// agent's parser writes a policy drop.
func deniedFlow() *flowpb.Flow {
	return &flowpb.Flow{
		Time: timestamppb.Now(), NodeName: "node-1", Type: flowpb.FlowType_L3_L4,
		Verdict: flowpb.Verdict_DROPPED, DropReason: 133, DropReasonDesc: flowpb.DropReason_POLICY_DENIED,
		EventType: &flowpb.CiliumEventType{Type: 1, SubType: 133},
		Source:    web1, Destination: db0,
		IP: &flowpb.IP{Source: "10.244.1.5", Destination: "10.244.1.9", IpVersion: flowpb.IPVersion_IPv4},
		L4: &flowpb.Layer4{Protocol: &flowpb.Layer4_TCP{TCP: &flowpb.TCP{SourcePort: 41000, DestinationPort: 6379,
			Flags: &flowpb.TCPFlags{SYN: true}}}},
		TrafficDirection: flowpb.TrafficDirection_INGRESS,
		IsReply:          wrapperspb.Bool(false),
		IngressDeniedBy:  []*flowpb.Policy{{Kind: "CiliumNetworkPolicy", Namespace: "demo", Name: "db-deny-redis"}},
		Summary:          "TCP Flags: SYN",
	}
}

// allowedFlow is web-1 to db-0 on TCP 5432, a policy verdict allowed by
// db-allow-web.
func allowedFlow() *flowpb.Flow {
	return &flowpb.Flow{
		Time: timestamppb.Now(), NodeName: "node-1", Type: flowpb.FlowType_L3_L4,
		Verdict:   flowpb.Verdict_FORWARDED,
		EventType: &flowpb.CiliumEventType{Type: 5},
		Source:    web1, Destination: db0,
		IP: &flowpb.IP{Source: "10.244.1.5", Destination: "10.244.1.9", IpVersion: flowpb.IPVersion_IPv4},
		L4: &flowpb.Layer4{Protocol: &flowpb.Layer4_TCP{TCP: &flowpb.TCP{SourcePort: 40000, DestinationPort: 5432,
			Flags: &flowpb.TCPFlags{SYN: true}}}},
		TrafficDirection: flowpb.TrafficDirection_INGRESS,
		IsReply:          wrapperspb.Bool(false),
		PolicyMatchType:  2,
		IngressAllowedBy: []*flowpb.Policy{{Kind: "CiliumNetworkPolicy", Namespace: "demo", Name: "db-allow-web"}},
		Summary:          "TCP Flags: SYN",
	}
}

const (
	deniedEdge  = "demo/web -> demo/db 6379/TCP"
	allowedEdge = "demo/web -> demo/db 5432/TCP"
)

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// startMap runs the operator's service map cell against relay and returns
// the page's base URL.
func startMap(t *testing.T, relay string, args ...string) string {
	t.Helper()
	addr := freeAddr(t)
	hivetest.Start(t, append([]string{
		"--hubble-service-map-listen-address=" + addr,
		"--hubble-relay-address=" + relay,
	}, args...), servicemap.Cell)
	return "http://" + addr
}

func getGraph(t *testing.T, base string) servicemap.Snapshot {
	t.Helper()
	resp, err := http.Get(base + "/api/graph")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /api/graph: %s", resp.Status)
	}
	var s servicemap.Snapshot
	if err := json.NewDecoder(resp.Body).Decode(&s); err != nil {
		t.Fatalf("decode /api/graph: %v", err)
	}
	return s
}

// waitGraph polls /api/graph until cond holds.
func waitGraph(t *testing.T, base, what string, cond func(servicemap.Snapshot) bool) servicemap.Snapshot {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	var s servicemap.Snapshot
	for time.Now().Before(deadline) {
		if s = getGraph(t, base); cond(s) {
			return s
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("timed out waiting for %s; last graph: upstream %+v, stats %+v, edges %+v", what, s.Upstream, s.Stats, s.Edges)
	return s
}

func findEdge(s servicemap.Snapshot, id string) (servicemap.Edge, bool) {
	for _, e := range s.Edges {
		if e.ID == id {
			return e, true
		}
	}
	return servicemap.Edge{}, false
}

// readEvent reads the next Server-Sent Event's data.
func readEvent(t *testing.T, r *bufio.Reader) string {
	t.Helper()
	var event, data string
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			t.Fatalf("read event: %v", err)
		}
		line = strings.TrimRight(line, "\n")
		switch {
		case line == "":
			if event != "graph" {
				t.Fatalf("event %q, want graph", event)
			}
			return data
		case strings.HasPrefix(line, "event: "):
			event = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: "):
			data += strings.TrimPrefix(line, "data: ")
		default:
			t.Fatalf("unexpected line %q", line)
		}
	}
}

// socketPath is a Hubble socket path in a fresh temp dir.
func socketPath(t *testing.T) string {
	t.Helper()
	return filepath.Join(t.TempDir(), "hubble.sock")
}
