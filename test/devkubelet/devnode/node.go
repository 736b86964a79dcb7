package devnode

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/cellium/cellium/api/v1/client"
	"github.com/cellium/cellium/test/devkubelet"
	"github.com/cellium/cellium/test/harness"
)

// stopTimeout is how long a process gets after SIGTERM.
const stopTimeout = 15 * time.Second

// StartOperator starts cellium-operator and waits until its health API
// answers ok. The caller stops the returned process.
func StartOperator(ctx context.Context, cfg OperatorConfig) (*harness.Running, error) {
	p, err := cfg.Process()
	if err != nil {
		return nil, err
	}
	r, err := p.Start()
	if err != nil {
		return nil, err
	}
	if err := WaitOperator(ctx, cfg, r); err != nil {
		_ = r.Stop(stopTimeout)
		return nil, err
	}
	return r, nil
}

// NodeOptions configure a [Node].
type NodeOptions struct {
	// Name is the node's name; default "node-" and five random letters.
	Name string
	// IP is the node's InternalIP; default NodeIP(Name).
	IP netip.Addr
	// Dir holds everything of the node; it must exist and be short (the
	// agent's socket lives in it).
	Dir string
	// AgentArgs are more flags of cellium-agent.
	AgentArgs []string
	// Workers is the kubelet's; default devkubelet.DefaultWorkers.
	Workers int
	// Logger receives the kubelet's log; nil discards it.
	Logger *slog.Logger
	// SandboxIDPrefix starts the kubelet's sandbox IDs (see
	// devkubelet.Config.SandboxIDPrefix).
	SandboxIDPrefix string
	// HostRouting and BPF are the agent's (AgentConfig.HostRouting,
	// AgentConfig.BPF); Cleanup unmounts the agent's bpffs when BPF is on.
	HostRouting, BPF bool
	// SocketLB is the agent's AgentConfig.SocketLB.
	SocketLB bool
	// Netns, if set, is the node's network namespace: the agent runs in
	// it (AgentConfig.Netns) and the kubelet runs the CNI plugin in it
	// (devkubelet.Config.PluginNetns).
	Netns string
}

// Node is one node of a harness cluster run by this process: the agent
// as a child process and the devkubelet in-process, each of which can be
// stopped and started again (restart tests).
type Node struct {
	// Name and IP are the node's.
	Name string
	IP   netip.Addr
	// Dir holds the agent's and the kubelet's state.
	Dir string

	agentCfg AgentConfig
	opts     NodeOptions
	cs       kubernetes.Interface

	mu          sync.Mutex
	agent       *harness.Running
	kubelet     *devkubelet.Kubelet
	stopKubelet func() error
}

// NewNode prepares a node on the cluster: its directories and the CNI
// plugin in its CNI binary directory. It starts nothing. kubeconfig is the
// agent's (Cluster.AgentKubeconfig: its ServiceAccount's token); cs, an
// admin clientset, is the kubelet's.
func NewNode(kubeconfig string, cs kubernetes.Interface, bins Binaries, opts NodeOptions) (*Node, error) {
	if opts.Name == "" {
		opts.Name = "node-" + strings.ToLower(rand.Text()[:5])
	}
	if !opts.IP.IsValid() {
		opts.IP = NodeIP(opts.Name)
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	n := &Node{
		Name: opts.Name,
		IP:   opts.IP,
		Dir:  opts.Dir,
		agentCfg: AgentConfig{
			Binary:      bins.Agent,
			Kubeconfig:  kubeconfig,
			NodeName:    opts.Name,
			Dir:         filepath.Join(opts.Dir, "agent"),
			Args:        opts.AgentArgs,
			HostRouting: opts.HostRouting,
			BPF:         opts.BPF,
			SocketLB:    opts.SocketLB,
			Netns:       opts.Netns,
		},
		opts: opts,
		cs:   cs,
	}
	for _, d := range []string{n.agentCfg.Dir, n.agentCfg.CNIConfDir(), n.KubeletStateDir()} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, fmt.Errorf("node %s: %w", n.Name, err)
		}
	}
	if err := LinkCNIPlugin(bins.CNIPlugin, n.CNIBinDir()); err != nil {
		return nil, fmt.Errorf("node %s: %w", n.Name, err)
	}
	return n, nil
}

// AgentConfig is the configuration the agent runs with.
func (n *Node) AgentConfig() AgentConfig { return n.agentCfg }

// CNIBinDir holds the plugin for the kubelet.
func (n *Node) CNIBinDir() string { return filepath.Join(n.Dir, "cni-bin") }

// KubeletStateDir is the kubelet's state directory.
func (n *Node) KubeletStateDir() string { return filepath.Join(n.Dir, "kubelet") }

// AgentClient returns a client of the agent's API; close it after use.
func (n *Node) AgentClient() *client.Client { return client.New(n.agentCfg.SocketPath()) }

// Agent is the running agent process, or nil.
func (n *Node) Agent() *harness.Running {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.agent
}

// Kubelet is the running kubelet, or nil.
func (n *Node) Kubelet() *devkubelet.Kubelet {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.kubelet
}

