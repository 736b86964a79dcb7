package soak

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math/rand/v2"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"

	"github.com/cellium/cellium/api/client/clientset/versioned"
	ciliuminformers "github.com/cellium/cellium/api/client/informers/externalversions"
	"github.com/cellium/cellium/api/v1/client"
	"github.com/cellium/cellium/datapath/link"
	"github.com/cellium/cellium/test/devkubelet"
	"github.com/cellium/cellium/test/devkubelet/devnode"
	"github.com/cellium/cellium/test/harness"
)

// Defaults of Config.
const (
	DefaultCheckEvery = 20 * time.Second
	DefaultConverge   = 60 * time.Second
	DefaultMaxPods    = 12
	// MaxOutageCap is the longest API server outage.
	MaxOutageCap = 60 * time.Second
	minOutage    = 5 * time.Second
)

// agentServeWithin is how soon an agent restarted while the API server is
// down must answer on its socket: CNI DEL must work during an outage.
const agentServeWithin = 10 * time.Second

// agentReadyWithin bounds an agent restart with the API server up.
const agentReadyWithin = 2 * time.Minute

// client-go's reflector backoff after failed lists/watches: capped at
// 30 s with jitter 1.0 (so up to 60 s), reset after 2 minutes without a
// failure. See [Soak.convergeWindow].
const (
	reflectorMaxBackoff   = 60 * time.Second
	reflectorBackoffReset = 2*time.Minute + reflectorMaxBackoff
)

// Actions are the names of what the soak does, for Config.Skip.
var Actions = []string{
	"create", "delete", "force-delete", "recreate", "relabel",
	"dup-del", "del-storm", "del-race", "add-retry", "add-other-netns",
	"agent-kill", "operator-kill", "api-outage", "outage-agent-kill",
}

// Config configures a soak.
type Config struct {
	// Duration is how long the soak drives the system, quiescent
	// points included; the final check and the clean-up come on top.
	Duration time.Duration
	// Seed seeds every random choice.
	Seed uint64
	// Cluster is the control plane; the soak stops and starts its API
	// server, so it must not be shared with other tests.
	Cluster *harness.Cluster
	// Binaries are cellium-agent, cellium-operator, cellium-cni and the
	// cellium CLI.
	Binaries devnode.Binaries
	// Dir holds the logs and state of the node and the operator; short,
	// since the agent's socket lives in it.
	Dir string
	// Namespace is where the soak's pods live (it must exist with a
	// default ServiceAccount).
	Namespace string
	// Skip names actions (see Actions) not to do.
	Skip map[string]bool
	// Logf receives progress lines; nil discards them.
	Logf func(format string, args ...any)
	// CheckEvery is the time between quiescent points; Converge bounds
	// the wait for convergence at each (twice that at the end).
	CheckEvery, Converge time.Duration
	// MaxOutage is the longest API server outage; default a fifth of
	// Duration, between 5 s and 60 s.
	MaxOutage time.Duration
	// MaxPods bounds the live pods.
	MaxPods int
	// Datapath runs the agent with its eBPF datapath, host routing and the
	// socket load balancer, and adds the datapath invariants: the pinned
	// maps and links match the agent's tables and endpoints, a policy
	// (app=db takes ingress from app=web only) holds against probes at
	// every quiescent point, and a TCP connection between two pinned pods
	// survives every fault. It takes the machine's host-network lock
	// (harness.LockHostNetwork) for the run.
	Datapath bool
	// ServiceRange is the cluster's Service range, blackholed in the host
	// for the run when Datapath is on: the socket load balancer's programs
	// act on every socket of the machine, so it must be a range no other
	// cluster on the machine uses.
	ServiceRange netip.Prefix
}

func (c *Config) setDefaults() error {
	if c.Cluster == nil || c.Binaries.Agent == "" || c.Binaries.Operator == "" || c.Binaries.CNIPlugin == "" || c.Dir == "" || c.Namespace == "" {
		return errors.New("soak: Config needs Cluster, Binaries, Dir and Namespace")
	}
	for name := range c.Skip {
		if !slices.Contains(Actions, name) {
			return fmt.Errorf("soak: unknown action %q to skip; actions are %s", name, strings.Join(Actions, ", "))
		}
	}
	if c.Duration <= 0 {
		return fmt.Errorf("soak: Duration %s: must be positive", c.Duration)
	}
	if c.Logf == nil {
		c.Logf = func(string, ...any) {}
	}
	if c.CheckEvery <= 0 {
		c.CheckEvery = DefaultCheckEvery
	}
	if c.Converge <= 0 {
		c.Converge = DefaultConverge
	}
	if c.MaxOutage <= 0 {
		c.MaxOutage = min(max(c.Duration/5, minOutage), MaxOutageCap)
	}
	if c.MaxPods <= 0 {
		c.MaxPods = DefaultMaxPods
	}
	return nil
}

// podState is what the soak remembers of a pod it keeps.
type podState struct {
	uid    string
	labels map[string]string
}

