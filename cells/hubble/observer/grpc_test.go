package observer_test

import (
	"context"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	flowpb "github.com/cilium/cilium/api/v1/flow"
	observerpb "github.com/cilium/cilium/api/v1/observer"
	peerpb "github.com/cilium/cilium/api/v1/peer"
	"github.com/cilium/statedb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/fieldmaskpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/cellium/cellium/cells/agentapi"
	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/cells/hive/hivetest"
	"github.com/cellium/cellium/cells/hubble"
	"github.com/cellium/cellium/cells/hubble/observer"
	"github.com/cellium/cellium/cells/identity"
	"github.com/cellium/cellium/cells/k8s"
	"github.com/cellium/cellium/statedb/nodes"
)

func TestGetFlowsNumberFirstSinceUntil(t *testing.T) {
	a := startAgent(t)
	c := a.client(t)
	end := time.Now()
	feed(a, 0, 1000, end)

	flows, _, err := getFlows(t, c, &observerpb.GetFlowsRequest{Number: 10})
	if err != nil || len(flows) != 10 || flows[9].GetUuid() != "flow-999" || flows[0].GetUuid() != "flow-990" {
		t.Fatalf("last 10: %d flows (%v), err %v", len(flows), uuids(flows), err)
	}
	flows, _, err = getFlows(t, c, &observerpb.GetFlowsRequest{Number: 3, First: true})
	if err != nil || len(flows) != 3 || flows[0].GetUuid() != "flow-0" {
		t.Fatalf("first 3: %v, err %v", uuids(flows), err)
	}
	// The last 5 drops (every 4th flow).
	flows, _, err = getFlows(t, c, &observerpb.GetFlowsRequest{Number: 5,
		Whitelist: []*flowpb.FlowFilter{{Verdict: []flowpb.Verdict{flowpb.Verdict_DROPPED}}}})
	if err != nil || len(flows) != 5 || flows[4].GetUuid() != "flow-999" || flows[0].GetUuid() != "flow-983" {
		t.Fatalf("last 5 drops: %v, err %v", uuids(flows), err)
	}
	// --all asks for 2^64-1: everything the ring holds.
	flows, _, err = getFlows(t, c, &observerpb.GetFlowsRequest{Number: ^uint64(0)})
	if err != nil || len(flows) != 1000 {
		t.Fatalf("all: %d flows, err %v", len(flows), err)
	}
	// since/until: flows 900..909 are at end-99ms .. end-90ms.
	flows, _, err = getFlows(t, c, &observerpb.GetFlowsRequest{
		Since: timestamppb.New(end.Add(-99 * time.Millisecond)), Until: timestamppb.New(end.Add(-90 * time.Millisecond))})
	if err != nil || len(flows) != 10 || flows[0].GetUuid() != "flow-900" {
		t.Fatalf("since/until: %v, err %v", uuids(flows), err)
	}
	// A field mask keeps only the fields asked for.
	flows, _, err = getFlows(t, c, &observerpb.GetFlowsRequest{Number: 1,
		FieldMask: &fieldmaskpb.FieldMask{Paths: []string{"verdict", "source.pod_name"}}})
	if err != nil || len(flows) != 1 || flows[0].GetVerdict() != flowpb.Verdict_DROPPED ||
		flows[0].GetSource().GetPodName() != "web-1" || flows[0].GetSource().GetNamespace() != "" || flows[0].GetIP() != nil {
		t.Fatalf("field mask: %v, err %v", flows, err)
	}

	st, err := c.ServerStatus(context.Background(), &observerpb.ServerStatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if st.GetNumFlows() != 1000 || st.GetMaxFlows() != 4095 || st.GetSeenFlows() != 1000 || st.GetUptimeNs() == 0 ||
		st.GetNumConnectedNodes() != nil || !strings.HasPrefix(st.GetVersion(), "cellium ") || st.GetFlowsRate() <= 0 {
		t.Fatalf("server status: %v", st)
	}
	ns, err := c.GetNamespaces(context.Background(), &observerpb.GetNamespacesRequest{})
	if err != nil || len(ns.GetNamespaces()) != 2 || ns.GetNamespaces()[0].GetNamespace() != "demo" || ns.GetNamespaces()[1].GetNamespace() != "kube-system" {
		t.Fatalf("namespaces: %v, %v", ns, err)
	}
	if _, err := c.GetNodes(context.Background(), &observerpb.GetNodesRequest{}); status.Code(err) != codes.Unimplemented {
		t.Fatalf("GetNodes on an agent: %v, want Unimplemented (the relay answers it)", err)
	}
}

func TestGetFlowsBadRequests(t *testing.T) {
	a := startAgent(t)
	c := a.client(t)
	now := time.Now()
	for _, tc := range []struct {
		req  *observerpb.GetFlowsRequest
		code codes.Code
		want string
	}{
		{&observerpb.GetFlowsRequest{First: true, Follow: true}, codes.InvalidArgument, "first cannot be specified with follow"},
		{&observerpb.GetFlowsRequest{Since: timestamppb.New(now), Until: timestamppb.New(now.Add(-time.Hour))}, codes.InvalidArgument, "is after until"},
		{&observerpb.GetFlowsRequest{Since: &timestamppb.Timestamp{Seconds: -1 << 40}}, codes.InvalidArgument, "invalid since timestamp"},
		{&observerpb.GetFlowsRequest{Whitelist: []*flowpb.FlowFilter{{DestinationFqdn: []string{"*.example.com"}}}}, codes.Unimplemented, "destination_fqdn"},
		{&observerpb.GetFlowsRequest{Blacklist: []*flowpb.FlowFilter{{SourceIp: []string{"not-an-ip"}}}}, codes.InvalidArgument, "not an IP address"},
		{&observerpb.GetFlowsRequest{FieldMask: &fieldmaskpb.FieldMask{Paths: []string{"no_such_field"}}}, codes.InvalidArgument, "invalid field mask"},
	} {
		_, _, err := getFlows(t, c, tc.req)
		if status.Code(err) != tc.code || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: got %v, want %s containing %q", tc.req, err, tc.code, tc.want)
		}
	}
}

