package benchdatapath

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	flowpb "github.com/cilium/cilium/api/v1/flow"
	observerpb "github.com/cilium/cilium/api/v1/observer"
	"github.com/containernetworking/plugins/pkg/ns"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/encoding/protojson"
	// Flows carry their provenance in an Any of a Struct: registered so
	// that protojson resolves it.
	_ "google.golang.org/protobuf/types/known/structpb"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	api "github.com/cellium/cellium/api/policy"
	"github.com/cellium/cellium/datapath/maps"
	"github.com/cellium/cellium/test/devkubelet"
	"github.com/cellium/cellium/test/harness"
)

// The Hubble bench: one real cellium-agent with its BPF datapath in a
// node namespace (the control-plane bench's setup: API server, etcd,
// operator, devkubelet), two pods, and a CiliumNetworkPolicy that lets
// the client pod reach the server pod on TCP hbAllowedPort only, so that
// UDP to hbDeniedPort is dropped with "Policy denied". It measures,
// through the entry points users use:
//
//   - latency: single UDP datagrams from the client to the denied port,
//     each from a source port of its own, timed from the send to the line
//     the upstream `hubble observe --follow --type drop -o json` prints
//     for it (against the agent's hubble.sock);
//   - a flood: the client pod sends to the denied port as fast as one
//     process can (a sendto loop in the pod's namespace) while a
//     `hubble observe --follow` reader runs, another client calls
//     ServerStatus and GetFlows --last 1 every StatusEvery, and the
//     agent's RSS is sampled; the datapath's drop counter, the flows the
//     agent made and the LostEvents the reader got are set side by side.
const (
	hbAllowedPort = 8080
	hbDeniedPort  = 9999
	// hbFirstSourcePort is the source port of the first latency sample;
	// sample i uses hbFirstSourcePort+i.
	hbFirstSourcePort = 20000
	// hbFloodSourcePort is the flood's source port (not a sample's).
	hbFloodSourcePort = 19999
)

// Aims of the Hubble rows.
const (
	AimHubbleDropLatency = 100 * time.Millisecond // dropped packet -> hubble observe --follow line, p99
	// AimHubbleRSSGrowth bounds the agent's RSS growth during the flood:
	// the ring at its default size holds 4095 flows (~5 MB with their
	// protobufs), the event queue 2048 events, the streams their gRPC
	// windows; the Go heap may double before a collection (GOGC=100).
	AimHubbleRSSGrowth = 64 << 20
	// AimHubbleStatusLatency bounds a ServerStatus call during the flood,
	// p99: the agent stays responsive.
	AimHubbleStatusLatency = 100 * time.Millisecond
)

// hbMetricsAddr is where the agent serves its Prometheus metrics: node 1's
// address on the bench's bridge.
const hbMetricsAddr = "10.94.0.1:9962"

// floodEnv, when set in a process's environment, makes FloodMain flood:
// "ADDR:PORT,SOURCEPORT,DURATION".
const floodEnv = "CELLIUM_BENCH_HUBBLE_FLOOD"

// HubbleConfig sizes the Hubble bench.
type HubbleConfig struct {
	// Samples is the number of latency samples.
	Samples int
	// SampleTimeout is how long a sample waits for its line before it
	// counts as missed.
	SampleTimeout time.Duration
	// Flood is how long the client pod floods the denied port (0: no
	// flood).
	Flood time.Duration
	// StatusEvery is the gap between the responsiveness probes during the
	// flood (ServerStatus, GetFlows with number 1).
	StatusEvery time.Duration
	// BinDir holds cellium-agent, cellium-operator and cellium-cni (make
	// build's bin/); empty builds them into a temporary directory.
	BinDir string
	// Hubble is the upstream hubble CLI; empty takes the cached one
	// (make hubble-binaries).
	Hubble string
	// Log receives the harness's and the node's progress; nil discards.
	Log *slog.Logger
}