// plannedEvent is a disruption planned at a time of the run.
type plannedEvent struct {
	at   time.Duration
	kind string
	// outage is the length of an API server outage.
	outage time.Duration
}

// Soak drives one node of a harness cluster through churn and faults and
// checks its invariants. Start it with [Start], run it with [Soak.Run],
// and always [Soak.Close] it.
type Soak struct {
	cfg    Config
	rng    *rand.Rand
	tl     *Timeline
	start  time.Time
	cs     kubernetes.Interface
	cilium versioned.Interface
	node   *devnode.Node
	agent  *client.Client
	opCfg  devnode.OperatorConfig
	op     *harness.Running
	src    *sources
	klog   *os.File
	prefix string // of the kubelet's sandbox IDs
	hostNS ns.NetNS
	host   link.Host // in hostNS

	stopInformers context.CancelFunc
	informersDone sync.WaitGroup
	wake          chan struct{}
	ids           *identityWatch

	counts     map[string]int
	violations []Violation
	failedAt   string // the quiescent point that failed, if any

	alive      map[string]podState
	pending    map[string]string // pods to delete: name -> UID
	seq        int
	retired    []devkubelet.Sandbox // torn-down sandboxes, for duplicate DELs
	ownNetns   map[string]bool      // paths of netns the soak made
	plan       []plannedEvent
	outages    int
	doctorGone bool // the CLI has no doctor command

	apiDown    bool
	apiDownAt  time.Time
	apiBackAt  time.Time
	apiUpAt    time.Time // when the API server last came back
	apiRetries int

	agentRestartAt  time.Time
	agentStarting   *harness.Running
	agentStartedAt  time.Time
	agentInOutage   bool
	agentFlagged    bool
	opRestartAt     time.Time
	opRetryFailures int

	// With Config.Datapath: the pinned connection, and what Close gives
	// back to the machine.
	flow       *flow
	unlockHost func()
	sysctls    map[string][]byte
	blackholes []*netlink.Route
}

// labelSets are the pods' labels; pods with the same set share an
// identity.
var labelSets = []map[string]string{
	{"app": "web"},
	{"app": "web", "tier": "front"},
	{"app": "db"},
	{"app": "cache", "tier": "back"},
	{"app": "batch"},
}

// Start starts the operator and the node (kubelet and agent) and the
// watches the checks use. Close undoes it, also after an error.
func Start(ctx context.Context, cfg Config) (*Soak, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	s := &Soak{
		cfg:      cfg,
		rng:      rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x9e3779b97f4a7c15)),
		start:    time.Now(),
		cs:       cfg.Cluster.Clientset(),
		cilium:   versioned.NewForConfigOrDie(cfg.Cluster.RESTConfig()),
		wake:     make(chan struct{}, 1),
		counts:   map[string]int{},
		alive:    map[string]podState{},
		pending:  map[string]string{},
		ownNetns: map[string]bool{},
	}
	s.tl = NewTimeline(600, s.start, nil)
	// Pin the host network namespace before anything enters another.
	runtime.LockOSThread()
	hostNS, err := ns.GetCurrentNS()
	runtime.UnlockOSThread()
	if err != nil {
		return nil, fmt.Errorf("soak: open the host network namespace: %w", err)
	}
	s.hostNS = hostNS
	s.host = link.Host{NetnsPath: fmt.Sprintf("/proc/%d/fd/%d", os.Getpid(), hostNS.Fd())}
	s.ids = newIdentityWatch(s.tl, s.poke)
	s.prefix = fmt.Sprintf("50a%05x", cfg.Seed&0xfffff)
	var op *harness.Running

	nodeName := "soak-" + strings.TrimPrefix(cfg.Namespace[strings.LastIndex(cfg.Namespace, "-")+1:], "-")
	// The daemons run with their ServiceAccounts' tokens, bound to the
	// roles of install/kubernetes/cellium.yaml, as in the e2e tests.
	opKubeconfig, err := cfg.Cluster.OperatorKubeconfig(ctx)
	if err != nil {
		return s, fmt.Errorf("soak: operator credentials: %w", err)
	}
	agentKubeconfig, err := cfg.Cluster.AgentKubeconfig(ctx)
	if err != nil {
		return s, fmt.Errorf("soak: agent credentials: %w", err)
	}
	s.opCfg = devnode.OperatorConfig{
		Binary:     cfg.Binaries.Operator,
		Kubeconfig: opKubeconfig,
		Dir:        cfg.Dir,
		// Apart from the e2e tests' 10.101.0.0/16 and up: pod routes live
		// in the host's table, shared with tests running beside.
		ClusterPoolIPv4CIDR:     podRange.String(),
		ClusterPoolIPv4MaskSize: 24,
		Args: []string{
			"--identity-gc-interval=2s",
			"--identity-heartbeat-timeout=4s",
			"--cilium-endpoint-gc-interval=5s",
			"--leader-election-lease-duration=6s",
			"--leader-election-renew-deadline=4s",
			"--leader-election-retry-period=1s",
		},
	}
	if cfg.Datapath {
		if err := s.takeHostNetwork(ctx); err != nil {
			return s, err
		}
	}
	op, err = devnode.StartOperator(ctx, s.opCfg)
	if err != nil {
		return s, fmt.Errorf("soak: start operator: %w", err)
	}
	s.op = op

	nodeDir := filepath.Join(cfg.Dir, "node")
	if err := os.MkdirAll(nodeDir, 0o755); err != nil {
		return s, err
	}
	if s.klog, err = os.Create(filepath.Join(nodeDir, "kubelet.log")); err != nil {
		return s, err
	}
	s.node, err = devnode.NewNode(agentKubeconfig, s.cs, cfg.Binaries, devnode.NodeOptions{
		Name:            nodeName,
		Dir:             nodeDir,
		Logger:          slog.New(slog.NewTextHandler(s.klog, &slog.HandlerOptions{Level: slog.LevelDebug})),
		SandboxIDPrefix: s.prefix,
		HostRouting:     cfg.Datapath,
		BPF:             cfg.Datapath,
		SocketLB:        cfg.Datapath,
	})
	if err != nil {
		return s, fmt.Errorf("soak: %w", err)
	}
	s.agent = s.node.AgentClient()
	if err := s.node.StartKubelet(); err != nil {
		return s, fmt.Errorf("soak: %w", err)
	}
	if err := s.node.StartAgent(ctx); err != nil {
		return s, fmt.Errorf("soak: %w", err)
	}
	s.src = &sources{
		namespace:     cfg.Namespace,
		cs:            s.cs,
		cilium:        s.cilium,
		agent:         s.agent,
		kubeletState:  s.node.KubeletStateDir(),
		agentStateDir: s.node.AgentConfig().StateDir(),
		netnsDir:      devkubelet.DefaultNetnsDir,
		netnsPrefixes: []string{"cellium-" + cfg.Namespace + "-"},
		host:          s.host,
	}
	if cfg.Datapath {
		s.src.bpfRoot = s.node.AgentConfig().BPFRoot()
		cctx, cancel := context.WithTimeout(ctx, apiTimeout)
		_, err := s.cilium.CiliumV2().CiliumNetworkPolicies(cfg.Namespace).Create(cctx, soakPolicy(cfg.Namespace), metav1.CreateOptions{})
		cancel()
		if err != nil {
			return s, fmt.Errorf("soak: create the policy: %w", err)
		}
	}
	s.startInformers()
	return s, nil
}