// Lost datapath events reach readers as LostEvents, not counted as flows.
func TestGetFlowsDeliversLostEvents(t *testing.T) {
	a := startAgent(t)
	c := a.client(t)
	feed(a, 0, 2, time.Now())
	a.OnLost(&flowpb.LostEvent{Source: flowpb.LostEventSource_PERF_EVENT_RING_BUFFER, NumEventsLost: 7, Cpu: nil})
	feed(a, 2, 2, time.Now())
	flows, lost, err := getFlows(t, c, &observerpb.GetFlowsRequest{})
	if err != nil || len(flows) != 4 || len(lost) != 1 || lost[0].GetNumEventsLost() != 7 || lost[0].GetSource() != flowpb.LostEventSource_PERF_EVENT_RING_BUFFER {
		t.Fatalf("flows %d lost %v err %v", len(flows), lost, err)
	}
}

func TestGetFlowsFollow(t *testing.T) {
	a := startAgent(t)
	c := a.client(t)
	feed(a, 0, 100, time.Now())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stream, err := c.GetFlows(ctx, &observerpb.GetFlowsRequest{Follow: true, Number: 2})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"flow-98", "flow-99"} {
		resp, err := stream.Recv()
		if err != nil || resp.GetFlow().GetUuid() != want {
			t.Fatalf("got %v, %v; want %s", resp, err, want)
		}
	}
	feed(a, 100, 1, time.Now())
	resp, err := stream.Recv()
	if err != nil || resp.GetFlow().GetUuid() != "flow-100" || resp.GetNodeName() != "node-1" {
		t.Fatalf("followed flow: %v, %v", resp, err)
	}
}