// StartAgent starts cellium-agent and waits until it answers and has
// written its conflist.
func (n *Node) StartAgent(ctx context.Context) error {
	r, err := n.LaunchAgent()
	if err != nil {
		return err
	}
	if err := WaitAgent(ctx, n.agentCfg, r); err != nil {
		n.mu.Lock()
		if n.agent == r {
			n.agent = nil
		}
		n.mu.Unlock()
		_ = r.Stop(stopTimeout)
		return fmt.Errorf("node %s: %w", n.Name, err)
	}
	return nil
}

// LaunchAgent starts cellium-agent and returns without waiting for it to
// be ready ([WaitAgent] does that): for a restart while the API server
// is down, when readiness may take long or never come. The node holds
// the process as its agent until StopAgent or KillAgent.
//
// Errors: an agent is running already; the conflist of the previous run
// cannot be removed; the process cannot be started.
func (n *Node) LaunchAgent() (*harness.Running, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.agent != nil {
		return nil, fmt.Errorf("node %s: agent already running", n.Name)
	}
	// A conflist left by the previous run would let the kubelet go on
	// before the agent is back.
	if err := os.Remove(n.agentCfg.ConfListPath()); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	p, err := n.agentCfg.Process()
	if err != nil {
		return nil, err
	}
	r, err := p.Start()
	if err != nil {
		return nil, err
	}
	n.agent = r
	return r, nil
}

// SetSocketLB switches the socket load balancer (AgentConfig.SocketLB) for
// the agent's next start.
func (n *Node) SetSocketLB(on bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.agentCfg.SocketLB = on
}

// StopAgent stops the agent (SIGTERM); its state directory stays, so
// StartAgent restores it.
func (n *Node) StopAgent() error {
	n.mu.Lock()
	r := n.agent
	n.agent = nil
	n.mu.Unlock()
	if r == nil {
		return nil
	}
	return r.Stop(stopTimeout)
}

// KillAgent kills the agent with SIGKILL, as a crash or the OOM killer
// would: it cleans nothing up, its socket file and state stay for the
// next StartAgent.
func (n *Node) KillAgent() error {
	n.mu.Lock()
	r := n.agent
	n.agent = nil
	n.mu.Unlock()
	if r == nil {
		return nil
	}
	return r.Kill()
}

// StartKubelet starts the devkubelet in-process: Run goes on in the
// background (it registers the node and handles pods) until StopKubelet.
func (n *Node) StartKubelet() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.kubelet != nil {
		return fmt.Errorf("node %s: kubelet already running", n.Name)
	}
	k, err := devkubelet.New(devkubelet.Config{
		NodeName:        n.Name,
		NodeIP:          n.IP,
		CNIConfDir:      n.agentCfg.CNIConfDir(),
		CNIBinDirs:      []string{n.CNIBinDir()},
		StateDir:        n.KubeletStateDir(),
		Workers:         n.opts.Workers,
		Logger:          n.opts.Logger,
		SandboxIDPrefix: n.opts.SandboxIDPrefix,
		PluginNetns:     n.opts.Netns,
	}, n.cs)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- k.Run(ctx) }()
	n.kubelet = k
	n.stopKubelet = func() error {
		cancel()
		return <-done
	}
	return nil
}

// StopKubelet stops the kubelet, leaving its sandboxes in place.
func (n *Node) StopKubelet() error {
	n.mu.Lock()
	stop := n.stopKubelet
	n.kubelet, n.stopKubelet = nil, nil
	n.mu.Unlock()
	if stop == nil {
		return nil
	}
	return stop()
}

// Cleanup stops everything and removes what the node made: the kubelet's
// sandboxes through CNI DEL (the agent is started for it if needed and
// possible), then the agent; whatever is still left is removed by force
// (RemoveLeftovers). The node's directory stays.
func (n *Node) Cleanup(ctx context.Context) error {
	var errs []error
	errs = append(errs, n.StopKubelet())
	if n.Agent() == nil {
		if err := n.StartAgent(ctx); err != nil {
			errs = append(errs, fmt.Errorf("start the agent for cleanup: %w", err))
		}
	}
	if n.Agent() != nil {
		k, err := devkubelet.New(devkubelet.Config{
			NodeName:    n.Name,
			NodeIP:      n.IP,
			CNIConfDir:  n.agentCfg.CNIConfDir(),
			CNIBinDirs:  []string{n.CNIBinDir()},
			StateDir:    n.KubeletStateDir(),
			PluginNetns: n.opts.Netns,
		}, n.cs)
		if err == nil {
			cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			err = k.Cleanup(cctx)
			cancel()
		}
		errs = append(errs, err)
	}
	errs = append(errs, n.StopAgent())
	_, err := devkubelet.RemoveLeftovers(n.KubeletStateDir())
	errs = append(errs, err)
	if n.agentCfg.BPF {
		// The agent is gone: its bpffs (pins, links) goes with the mount.
		errs = append(errs, n.agentCfg.UnmountBPF())
	}
	return errors.Join(errs...)
}