// poke wakes a convergence wait.
func (s *Soak) poke() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

func (s *Soak) startInformers() {
	ctx, cancel := context.WithCancel(context.Background())
	s.stopInformers = cancel
	kf := informers.NewSharedInformerFactoryWithOptions(s.cs, 0, informers.WithNamespace(s.cfg.Namespace))
	_, _ = kf.Core().V1().Pods().Informer().AddEventHandler(wakeHandler(s.poke))
	cf := ciliuminformers.NewSharedInformerFactory(s.cilium, 0)
	_, _ = cf.Cilium().V2().CiliumIdentities().Informer().AddEventHandler(s.ids.identityHandler())
	nf := ciliuminformers.NewSharedInformerFactoryWithOptions(s.cilium, 0, ciliuminformers.WithNamespace(s.cfg.Namespace))
	_, _ = nf.Cilium().V2().CiliumEndpoints().Informer().AddEventHandler(s.ids.cepHandler())
	kf.Start(ctx.Done())
	cf.Start(ctx.Done())
	nf.Start(ctx.Done())
	s.informersDone.Go(func() {
		<-ctx.Done()
		kf.Shutdown()
		cf.Shutdown()
		nf.Shutdown()
	})
}

// now is the time since the soak started.
func (s *Soak) now() time.Duration { return time.Since(s.start) }

func (s *Soak) count(name string, n int) { s.counts[name] += n }

// violate records a violation found outside a quiescent point.
func (s *Soak) violate(inv, obj, format string, args ...any) {
	v := Violation{Invariant: inv, Object: obj, Message: fmt.Sprintf(format, args...)}
	s.violations = append(s.violations, v)
	s.tl.Addf("VIOLATION", "%s", v)
	s.cfg.Logf("soak: VIOLATION at %s: %s", s.now().Truncate(time.Millisecond), v)
}

// Report is the outcome of a soak.
type Report struct {
	Seed     uint64
	Duration time.Duration
	Elapsed  time.Duration
	// Counts are what the soak did and checked.
	Counts map[string]int
	// Violations are the broken invariants; empty when the soak passed.
	Violations []Violation
	// FailedAt names the quiescent point that failed, if one did.
	FailedAt string
	// Timeline is the ring of the last actions.
	Timeline *Timeline
}