// HubbleResult is what RunHubble measured.
type HubbleResult struct {
	// Latency: datagram sent -> its line printed by hubble observe
	// --follow; Missed counts the samples without a line in time.
	Latency []time.Duration
	Missed  int
	Flood   FloodResult
	// LoadBefore and LoadAfter are /proc/loadavg around the run.
	LoadBefore, LoadAfter string
}

// FloodResult holds the flood's figures.
type FloodResult struct {
	Duration time.Duration
	// Sent is the datagrams the flooder sent.
	Sent uint64
	// DatapathDrops is the growth of the datapath's "Policy denied"
	// counter (cellium_metrics) over the flood.
	DatapathDrops uint64
	// SeenFlows is the growth of ServerStatus' seen_flows: the flows the
	// agent made and kept in its ring.
	SeenFlows uint64
	// FollowFlows are the drop flows the hubble observe --follow reader
	// printed; FollowLost the events its LostEvents counted, by source.
	FollowFlows uint64
	FollowLost  map[string]uint64
	// FollowLostEvents is the number of LostEvent lines, by source.
	FollowLostEvents map[string]int
	// Status and Last are the latencies of ServerStatus and of GetFlows
	// with number 1 (to its end) during the flood; StatusErrors counts
	// failed calls.
	Status, Last []time.Duration
	StatusErrors int
	// Produced, QueueLost and SourceLost are the agent's own counters
	// over the flood: flows made (every type), events lost in the flow
	// producer's queue (OBSERVER_EVENTS_QUEUE) and in the datapath's ring
	// buffer (PERF_EVENT_RING_BUFFER).
	Produced, QueueLost, SourceLost uint64
	// RSS of the agent: before the flood, the peak sampled, after it
	// settled; HWM is VmHWM (the kernel's peak) after the flood.
	RSSBefore, RSSPeak, RSSAfter, HWM uint64
}

// FloodMain runs the flooder when the process was started as one (the
// bench starts itself in the client pod's namespace with floodEnv set):
// it sends for the given duration, prints the count and reports true.
// Otherwise it does nothing and reports false. Call it first in main and
// TestMain.
func FloodMain() (bool, error) {
	spec := os.Getenv(floodEnv)
	if spec == "" {
		return false, nil
	}
	parts := strings.Split(spec, ",")
	if len(parts) != 3 {
		return true, fmt.Errorf("%s=%q: want ADDR:PORT,SOURCEPORT,DURATION", floodEnv, spec)
	}
	dst, err := netip.ParseAddrPort(parts[0])
	if err != nil {
		return true, fmt.Errorf("%s: %w", floodEnv, err)
	}
	sport, err := strconv.Atoi(parts[1])
	if err != nil {
		return true, fmt.Errorf("%s: %w", floodEnv, err)
	}
	d, err := time.ParseDuration(parts[2])
	if err != nil {
		return true, fmt.Errorf("%s: %w", floodEnv, err)
	}
	c, err := net.DialUDP("udp4", &net.UDPAddr{Port: sport}, net.UDPAddrFromAddrPort(dst))
	if err != nil {
		return true, fmt.Errorf("flood: %w", err)
	}
	defer c.Close()
	payload := make([]byte, 16)
	var sent uint64
	end := time.Now().Add(d)
	for {
		for range 256 {
			if _, err := c.Write(payload); err == nil {
				sent++
			}
		}
		if time.Now().After(end) {
			break
		}
	}
	fmt.Println(sent)
	return true, nil
}

// hbPod is one of the bench's pods: its namespace and address.
type hbPod struct {
	name  string
	netns string
	ip    netip.Addr
}