// A client that never reads its stream costs the agent a bounded amount
// of memory, whatever the flow rate, and when it reads again it is told
// how many flows it lost.
func TestSlowReaderBoundedMemoryAndLostCount(t *testing.T) {
	a := startAgent(t)
	conn, err := grpc.NewClient("unix://"+a.socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c := observerpb.NewObserverClient(conn)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stream, err := c.GetFlows(ctx, &observerpb.GetFlowsRequest{Follow: true})
	if err != nil {
		t.Fatal(err)
	}
	// Make sure the server-side stream runs before the flood: a flow
	// arrives.
	untilReceived(t, a, func() error { _, err := stream.Recv(); return err })
	heap := func() uint64 {
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return ms.HeapAlloc
	}
	// Fill the ring once so that its own memory is in the baseline.
	feed(a, 1, 4095, time.Now())
	before := heap()
	const flood = 200000
	feed(a, 4096, flood, time.Now())
	after := heap()
	grown := int64(after) - int64(before)
	t.Logf("heap before %d KiB, after %d flows %d KiB (grew %d KiB)", before>>10, flood, after>>10, grown>>10)
	// The flood is ~240 MB of flows; a per-client queue would keep it.
	// (The heap is the agent's and the client's: the client may buffer
	// up to its gRPC flow control window.)
	if grown > 32<<20 {
		t.Fatalf("the heap grew by %d MiB while a client did not read", grown>>20)
	}
	// Read everything up to a last flow written after the flood: the
	// flows its stream had buffered and the rest counted in LostEvents,
	// at most one a second (the last may come after that flow).
	last := demoFlow(0, time.Now())
	last.Uuid = "after-the-flood"
	a.OnFlow(last)
	var lost uint64
	var got, lostEvents int
	seenLast := false
	for !seenLast || uint64(got)+lost < flood+4095 {
		resp, err := stream.Recv()
		if err != nil {
			t.Fatalf("after %d flows and %d lost: %v", got, lost, err)
		}
		if l := resp.GetLostEvents(); l != nil {
			if l.GetSource() != flowpb.LostEventSource_HUBBLE_RING_BUFFER {
				t.Fatalf("lost event from %v, want HUBBLE_RING_BUFFER", l.GetSource())
			}
			lost += l.GetNumEventsLost()
			lostEvents++
			continue
		}
		got++
		seenLast = seenLast || resp.GetFlow().GetUuid() == "after-the-flood"
	}
	t.Logf("the slow reader got %d flows and %d LostEvents counting %d lost", got, lostEvents, lost)
	if lost < flood/2 || uint64(got)+lost != flood+4095+1 {
		t.Fatalf("got %d + lost %d, want %d with most of them lost", got, lost, flood+4095+1)
	}
	if fi, err := os.Stat(a.socket); err != nil || fi.Mode().Perm() != 0o660 {
		t.Fatalf("hubble socket mode: %v %v, want 0660", fi.Mode(), err)
	}
}

func TestPeerNotify(t *testing.T) {
	a := startAgent(t, "--hubble-listen-address=127.0.0.1:4299", "--hubble-disable-tls")
	a.addNode(t, "node-1", "10.0.0.1")
	conn, err := grpc.NewClient("unix://"+a.socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stream, err := peerpb.NewPeerClient(conn).Notify(ctx, &peerpb.NotifyRequest{})
	if err != nil {
		t.Fatal(err)
	}
	expect := func(typ peerpb.ChangeNotificationType, name, addr string) {
		t.Helper()
		cn, err := stream.Recv()
		if err != nil || cn.GetType() != typ || cn.GetName() != name || cn.GetAddress() != addr || cn.GetTls() != nil {
			t.Fatalf("got %v, %v; want %v %s %s without TLS", cn, err, typ, name, addr)
		}
	}
	expect(peerpb.ChangeNotificationType_PEER_ADDED, "node-1", "10.0.0.1:4299")
	a.addNode(t, "node-2", "10.0.0.2")
	expect(peerpb.ChangeNotificationType_PEER_ADDED, "node-2", "10.0.0.2:4299")
	a.addNode(t, "node-2", "10.0.0.3")
	expect(peerpb.ChangeNotificationType_PEER_UPDATED, "node-2", "10.0.0.3:4299")
	a.deleteNode(t, "node-1")
	expect(peerpb.ChangeNotificationType_PEER_DELETED, "node-1", "10.0.0.1:4299")
}

// untilReceived feeds a flow every 10ms until recv returns: a follower
// that starts at the end of the ring only sees flows written after its
// server-side stream started.
func untilReceived(t *testing.T, a *agent, recv func() error) {
	t.Helper()
	done := make(chan struct{})
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		for i := 0; ; i++ {
			select {
			case <-done:
				return
			case <-time.After(10 * time.Millisecond):
				a.OnFlow(demoFlow(i, time.Now()))
			}
		}
	}()
	err := recv()
	close(done)
	<-stopped
	if err != nil {
		t.Fatal(err)
	}
}

func uuids(fs []*flowpb.Flow) []string {
	out := make([]string, len(fs))
	for i, f := range fs {
		out[i] = f.GetUuid()
	}
	return out
}

// Stopping the agent ends open follow and Notify streams at once (a
// graceful stop does not wait for followers that never end) and removes
// the socket; goleak (TestMain) checks nothing is left running.
func TestStopEndsFollowers(t *testing.T) {
	dir := t.TempDir()
	sock := dir + "/hubble.sock"
	var in hubble.SinksIn
	a := &agent{socket: sock}
	h := hivetest.New(t, []string{"--hubble-socket-path=" + sock},
		hive.Provide(
			func() agentapi.Config { return agentapi.Config{SocketPath: dir + "/cellium.sock"} },
			func() k8s.NodeName { return "node-1" },
			func() identity.ClusterName { return "default" },
			nodes.NewNodesTable, statedb.RWTable[*nodes.Node].ToTable,
		),
		hive.Config(hubble.DefaultConfig), observer.Cell, hivetest.Capture(&in), hivetest.Capture(&a.db), hivetest.Capture(&a.nodes))
	if err := h.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	a.sinks = in.Sinks
	a.OnFlow(demoFlow(0, time.Now()))
	a.addNode(t, "node-1", "10.0.0.1")
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx := context.Background()
	flows, err := observerpb.NewObserverClient(conn).GetFlows(ctx, &observerpb.GetFlowsRequest{Follow: true, Number: 1})
	if err != nil {
		t.Fatal(err)
	}
	peers, err := peerpb.NewPeerClient(conn).Notify(ctx, &peerpb.NotifyRequest{})
	if err != nil {
		t.Fatal(err)
	}
	// Both streams are served: each has sent its first message.
	if _, err := flows.Recv(); err != nil {
		t.Fatal(err)
	}
	if _, err := peers.Recv(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := h.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("stop took %s with followers open", d)
	}
	if _, err := flows.Recv(); err == nil {
		t.Fatal("the follow stream is still open after stop")
	}
	if _, err := peers.Recv(); err == nil {
		t.Fatal("the Notify stream is still open after stop")
	}
	if _, err := os.Stat(sock); !os.IsNotExist(err) {
		t.Fatalf("the socket is still there after stop: %v", err)
	}
}