// countOrder is how Report.Summary lists the counts.
var countOrder = []string{
	"pods-created", "pods-deleted", "graceful-deletes", "force-deletes", "recreates", "relabels",
	"dup-del", "del-storm", "del-race", "del-calls", "add-retry", "add-other-netns",
	"agent-kills", "agent-kills-in-outage", "agent-restarts", "agent-exits", "operator-kills", "operator-exits",
	"outages", "outage-seconds", "identity-deletions",
	"quiescent-points", "snapshots", "invariant-checks", "doctor-runs", "doctor-foreign",
	"policy-probes", "policy-probes-denied", "policy-probe-retries", "flow-exchanges",
}

// Summary is the report's figures, one line.
func (r *Report) Summary() string {
	var b strings.Builder
	fmt.Fprintf(&b, "seed %d, duration %s (ran %s):", r.Seed, r.Duration, r.Elapsed.Truncate(time.Second))
	for _, k := range countOrder {
		fmt.Fprintf(&b, " %s=%d", k, r.Counts[k])
	}
	return b.String()
}

// WriteFailure prints the violations and the timeline.
func (r *Report) WriteFailure(w io.Writer) {
	fmt.Fprintf(w, "%d invariant violation(s)", len(r.Violations))
	if r.FailedAt != "" {
		fmt.Fprintf(w, " (quiescent point %s)", r.FailedAt)
	}
	fmt.Fprintln(w, ":")
	for _, v := range r.Violations {
		fmt.Fprintln(w, "  -", v)
	}
	fmt.Fprintln(w, "timeline (time since start, action, details):")
	_, _ = r.Timeline.WriteTo(w)
}

// Run drives the system for Config.Duration, checking the invariants at
// quiescent points, then checks once more with everything up. It stops
// early once an invariant is broken.
func (s *Soak) Run(ctx context.Context) *Report {
	s.start = time.Now()
	s.tl.Restart(s.start)
	s.makePlan()
	s.cfg.Logf("soak: seed %d, duration %s, max outage %s, container ID prefix %s; plan: %s",
		s.cfg.Seed, s.cfg.Duration, s.cfg.MaxOutage, s.prefix, s.planString())

	// A first population, checked before any fault; with the datapath,
	// the pinned pair first.
	if s.cfg.Datapath {
		for _, name := range slices.Sorted(maps.Keys(pinnedLabels)) {
			s.createPodWith(ctx, name, pinnedLabels[name])
		}
	}
	for range s.cfg.MaxPods / 2 {
		s.createPod(ctx, "")
	}
	s.quiescent(ctx, "initial", s.cfg.Converge)
	if s.cfg.Datapath && s.failedAt == "" {
		if err := s.startFlow(); err != nil {
			s.violate("flow-setup", "connection "+pinnedClient+"->"+pinnedServer, "%v", err)
		}
	}

	nextCheck := time.Now().Add(s.cfg.CheckEvery)
	end := s.start.Add(s.cfg.Duration)
	for ctx.Err() == nil && len(s.violations) == 0 && time.Now().Before(end) {
		s.supervise(ctx)
		if ev, ok := s.dueEvent(); ok {
			s.disrupt(ctx, ev)
			continue
		}
		if !s.apiDown && s.agentStarting == nil && time.Now().After(nextCheck) {
			s.quiescent(ctx, fmt.Sprintf("#%d", s.counts["quiescent-points"]), s.convergeWindow())
			nextCheck = time.Now().Add(s.cfg.CheckEvery)
			continue
		}
		s.step(ctx)
		s.pace(ctx, 100*time.Millisecond+time.Duration(s.rng.Int64N(int64(400*time.Millisecond))))
	}
	if s.failedAt == "" && ctx.Err() == nil {
		s.quiescent(ctx, "final", 2*s.cfg.Converge)
	}
	s.counts["identity-deletions"] = s.ids.Deletions()
	return &Report{
		Seed: s.cfg.Seed, Duration: s.cfg.Duration, Elapsed: time.Since(s.start),
		Counts: s.counts, Violations: s.violations, FailedAt: s.failedAt, Timeline: s.tl,
	}
}