// RunHubble starts the control plane and one node with two pods and the
// policy, measures, prints the figures and the aims to w and removes
// everything.
func RunHubble(ctx context.Context, cfg HubbleConfig, w io.Writer) (res HubbleResult, err error) {
	switch {
	case cfg.Samples < 1:
		return res, fmt.Errorf("hubble bench: %d samples: give at least 1 (the aim's p99 wants 200 or more)", cfg.Samples)
	case cfg.SampleTimeout <= 0:
		return res, fmt.Errorf("hubble bench: sample timeout %s: give a positive duration such as 2s", cfg.SampleTimeout)
	case cfg.Flood > 0 && cfg.StatusEvery <= 0:
		return res, fmt.Errorf("hubble bench: status probe interval %s: give a positive duration such as 100ms", cfg.StatusEvery)
	}
	if cfg.Hubble == "" {
		bins, ok := harness.CachedHubble()
		if !ok {
			return res, errors.New("hubble bench: the upstream hubble CLI is not built: run make hubble-binaries")
		}
		cfg.Hubble = bins.Hubble
	}
	if err := lookPath("nsenter"); err != nil {
		return res, err
	}
	res.LoadBefore = loadAvg()
	start := time.Now()
	p, stop, err := startControlPlane(ctx, ControlPlaneConfig{Nodes: 1, BinDir: cfg.BinDir, Log: cfg.Log}, "cellium-bhb-")
	if err != nil {
		return res, err
	}
	defer func() {
		if cerr := stop(); cerr != nil {
			err = errors.Join(err, fmt.Errorf("clean up: %w", cerr))
		}
	}()
	var mc cleanups
	defer func() {
		if cerr := mc.run(); cerr != nil {
			err = errors.Join(err, fmt.Errorf("stop the node: %w", cerr))
		}
	}()
	// The agent serves its metrics on its node's address, which the
	// bench reaches over the bridge.
	n, err := p.startNode(ctx, &mc, "tunnel", 1, "--prometheus-serve-addr="+hbMetricsAddr)
	if err != nil {
		return res, err
	}
	client, server, err := p.hubblePods(ctx, &mc, n)
	if err != nil {
		return res, err
	}
	cnps := p.cilium.CiliumV2().CiliumNetworkPolicies(cpNamespace)
	if _, err := cnps.Create(ctx, hbCNP(), metav1.CreateOptions{}); err != nil {
		return res, err
	}
	mc.add(func() error { return cnps.Delete(context.Background(), "hb-allow-8080", metav1.DeleteOptions{}) })
	sock := filepath.Join(filepath.Dir(n.dn.AgentConfig().SocketPath()), "hubble.sock")
	fmt.Fprintf(w, "hubble: one agent (pid %d) with its BPF datapath in node %s, up in %s; pods %s (%s) -> %s (%s), UDP/%d denied by CNP hb-allow-8080 (TCP/%d only); %s\n",
		n.dn.Agent().Pid(), n.name, time.Since(start).Round(time.Millisecond), client.name, client.ip, server.name, server.ip,
		hbDeniedPort, hbAllowedPort, sock)

	obs, err := startObserve(ctx, cfg.Hubble, sock)
	if err != nil {
		return res, err
	}
	defer obs.stop()
	sender := &udpSender{netns: client.netns, dst: netip.AddrPortFrom(server.ip, hbDeniedPort)}
	// The policy is enforced and the reader follows once a drop shows.
	if err := warmUp(ctx, sender, obs); err != nil {
		// What the agent has: its last flows, for the error.
		last, _ := exec.CommandContext(ctx, cfg.Hubble, "observe", "--last", "10", "--server", "unix://"+sock).CombinedOutput()
		return res, fmt.Errorf("%w; the agent's last flows:\n%s(agent log %s)", err, last, n.dn.Agent().LogFile())
	}
	fmt.Fprintf(w, "  latency: %d datagrams, one at a time, each from its own source port...\n", cfg.Samples)
	for i := range cfg.Samples {
		d, ok, err := sample(ctx, sender, obs, uint16(hbFirstSourcePort+i), cfg.SampleTimeout)
		if err != nil {
			return res, fmt.Errorf("sample %d: %w", i+1, err)
		}
		if !ok {
			res.Missed++
			continue
		}
		res.Latency = append(res.Latency, d)
		// A gap, so that samples do not queue behind each other.
		time.Sleep(5 * time.Millisecond)
	}
	obs.stop()

	if cfg.Flood > 0 {
		fmt.Fprintf(w, "  flood: %s of UDP to the denied port, as fast as one sender goes...\n", cfg.Flood)
		if res.Flood, err = flood(ctx, cfg, n, client, server, sock); err != nil {
			return res, fmt.Errorf("flood: %w", err)
		}
	}
	res.LoadAfter = loadAvg()
	res.Write(w)
	return res, nil
}

// hubblePods runs the client (app=hb-client) and server (app=hb-server)
// pods on n and returns their namespaces and addresses.
func (p *controlPlane) hubblePods(ctx context.Context, mc *cleanups, n *cpNode) (client, server hbPod, err error) {
	client, server = hbPod{name: "hb-client"}, hbPod{name: "hb-server"}
	for _, pod := range []*hbPod{&client, &server} {
		if err := p.createPod(ctx, mc, n, pod.name, map[string]string{"app": pod.name}); err != nil {
			return client, server, err
		}
	}
	deadline := time.Now().Add(90 * time.Second)
	for _, pod := range []*hbPod{&client, &server} {
		if _, _, err := p.waitEndpoint(ctx, n, pod.name, deadline); err != nil {
			return client, server, err
		}
		// The kubelet records the sandbox's address after CNI ADD
		// returned, which may be after the endpoint is ready.
		var sb *devkubelet.Sandbox
		for sb == nil {
			for _, s := range n.dn.Kubelet().Sandboxes() {
				if s.Namespace == cpNamespace && s.Name == pod.name && s.NetnsPath != "" && s.IP != "" {
					sb = &s
					break
				}
			}
			if sb != nil {
				break
			}
			if time.Now().After(deadline) {
				return client, server, fmt.Errorf("pod %s: no sandbox with a namespace and an address on %s", pod.name, n.name)
			}
			select {
			case <-ctx.Done():
				return client, server, ctx.Err()
			case <-time.After(50 * time.Millisecond):
			}
		}
		pod.netns = sb.NetnsPath
		if pod.ip, err = netip.ParseAddr(strings.Split(sb.IP, "/")[0]); err != nil {
			return client, server, fmt.Errorf("pod %s's address %q: %w", pod.name, sb.IP, err)
		}
	}
	return client, server, nil
}

// hbCNP lets the client pod into the server pod on TCP hbAllowedPort:
// the server's ingress is enforced, so anything else is dropped.
func hbCNP() *ciliumv2.CiliumNetworkPolicy {
	sel := api.EndpointSelector{MatchLabels: map[string]string{"app": "hb-server"}}
	return &ciliumv2.CiliumNetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "hb-allow-8080", Namespace: cpNamespace},
		Spec: &api.Rule{
			EndpointSelector: &sel,
			Ingress: []api.IngressRule{{
				IngressCommonRule: api.IngressCommonRule{FromEndpoints: []api.EndpointSelector{{MatchLabels: map[string]string{"app": "hb-client"}}}},
				ToPorts:           api.PortRules{{Ports: []api.PortProtocol{{Port: strconv.Itoa(hbAllowedPort), Protocol: api.ProtoTCP}}}},
			}},
		},
	}
}

// udpSender sends single datagrams from the client pod's namespace.
type udpSender struct {
	netns string
	dst   netip.AddrPort
}

// dial opens a UDP socket in the sender's namespace from source port
// sport, connected to the destination.
func (s *udpSender) dial(sport uint16) (*net.UDPConn, error) {
	var c *net.UDPConn
	err := inNetnsPath(s.netns, func() error {
		var err error
		c, err = net.DialUDP("udp4", &net.UDPAddr{Port: int(sport)}, net.UDPAddrFromAddrPort(s.dst))
		return err
	})
	return c, err
}

// inNetnsPath runs f on a thread in the network namespace at path:
// sockets f opens stay in it.
func inNetnsPath(path string, f func() error) error {
	n, err := ns.GetNS(path)
	if err != nil {
		return fmt.Errorf("network namespace %s: %w", path, err)
	}
	defer n.Close()
	return n.Do(func(ns.NetNS) error { return f() })
}