// pace waits d, or less if ctx ends.
func (s *Soak) pace(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// makePlan spreads the disruptions over the run: at least one API server
// outage (the first as long as MaxOutage, with an agent kill inside it),
// two agent kills and one operator kill, more in longer runs.
func (s *Soak) makePlan() {
	d := s.cfg.Duration
	at := func() time.Duration {
		return d/10 + time.Duration(s.rng.Int64N(int64(d*7/10)))
	}
	add := func(kind string, n int) {
		if s.cfg.Skip[kind] {
			return
		}
		for i := range n {
			ev := plannedEvent{at: at(), kind: kind}
			if kind == "api-outage" {
				ev.outage = s.cfg.MaxOutage
				if i > 0 {
					ev.outage = minOutage + time.Duration(s.rng.Int64N(int64(s.cfg.MaxOutage-minOutage)+1))
				}
				// Over before the last tenth of the run, so the final
				// check does not wait for it.
				ev.at = min(ev.at, max(d*9/10-ev.outage, d/10))
			}
			s.plan = append(s.plan, ev)
		}
	}
	add("api-outage", max(1, int(d/(8*time.Minute))))
	add("agent-kill", max(2, int(d/(40*time.Second))))
	add("operator-kill", max(1, int(d/(90*time.Second))))
	slices.SortStableFunc(s.plan, func(a, b plannedEvent) int { return int(a.at - b.at) })
}

func (s *Soak) planString() string {
	var parts []string
	for _, ev := range s.plan {
		p := fmt.Sprintf("%s@%s", ev.kind, ev.at.Truncate(time.Second))
		if ev.outage > 0 {
			p += fmt.Sprintf("(%s)", ev.outage.Truncate(time.Second))
		}
		parts = append(parts, p)
	}
	return strings.Join(parts, " ")
}

// dueEvent pops the next planned disruption if its time has come and it
// can happen now; one that cannot is postponed a little.
func (s *Soak) dueEvent() (plannedEvent, bool) {
	if len(s.plan) == 0 || s.now() < s.plan[0].at {
		return plannedEvent{}, false
	}
	ev := s.plan[0]
	ready := true
	switch ev.kind {
	case "api-outage":
		ready = !s.apiDown && s.agentStarting == nil && s.node.Agent() != nil
	case "agent-kill":
		ready = s.node.Agent() != nil && s.agentStarting == nil
	case "operator-kill":
		ready = s.op != nil
	}
	if !ready {
		s.plan[0].at = s.now() + 2*time.Second
		slices.SortStableFunc(s.plan, func(a, b plannedEvent) int { return int(a.at - b.at) })
		return plannedEvent{}, false
	}
	s.plan = s.plan[1:]
	return ev, true
}

// disrupt carries out a planned disruption.
func (s *Soak) disrupt(ctx context.Context, ev plannedEvent) {
	switch ev.kind {
	case "api-outage":
		s.outages++
		began := time.Now()
		if err := s.cfg.Cluster.StopAPIServer(); err != nil {
			s.violate("apiserver-stop", "kube-apiserver", "%v", err)
			return
		}
		// The outage counts from the SIGTERM: a stopping API server
		// refuses new work at once, its shutdown can take seconds.
		s.apiDown, s.apiDownAt, s.apiBackAt = true, began, began.Add(ev.outage)
		s.count("outages", 1)
		s.tl.Addf("api-outage", "kube-apiserver stopped (took %s) for %s in all",
			time.Since(began).Truncate(time.Millisecond), ev.outage.Truncate(time.Millisecond))
		if (s.outages == 1 || s.rng.IntN(2) == 0) && !s.cfg.Skip["outage-agent-kill"] {
			// Kill the agent early in the outage: it must come back and
			// serve CNI DEL without the API server.
			in := time.Second + time.Duration(s.rng.Int64N(int64(2*time.Second)))
			s.plan = append(s.plan, plannedEvent{at: s.now() + in, kind: "agent-kill"})
			slices.SortStableFunc(s.plan, func(a, b plannedEvent) int { return int(a.at - b.at) })
		}
	case "agent-kill":
		if !s.apiDown {
			// Kill it with work in flight: ADDs and a DEL under way.
			for range 1 + s.rng.IntN(2) {
				s.createPod(ctx, "")
			}
			if name, ok := s.randomAlive(); ok {
				s.deletePod(ctx, name, nil, "delete")
			}
			s.pace(ctx, time.Duration(s.rng.Int64N(int64(400*time.Millisecond))))
		} else {
			s.count("agent-kills-in-outage", 1)
		}
		if err := s.node.KillAgent(); err != nil {
			s.tl.Addf("agent-kill", "kill: %v", err)
		}
		s.count("agent-kills", 1)
		// The pinned maps and links go on enforcing without the agent.
		if v := s.checkFlow("agent just killed"); v != nil {
			s.violate(v.Invariant, v.Object, "%s", v.Message)
		}
		back := time.Duration(s.rng.Int64N(int64(3 * time.Second)))
		if s.apiDown {
			back /= 3
		}
		s.agentRestartAt = time.Now().Add(back)
		s.tl.Addf("agent-kill", "SIGKILL; restart in %s (API server down: %v)", back.Truncate(time.Millisecond), s.apiDown)
	case "operator-kill":
		if err := s.op.Kill(); err != nil {
			s.tl.Addf("operator-kill", "kill: %v", err)
		}
		s.op = nil
		s.count("operator-kills", 1)
		back := time.Duration(s.rng.Int64N(int64(5 * time.Second)))
		s.opRestartAt = time.Now().Add(back)
		s.tl.Addf("operator-kill", "SIGKILL; restart in %s", back.Truncate(time.Millisecond))
	}
}

// supervise brings back what is due: the API server after its outage,
// the agent and the operator after a kill; it notices processes that
// exited on their own and retries pending pod deletions.
func (s *Soak) supervise(ctx context.Context) {
	now := time.Now()
	if s.apiDown && !now.Before(s.apiBackAt) {
		began := time.Now()
		if err := s.cfg.Cluster.StartAPIServer(ctx); err != nil {
			s.apiRetries++
			s.violate("apiserver-start", "kube-apiserver", "could not be restarted: %v", err)
			s.apiBackAt = time.Now().Add(5 * time.Second)
		} else {
			s.apiDown, s.apiUpAt = false, time.Now()
			s.count("outage-seconds", int(time.Since(s.apiDownAt).Seconds()))
			s.tl.Addf("api-back", "kube-apiserver ready again after %s down (start took %s)",
				time.Since(s.apiDownAt).Truncate(time.Millisecond), time.Since(began).Truncate(time.Millisecond))
		}
	}

	if r := s.node.Agent(); r != nil && exited(r) {
		s.count("agent-exits", 1)
		s.violate("agent-exited", "cellium-agent", "exited on its own (%v); its log ends with:\n%s", r.Err(), r.LogTail(25))
		_ = s.node.StopAgent()
		s.agentStarting = nil
		s.agentRestartAt = time.Now()
	}
	if s.node.Agent() == nil && !s.agentRestartAt.IsZero() && !now.Before(s.agentRestartAt) {
		r, err := s.node.LaunchAgent()
		if err != nil {
			s.violate("agent-start", "cellium-agent", "%v", err)
			s.agentRestartAt = time.Now().Add(5 * time.Second)
		} else {
			s.count("agent-restarts", 1)
			s.agentRestartAt = time.Time{}
			s.agentStarting, s.agentStartedAt, s.agentInOutage, s.agentFlagged = r, time.Now(), s.apiDown, false
			s.tl.Addf("agent-start", "cellium-agent started (pid %d, API server down: %v)", r.Pid(), s.apiDown)
		}
	}
	if s.agentStarting != nil {
		s.pollAgent(ctx)
	}

	if s.op != nil && exited(s.op) {
		s.count("operator-exits", 1)
		s.tl.Addf("operator-exit", "cellium-operator exited on its own (%v): lost its lease?", s.op.Err())
		_ = s.op.Stop(0)
		s.op = nil
		s.opRestartAt = time.Now().Add(time.Second)
	}
	if s.op == nil && !s.apiDown && !now.Before(s.opRestartAt) {
		sctx, cancel := context.WithTimeout(ctx, time.Minute)
		op, err := devnode.StartOperator(sctx, s.opCfg)
		cancel()
		if err != nil {
			s.opRetryFailures++
			s.violate("operator-start", "cellium-operator", "could not be restarted: %v", err)
			s.opRestartAt = time.Now().Add(5 * time.Second)
		} else {
			s.op = op
			s.tl.Addf("operator-start", "cellium-operator started (pid %d)", op.Pid())
		}
	}

	if !s.apiDown {
		for name, uid := range s.pending {
			s.tryDelete(ctx, name, uid, nil)
		}
	}
}

// pollAgent checks whether a restarted agent serves: its socket answers
// (and, with the API server up, it has written its CNI configuration).
func (s *Soak) pollAgent(ctx context.Context) {
	cctx, cancel := context.WithTimeout(ctx, time.Second)
	_, err := s.agent.GetHealthz(cctx)
	cancel()
	if err == nil {
		_, cerr := os.Stat(s.node.AgentConfig().ConfListPath())
		if s.apiDown || cerr == nil {
			s.tl.Addf("agent-ready", "cellium-agent serving %s after its start (API server down: %v)",
				time.Since(s.agentStartedAt).Truncate(time.Millisecond), s.apiDown)
			s.agentStarting = nil
			return
		}
	}
	since := time.Since(s.agentStartedAt)
	switch {
	case s.agentInOutage && s.apiDown && !s.agentFlagged && since > agentServeWithin:
		s.agentFlagged = true
		s.violate("agent-not-serving", "cellium-agent",
			"restarted while the API server is down, it has not answered on its socket for %s (last: %v): no CNI DEL can be served during the outage",
			since.Truncate(time.Second), err)
	case !s.apiDown && since > agentReadyWithin && !s.agentFlagged:
		s.agentFlagged = true
		s.violate("agent-not-ready", "cellium-agent", "not ready %s after its start (last: %v); its log ends with:\n%s",
			since.Truncate(time.Second), err, s.agentStarting.LogTail(25))
	}
}

func exited(r *harness.Running) bool {
	select {
	case <-r.Done():
		return true
	default:
		return false
	}
}

// convergeWindow is the configured convergence bound, plus the
// informers' longest reconnect delay if the API server came back
// recently: a client-go reflector whose watch kept failing through an
// outage waits up to twice its 30 s backoff cap (jitter 1.0) before it
// lists again, and resets that backoff only after two quiet minutes. The
// dev-kubelet's pod informer and the agent's are such reflectors; a
// real kubelet has the same delay.
func (s *Soak) convergeWindow() time.Duration {
	if !s.apiUpAt.IsZero() && time.Since(s.apiUpAt) < reflectorBackoffReset {
		return s.cfg.Converge + reflectorMaxBackoff
	}
	return s.cfg.Converge
}

// quiescent brings everything up, waits (at most converge) until the
// snapshot agrees with what the soak asked for, and records what still
// disagrees then as violations. It also settles the identity watch's
// suspects and asks cellium doctor.
func (s *Soak) quiescent(ctx context.Context, name string, converge time.Duration) {
	s.count("quiescent-points", 1)
	began := time.Now()
	deadline := began.Add(converge)
	s.tl.Addf("check", "quiescent point %s: waiting up to %s for convergence (%d live pods)", name, converge, len(s.alive))

	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	var (
		vs      []Violation
		waited  []Violation // the last disagreement before convergence
		snapErr error
		snap    *Snapshot
	)
	for {
		s.supervise(ctx)
		if !s.apiDown && s.agentStarting == nil && s.node.Agent() != nil && len(s.pending) == 0 {
			cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			snap, snapErr = s.src.snapshot(cctx)
			cancel()
			if snapErr == nil {
				s.count("snapshots", 1)
				s.count("invariant-checks", Checks)
				if snap.Datapath != nil {
					s.count("invariant-checks", DatapathChecks)
				}
				vs = Check(snap, s.expect())
				if len(vs) == 0 {
					break
				}
				waited = vs
			}
		} else {
			snapErr = fmt.Errorf("not everything is up yet (API server down %v, agent starting %v, agent running %v, %d pod deletions pending)",
				s.apiDown, s.agentStarting != nil, s.node.Agent() != nil, len(s.pending))
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			break
		}
		select {
		case <-ctx.Done():
		case <-s.wake:
		case <-tick.C:
		}
	}
	if snapErr != nil {
		vs = append(vs, Violation{Invariant: "no-convergence", Object: "snapshot", Message: snapErr.Error()})
	}
	if len(vs) == 0 && snap != nil {
		vs = s.ids.check(snap, s.aliveNames())
	}
	if len(vs) == 0 && s.cfg.Datapath {
		if v := s.checkFlow("quiescent point " + name); v != nil {
			vs = append(vs, *v)
		}
		vs = append(vs, s.probePolicy(ctx)...)
	}
	if len(vs) == 0 {
		took := time.Since(began)
		s.tl.Addf("check", "quiescent point %s: all invariants hold (converged in %s)", name, took.Truncate(time.Millisecond))
		if took > s.cfg.Converge/4 && len(waited) > 0 {
			// Slow, though in time: say what it waited for.
			s.cfg.Logf("soak: quiescent point %s converged slowly (%s); the snapshot before still had %d disagreement(s), e.g. %s",
				name, took.Truncate(time.Millisecond), len(waited), waited[0])
		}
		vs = s.doctor(ctx)
	}
	if len(vs) > 0 {
		s.failedAt = name
		for _, v := range vs {
			s.violations = append(s.violations, v)
			s.tl.Addf("VIOLATION", "%s", v)
		}
		s.cfg.Logf("soak: quiescent point %s: %d violation(s) after %s", name, len(vs), time.Since(began).Truncate(time.Millisecond))
		return
	}
	s.cfg.Logf("soak: quiescent point %s at %s: %d pods, all invariants hold (converged in %s)",
		name, s.now().Truncate(time.Second), len(s.alive), time.Since(began).Truncate(time.Millisecond))
}

// doctor runs cellium doctor; its findings on a node that the soak found
// clean are violations.
func (s *Soak) doctor(ctx context.Context) []Violation {
	if s.doctorGone || s.cfg.Binaries.CLI == "" {
		return nil
	}
	findings, err := runDoctor(ctx, s.cfg.Binaries.CLI, s.node.AgentConfig().SocketPath())
	if errors.Is(err, errNoDoctor) {
		s.doctorGone = true
		s.cfg.Logf("soak: cellium doctor: the CLI has no doctor command in this tree; doctor checks skipped")
		return nil
	}
	s.count("doctor-runs", 1)
	if err != nil {
		return []Violation{{Invariant: "doctor-failed", Object: "cellium doctor", Message: err.Error()}}
	}
	// The doctor sees every lxc link of the host, also those of other
	// tests' agents running beside the soak: a finding about a link
	// labelled with a container that is not the soak's is theirs.
	// The links are listed after the doctor looked: an orphan veth that is
	// gone by then was another test's pod being torn down (the soak's own
	// pods are quiescent here).
	foreign := map[string]string{}
	present := map[string]bool{}
	listed := false
	if links, err := s.host.ListHostInterfaces(); err == nil {
		listed = true
		for _, l := range links {
			present[l.Name] = true
			if !strings.HasPrefix(l.ContainerID, s.prefix) {
				foreign[l.Name] = l.ContainerID
			}
		}
	}
	var out []Violation
	for _, f := range findings {
		if cid, ok := foreign[f.Object]; ok {
			s.count("doctor-foreign", 1)
			s.tl.Addf("doctor", "ignored finding %s about %s: container %q is not the soak's (another test's agent)", f.Kind, f.Object, shortID(cid))
			continue
		}
		if f.Kind == "orphan-veth" && listed && !present[f.Object] {
			s.count("doctor-foreign", 1)
			s.tl.Addf("doctor", "ignored finding %s about %s: the link is gone (another test's pod torn down meanwhile)", f.Kind, f.Object)
			continue
		}
		out = append(out, Violation{Invariant: "doctor:" + f.Kind, Object: f.Object, Message: f.Message + " (hint: " + f.Hint + ")"})
	}
	if len(out) == 0 {
		s.tl.Addf("doctor", "cellium doctor: clean")
	}
	return out
}

func (s *Soak) expect() *Expect {
	return &Expect{Alive: s.aliveNames(), ContainerPrefix: s.prefix, NetnsPrefixes: s.src.netnsPrefixes}
}

func (s *Soak) aliveNames() map[string]bool {
	out := make(map[string]bool, len(s.alive))
	for n := range s.alive {
		out[n] = true
	}
	return out
}

// Close stops everything the soak started and removes what it made: the
// API server is brought back if down, the node's pods are torn down
// through CNI DEL (node.Cleanup), then whatever is left of the soak's
// network namespaces and veths is removed by force. It returns what
// failed and what had to be removed by force.
func (s *Soak) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	var errs []error
	if s.apiDown {
		if err := s.cfg.Cluster.StartAPIServer(ctx); err != nil {
			errs = append(errs, fmt.Errorf("restart the API server for the clean-up: %w", err))
		}
		s.apiDown = false
	}
	if s.stopInformers != nil {
		s.stopInformers()
		s.informersDone.Wait()
	}
	// The pinned connection keeps its pods' namespaces (and veths) alive.
	s.closeFlow()
	for path := range s.ownNetns {
		errs = append(errs, removeNetns(path))
	}
	if s.op != nil {
		errs = append(errs, s.op.Stop(15*time.Second))
	}
	if s.node != nil {
		if r := s.node.Agent(); r != nil && exited(r) {
			_ = s.node.StopAgent() // so that Cleanup starts a new one
		}
		errs = append(errs, s.node.Cleanup(ctx))
		if err := s.cilium.CiliumV2().CiliumNodes().Delete(ctx, s.node.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("delete CiliumNode %s: %w", s.node.Name, err))
		}
	}
	if s.agent != nil {
		s.agent.Close()
	}
	if s.klog != nil {
		_ = s.klog.Close()
	}
	if s.cfg.Datapath {
		errs = append(errs, s.giveBackHostNetwork(ctx))
	}
	if forced := s.removeLeftovers(); len(forced) > 0 {
		errs = append(errs, fmt.Errorf("removed by force after the clean-up: %s", strings.Join(forced, ", ")))
	}
	return errors.Join(errs...)
}