// observe is a running `hubble observe --follow --type drop -o json`:
// it hands each printed line's drop flow (by UDP source port) and
// LostEvent to the bench.
type observe struct {
	cmd    *exec.Cmd
	cancel context.CancelFunc
	done   chan struct{}
	stderr strings.Builder

	mu      sync.Mutex
	waiters map[uint16]chan time.Time // source port -> when its line came
	flows   atomic.Uint64
	lost    map[string]uint64
	lostN   map[string]int
	once    sync.Once
	lines   atomic.Uint64
	last    atomic.Pointer[string] // the last line printed, for errors
	// parseErr is the first line's that did not parse, for errors.
	parseErr atomic.Pointer[string]
}

// startObserve runs the hubble CLI against sock.
func startObserve(ctx context.Context, hubble, sock string) (*observe, error) {
	octx, cancel := context.WithCancel(ctx)
	o := &observe{cancel: cancel, done: make(chan struct{}), waiters: map[uint16]chan time.Time{},
		lost: map[string]uint64{}, lostN: map[string]int{}}
	o.cmd = exec.CommandContext(octx, hubble, "observe", "--follow", "--type", "drop", "-o", "json", "--server", "unix://"+sock)
	o.cmd.WaitDelay = 2 * time.Second
	o.cmd.Stderr = &o.stderr
	out, err := o.cmd.StdoutPipe()
	if err != nil {
		cancel()
		return nil, err
	}
	if err := o.cmd.Start(); err != nil {
		cancel()
		return nil, fmt.Errorf("start hubble observe: %w", err)
	}
	go o.read(out)
	return o, nil
}

func (o *observe) read(out io.Reader) {
	defer close(o.done)
	sc := bufio.NewScanner(out)
	sc.Buffer(make([]byte, 1<<16), 1<<22)
	un := protojson.UnmarshalOptions{DiscardUnknown: true}
	for sc.Scan() {
		at := time.Now()
		o.lines.Add(1)
		line := sc.Text()
		o.last.Store(&line)
		var resp observerpb.GetFlowsResponse
		if err := un.Unmarshal(sc.Bytes(), &resp); err != nil {
			msg := err.Error()
			o.parseErr.CompareAndSwap(nil, &msg)
			continue
		}
		if l := resp.GetLostEvents(); l != nil {
			o.mu.Lock()
			o.lost[l.GetSource().String()] += l.GetNumEventsLost()
			o.lostN[l.GetSource().String()]++
			o.mu.Unlock()
			continue
		}
		f := resp.GetFlow()
		if f == nil || f.GetVerdict() != flowpb.Verdict_DROPPED {
			continue
		}
		o.flows.Add(1)
		sport := uint16(f.GetL4().GetUDP().GetSourcePort())
		o.mu.Lock()
		ch := o.waiters[sport]
		delete(o.waiters, sport)
		o.mu.Unlock()
		if ch != nil {
			ch <- at
		}
	}
}

// await registers interest in the line of the flow from sport.
func (o *observe) await(sport uint16) chan time.Time {
	ch := make(chan time.Time, 1)
	o.mu.Lock()
	o.waiters[sport] = ch
	o.mu.Unlock()
	return ch
}

func (o *observe) forget(sport uint16) {
	o.mu.Lock()
	delete(o.waiters, sport)
	o.mu.Unlock()
}

// stop ends the CLI (its context) and waits for the reader.
func (o *observe) stop() {
	o.once.Do(func() {
		o.cancel()
		_ = o.cmd.Wait()
		<-o.done
	})
}

// warmUp sends datagrams until one shows as a drop in hubble observe (the
// policy is enforced and the CLI follows), for at most a minute.
func warmUp(ctx context.Context, s *udpSender, o *observe) error {
	deadline := time.Now().Add(time.Minute)
	for i := 0; time.Now().Before(deadline); i++ {
		sport := uint16(hbFirstSourcePort - 1000 + i%500)
		if _, ok, err := sample(ctx, s, o, sport, 500*time.Millisecond); err != nil || ok {
			return err
		}
	}
	last := ""
	if l := o.last.Load(); l != nil {
		last = *l
	}
	perr := ""
	if e := o.parseErr.Load(); e != nil {
		perr = *e
	}
	return fmt.Errorf("no drop of UDP to %s in hubble observe --follow after a minute (%d lines, the last %q, parse error %q; stderr: %s)",
		s.dst, o.lines.Load(), last, perr, o.stderr.String())
}

// sample sends one datagram from sport and returns the time until
// hubble observe printed its drop, or false after timeout.
func sample(ctx context.Context, s *udpSender, o *observe, sport uint16, timeout time.Duration) (time.Duration, bool, error) {
	c, err := s.dial(sport)
	if err != nil {
		return 0, false, err
	}
	defer c.Close()
	ch := o.await(sport)
	sent := time.Now()
	if _, err := c.Write([]byte("hubble-bench")); err != nil {
		o.forget(sport)
		return 0, false, err
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case at := <-ch:
		return at.Sub(sent), true, nil
	case <-t.C:
		o.forget(sport)
		return 0, false, nil
	case <-o.done:
		return 0, false, fmt.Errorf("hubble observe ended: %s", o.stderr.String())
	case <-ctx.Done():
		return 0, false, ctx.Err()
	}
}

// flood runs the flooder in the client pod while a follower, the probes
// and the RSS sampler run.
func flood(ctx context.Context, cfg HubbleConfig, n *cpNode, client, server hbPod, sock string) (FloodResult, error) {
	res := FloodResult{Duration: cfg.Flood}
	pid := n.dn.Agent().Pid()
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return res, err
	}
	defer conn.Close()
	oc := observerpb.NewObserverClient(conn)
	st0, err := oc.ServerStatus(ctx, &observerpb.ServerStatusRequest{})
	if err != nil {
		return res, fmt.Errorf("ServerStatus: %w", err)
	}
	drops0, err := policyDrops(n.maps)
	if err != nil {
		return res, err
	}
	m0, err := agentCounters(ctx)
	if err != nil {
		return res, err
	}
	if res.RSSBefore, _, err = rss(pid); err != nil {
		return res, err
	}
	res.RSSPeak = res.RSSBefore

	obs, err := startObserve(ctx, cfg.Hubble, sock)
	if err != nil {
		return res, err
	}
	defer obs.stop()
	self, err := os.Executable()
	if err != nil {
		return res, err
	}
	fctx, fcancel := context.WithTimeout(ctx, cfg.Flood+time.Minute)
	defer fcancel()
	cmd := exec.CommandContext(fctx, "nsenter", "--net="+client.netns, "--", self)
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s,%d,%s", floodEnv, netip.AddrPortFrom(server.ip, hbDeniedPort), hbFloodSourcePort, cfg.Flood))
	var fout, ferr strings.Builder
	cmd.Stdout, cmd.Stderr = &fout, &ferr
	if err := cmd.Start(); err != nil {
		return res, fmt.Errorf("start the flooder: %w", err)
	}
	flooding := make(chan error, 1)
	go func() { flooding <- cmd.Wait() }()

	probe := time.NewTicker(cfg.StatusEvery)
	defer probe.Stop()
	var ferrWait error
wait:
	for {
		select {
		case ferrWait = <-flooding:
			break wait
		case <-probe.C:
			res.probe(ctx, oc)
			if cur, _, err := rss(pid); err == nil {
				res.RSSPeak = max(res.RSSPeak, cur)
			}
		}
	}
	if ferrWait != nil {
		return res, fmt.Errorf("the flooder: %w (%s)", ferrWait, ferr.String())
	}
	if res.Sent, err = strconv.ParseUint(strings.TrimSpace(fout.String()), 10, 64); err != nil {
		return res, fmt.Errorf("the flooder printed %q: %w", fout.String(), err)
	}
	// Settle: the queues drain and pending LostEvents (one a second at
	// most) are sent.
	settle := time.After(3 * time.Second)