// removeLeftovers removes host links labelled with the soak's container
// IDs and the soak's pinned network namespaces, and says which.
func (s *Soak) removeLeftovers() []string {
	var forced []string
	if links, err := s.host.ListHostInterfaces(); err == nil && s.hostNS != nil {
		_ = s.hostNS.Do(func(ns.NetNS) error {
			for _, l := range links {
				if s.prefix == "" || !strings.HasPrefix(l.ContainerID, s.prefix) {
					continue
				}
				if nl, err := netlink.LinkByIndex(l.Index); err == nil && nl.Attrs().Name == l.Name {
					if err := netlink.LinkDel(nl); err == nil {
						forced = append(forced, "link "+l.Name)
					}
				}
			}
			return nil
		})
	}
	if s.hostNS != nil {
		_ = s.hostNS.Close()
	}
	if s.src != nil {
		names, _ := listDir(s.src.netnsDir)
		for _, n := range names {
			for _, p := range s.src.netnsPrefixes {
				if strings.HasPrefix(n, p) {
					if err := removeNetns(filepath.Join(s.src.netnsDir, n)); err == nil {
						forced = append(forced, "netns "+n)
					}
				}
			}
		}
	}
	return forced
}

// removeNetns unpins and removes a pinned network namespace; a missing
// one is fine.
func removeNetns(path string) error {
	if err := syscall.Unmount(path, syscall.MNT_DETACH); err != nil && !errors.Is(err, syscall.EINVAL) && !errors.Is(err, syscall.ENOENT) {
		return fmt.Errorf("unmount netns %s: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove netns %s: %w", path, err)
	}
	return nil
}

// LogTails returns the last lines of the operator's, the agent's and the
// kubelet's logs.
func (s *Soak) LogTails(n int) string {
	var b strings.Builder
	for _, f := range []string{"cellium-operator.log", "node/agent/cellium-agent.log", "node/kubelet.log"} {
		fmt.Fprintf(&b, "--- last lines of %s ---\n%s\n", f, tailFile(filepath.Join(s.cfg.Dir, f), n))
	}
	return b.String()
}

func tailFile(path string, n int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