settling:
	for {
		select {
		case <-settle:
			break settling
		case <-probe.C:
			if cur, _, err := rss(pid); err == nil {
				res.RSSPeak = max(res.RSSPeak, cur)
			}
		}
	}
	obs.stop()
	drops1, err := policyDrops(n.maps)
	if err != nil {
		return res, err
	}
	res.DatapathDrops = drops1 - drops0
	st1, err := oc.ServerStatus(ctx, &observerpb.ServerStatusRequest{})
	if err != nil {
		return res, fmt.Errorf("ServerStatus: %w", err)
	}
	res.SeenFlows = st1.GetSeenFlows() - st0.GetSeenFlows()
	m1, err := agentCounters(ctx)
	if err != nil {
		return res, err
	}
	res.Produced = m1["produced"] - m0["produced"]
	res.QueueLost = m1["observer_events_queue"] - m0["observer_events_queue"]
	res.SourceLost = m1["perf_event_ring_buffer"] - m0["perf_event_ring_buffer"]
	if res.RSSAfter, res.HWM, err = rss(pid); err != nil {
		return res, err
	}
	res.FollowFlows = obs.flows.Load()
	obs.mu.Lock()
	res.FollowLost, res.FollowLostEvents = obs.lost, obs.lostN
	obs.mu.Unlock()
	return res, nil
}

// probe times one ServerStatus and one GetFlows with number 1.
func (r *FloodResult) probe(ctx context.Context, oc observerpb.ObserverClient) {
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	t0 := time.Now()
	if _, err := oc.ServerStatus(cctx, &observerpb.ServerStatusRequest{}); err != nil {
		r.StatusErrors++
	} else {
		r.Status = append(r.Status, time.Since(t0))
	}
	t0 = time.Now()
	stream, err := oc.GetFlows(cctx, &observerpb.GetFlowsRequest{Number: 1})
	if err != nil {
		r.StatusErrors++
		return
	}
	for {
		_, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			r.Last = append(r.Last, time.Since(t0))
			return
		}
		if err != nil {
			r.StatusErrors++
			return
		}
	}
}

// agentCounters scrapes the agent's metrics: "produced" (the flows of
// every type) and the lost events by source
// (cellium_hubble_lost_events_total's source label).
func agentCounters(ctx context.Context) (map[string]uint64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+hbMetricsAddr+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("the agent's metrics: %w", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("the agent's metrics: %w", err)
	}
	out := map[string]uint64{}
	for line := range strings.Lines(string(b)) {
		name, value, ok := strings.Cut(strings.TrimSpace(line), " ")
		if !ok || strings.HasPrefix(name, "#") {
			continue
		}
		v, err := strconv.ParseFloat(value, 64)
		if err != nil {
			continue
		}
		switch {
		case strings.HasPrefix(name, "cellium_hubble_flows_produced_total{"):
			out["produced"] += uint64(v)
		case strings.HasPrefix(name, "cellium_hubble_lost_events_total{"):
			_, src, _ := strings.Cut(name, `source="`)
			src, _, _ = strings.Cut(src, `"`)
			out[src] += uint64(v)
		}
	}
	return out, nil
}

// policyDrops sums the datapath's "Policy denied" counters.
func policyDrops(m *maps.Maps) (uint64, error) {
	all, err := m.Metrics.Read()
	if err != nil {
		return 0, fmt.Errorf("read the datapath's metrics: %w", err)
	}
	var n uint64
	for k, v := range all {
		if k.Reason == policyDeniedReason {
			n += v.Packets
		}
	}
	return n, nil
}

// policyDeniedReason is Cilium's drop reason "Policy denied".
const policyDeniedReason = 133

// rss returns a process's VmRSS and VmHWM in bytes.
func rss(pid int) (cur, hwm uint64, err error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0, fmt.Errorf("the agent's memory: %w", err)
	}
	for line := range strings.Lines(string(b)) {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		kb, err := strconv.ParseUint(f[1], 10, 64)
		if err != nil {
			continue
		}
		switch f[0] {
		case "VmRSS:":
			cur = kb << 10
		case "VmHWM:":
			hwm = kb << 10
		}
	}
	if cur == 0 {
		return 0, 0, fmt.Errorf("no VmRSS in /proc/%d/status", pid)
	}
	return cur, hwm, nil
}

// Aims checks the latency's p99, the RSS growth and the status probes'
// p99.
func (r HubbleResult) Aims() []Aim {
	l := summarize(r.Latency)
	out := []Aim{{"dropped packet -> hubble observe --follow line, p99", fmtDur(l.P99), "<= " + fmtDur(AimHubbleDropLatency),
		l.N > 0 && r.Missed == 0 && l.P99 <= AimHubbleDropLatency}}
	if r.Flood.Duration > 0 {
		grown := int64(r.Flood.RSSPeak) - int64(r.Flood.RSSBefore)
		s := summarize(r.Flood.Status)
		out = append(out,
			Aim{"flood: agent RSS growth (peak - before)", fmtMiB(grown), "<= " + fmtMiB(AimHubbleRSSGrowth), grown <= AimHubbleRSSGrowth},
			Aim{"flood: ServerStatus every probe, p99", fmtDur(s.P99), "<= " + fmtDur(AimHubbleStatusLatency),
				s.N > 0 && r.Flood.StatusErrors == 0 && s.P99 <= AimHubbleStatusLatency})
	}
	return out
}

func fmtMiB(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }

// Write prints the figures and the aims with PASS/MISS.
func (r HubbleResult) Write(w io.Writer) {
	fmt.Fprintf(w, "\n== hubble: one real agent, the upstream hubble CLI (load average before %s, after %s) ==\n", r.LoadBefore, r.LoadAfter)
	fmt.Fprintf(w, "  %-58s %s, missed %d\n", "drop -> hubble observe --follow --type drop -o json line", summarize(r.Latency), r.Missed)
	if f := r.Flood; f.Duration > 0 {
		fmt.Fprintf(w, "  flood of %s: %d datagrams sent (%.0f/s); the datapath dropped %d (Policy denied)\n",
			f.Duration, f.Sent, float64(f.Sent)/f.Duration.Seconds(), f.DatapathDrops)
		fmt.Fprintf(w, "    agent: %d flows made (of every type; ServerStatus seen_flows %d), %d events lost in its queue, %d in the datapath's ring buffer: %d events in all\n",
			f.Produced, f.SeenFlows, f.QueueLost, f.SourceLost, f.Produced+f.QueueLost+f.SourceLost)
		fmt.Fprintf(w, "    the follower (hubble observe --follow --type drop) printed %d drop flows and these LostEvents:\n", f.FollowFlows)
		for _, src := range []string{"PERF_EVENT_RING_BUFFER", "OBSERVER_EVENTS_QUEUE", "HUBBLE_RING_BUFFER"} {
			fmt.Fprintf(w, "    LostEvents %-24s %d events in %d LostEvent(s)\n", src+":", f.FollowLost[src], f.FollowLostEvents[src])
		}
		fmt.Fprintf(w, "    %-56s %s, %d errors\n", "ServerStatus during the flood", summarize(f.Status), f.StatusErrors)
		fmt.Fprintf(w, "    %-56s %s\n", "GetFlows number=1 (to its end) during the flood", summarize(f.Last))
		fmt.Fprintf(w, "    agent RSS: before %s, peak sampled %s, after %s; VmHWM %s\n",
			fmtMiB(int64(f.RSSBefore)), fmtMiB(int64(f.RSSPeak)), fmtMiB(int64(f.RSSAfter)), fmtMiB(int64(f.HWM)))
	}
	fmt.Fprintf(w, "\n== hubble aims ==\n")
	for _, a := range r.Aims() {
		verdict := "MISS"
		if a.Met {
			verdict = "PASS"
		}
		fmt.Fprintf(w, "  %-4s %-56s %10s  (aim %s)\n", verdict, a.What, a.Value, a.Want)
	}
}
