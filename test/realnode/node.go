package realnode

import (
	"bufio"
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cellium/cellium/api/v1/client"
	"github.com/cellium/cellium/statedb/routes"
	"github.com/cellium/cellium/test/devkubelet/devnode"
	"github.com/cellium/cellium/test/harness"
)

// Names of the node's processes (and of their log files, <name>.log).
const (
	Containerd    = "containerd"
	Kubelet       = "kubelet"
	KubeScheduler = "kube-scheduler"
	KubeProxy     = "kube-proxy"
)

// stopTimeout is how long a process gets after SIGTERM.
const stopTimeout = 15 * time.Second

// Options configure [Start].
type Options struct {
	// Cluster is the control plane. Its API server should run the Node
	// authorizer (APIServerArgs "--authorization-mode=Node,RBAC"): the
	// kubelet authenticates as system:node:<name> in system:nodes and gets
	// exactly a node's permissions.
	Cluster *harness.Cluster
	// Binaries are the node's programs (harness.EnsureNodeBinaries).
	Binaries harness.NodeBinaries
	// Agent and CNIPlugin are cellium-agent and cellium-cni, run by the
	// node as a process and linked into its CNI binary directory. Both
	// empty: cellium comes as pods ([Install]: the agent's DaemonSet
	// installs the plugin and writes the conflist); the node's directory is
	// then made a shared mount (containerd requires one for the
	// DaemonSet's mount propagation), Start returns once the kubelet has
	// registered the Node (Ready follows the agent's conflist), and Stop
	// deletes the pods that are not in the host network and waits for the
	// agent to release them before it stops the node, then removes what
	// the agent left in the host's network namespace.
	Agent, CNIPlugin string
	// AgentKubeconfig is the agent's (Cluster.AgentKubeconfig).
	AgentKubeconfig string
	// AgentArgs are more flags of the agent.
	AgentArgs []string
	// Dir holds everything of the node; it is created if needed and must
	// be short (unix sockets live in it). Stop leaves it (the logs) to the
	// caller; after a crash, Recover(Dir) cleans up.
	Dir string
	// Images are OCI archives to import into containerd before the
	// kubelet starts; the pause image (SandboxImage) must be one of them.
	Images []string
	// Scheduler also runs kube-scheduler (one per cluster).
	Scheduler bool
	// KubeProxy also runs kube-proxy in nftables mode, in the host's
	// network namespace: its tables (ip and ip6 "kube-proxy") are the
	// machine's, so only one node with KubeProxy may run at a time. Stop
	// deletes them.
	KubeProxy bool
	// ClusterCIDR is the pods' address space, for kube-proxy.
	ClusterCIDR string
	// ClusterDNS is the ClusterIP of the cluster's DNS Service (kube-dns,
	// [DeployCoreDNS]): the kubelet gives it to the pods as their
	// nameserver, with ClusterDomain. Empty: no cluster DNS.
	ClusterDNS string
	// IP is the node's address; the zero value picks a free one of
	// 10.254.0.0/16. [Up] picks it before the control plane starts, whose
	// API server advertises it.
	IP netip.Addr
	// Namespaces, if set, runs the node in network and mount namespaces
	// of its own (a node of a several-node cluster, [Up] with Nodes >= 2):
	// Start creates them on Bridge (which must exist) with IP (which must
	// then be Namespaces.IP or zero), containerd, the kubelet and
	// kube-proxy run inside them (kube-scheduler stays on the host), the
	// node's CNI directories, agent socket and pods' network namespaces are
	// its own folders at the standard paths ([StandardPaths]), kube-proxy's
	// tables are the node's, and no host-network lock is taken (the cluster
	// holds it). Only for cellium as pods (Agent empty). Stop removes the
	// namespaces.
	Namespaces *NodeNamespaces
	// Bridge is the nodes' bridge (EnsureBridge), with Namespaces.
	Bridge string
	// StartTimeout bounds the start of each component; default 2 minutes.
	StartTimeout time.Duration
	// Detach runs the node's processes in sessions of their own, so that
	// they outlive the caller (make up); [Recover] stops them.
	Detach bool
	// Logger receives progress; nil discards it.
	Logger *slog.Logger
}

// Node is a running real node. Its Name is its IP address, so that the
// API server reaches the kubelet by the name without a resolver.
type Node struct {
	Name string
	IP   netip.Addr
	Dir  string

	opts     Options
	log      *slog.Logger
	host     hostState
	agentCfg devnode.AgentConfig

	procs []*harness.Running // in start order
	// unlock releases harness.LockHostNetwork (a node with kube-proxy or
	// with cellium as pods holds it while it runs); nil if not held.
	unlock func()
}

// hostState is what the node changes on the host and what was there
// before: Start writes it to the node's directory (stateFile) before it
// changes anything, so that [Recover] can undo it after a crash.
type hostState struct {
	Name        string            `json:"name"`
	LinkName    string            `json:"linkName"`
	CgroupRoot  string            `json:"cgroupRoot"`
	Socket      string            `json:"containerdSocket"`
	PodLogsDir  string            `json:"podLogsDir"`
	Sysctls     map[string]string `json:"sysctls"`     // as before the kubelet
	HadLogLinks bool              `json:"hadLogLinks"` // /var/log/containers existed before
	HadRunCtrd  bool              `json:"hadRunContainerd"`
	HadVarCNI   bool              `json:"hadVarLibCNI"`
	HadResults  map[string]bool   `json:"hadResults"` // the files in /var/lib/cni/results before
	HadKubelet  map[string]bool   `json:"hadKubelet"` // which of the kubelet's default directories existed before
	HadDPSocket bool              `json:"hadDevicePluginSocket"`
	// ShimSocketDir is the shims' socket directory when it is outside the
	// node's directory (a long path): removed with the node.
	ShimSocketDir string `json:"shimSocketDir,omitempty"`
	// AgentInPod: cellium runs as pods (Options.Agent empty); the node's
	// directory is a shared bind mount of itself, and the agent's host
	// network state is removed when the node stops.
	AgentInPod bool `json:"agentInPod,omitempty"`
	// NFTables are the nftables tables ("ip kube-proxy") kube-proxy and the
	// portmap CNI plugin make, which were not there before.
	NFTables []string `json:"nftables,omitempty"`
	// Namespaces are the node's own namespaces (Options.Namespaces), and
	// NSMadeDirs the host directories their creation made: removed with
	// the node.
	Namespaces *NodeNamespaces `json:"namespaces,omitempty"`
	NSMadeDirs []string        `json:"nsMadeDirs,omitempty"`
	// AgentSocket is the agent's API socket as the host sees it (for the
	// drain of [Down]).
	AgentSocket string `json:"agentSocket,omitempty"`
}

// stateFile, in the node's directory, records its hostState.
const stateFile = "node-state.json"

// Start brings up a node: the node IP on a veth pair of its own,
// containerd (with the images imported), kube-scheduler if asked, the
// kubelet, and cellium-agent, and waits until the Node is Ready (the agent
// has written its conflist and containerd's CRI reports the network
// ready). On error everything started is stopped and removed again.
//
// Errors: not root; a binary is missing; a component exits or is not ready
// in time (with the tail of its log).
func Start(ctx context.Context, opts Options) (_ *Node, err error) {
	if opts.StartTimeout <= 0 {
		opts.StartTimeout = 2 * time.Minute
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if opts.Binaries.Runc == "" {
		return nil, errors.New("start real node: runc is not installed: run make deps (Debian: apt-get install runc)")
	}
	ip := opts.IP
	if ns := opts.Namespaces; ns != nil {
		switch {
		case opts.Agent != "":
			return nil, errors.New("start real node: a node in namespaces of its own runs cellium as pods only (Options.Agent empty)")
		case opts.Bridge == "":
			return nil, errors.New("start real node: a node in namespaces of its own needs the nodes' bridge (Options.Bridge)")
		case ip.IsValid() && ip != ns.IP:
			return nil, fmt.Errorf("start real node: IP %s differs from the namespaces' %s: leave IP zero", ip, ns.IP)
		}
		ip = ns.IP
	}
	if !ip.IsValid() {
		if ip, err = PickNodeIP(); err != nil {
			return nil, err
		}
	}
	b := ip.As4()
	n := &Node{
		Name: ip.String(),
		IP:   ip,
		Dir:  opts.Dir,
		opts: opts,
		log:  log,
	}
	n.host = hostState{
		Name:       n.Name,
		LinkName:   fmt.Sprintf("crn%02x%02x", b[2], b[3]),
		CgroupRoot: "/cellium-rn-" + strings.ReplaceAll(ip.String(), ".", "-"),
		Socket:     n.ContainerdSocket(),
		PodLogsDir: n.podLogsDir(),
	}
	n.agentCfg = devnode.AgentConfig{
		Binary:     opts.Agent,
		Kubeconfig: opts.AgentKubeconfig,
		NodeName:   n.Name,
		Dir:        filepath.Join(n.Dir, "agent"),
		Args:       opts.AgentArgs,
	}
	h := &n.host
	if ns := opts.Namespaces; ns != nil {
		h.LinkName = ns.HostLink()
		h.Namespaces = ns
		// The chart's default socket directory, /var/run/cellium, is the
		// node's root/run/cellium.
		n.agentCfg.Dir = filepath.Join(ns.RootDir(), "run", "cellium")
	}
	h.AgentSocket = n.agentCfg.SocketPath()
	h.AgentInPod = opts.Agent == ""
	// The lock first: what was on the host before (sysctls, the kubelet's
	// fixed directories) is read once the node before has restored it, not
	// while another node (or a several-node cluster's mount points) has it.
	if (opts.KubeProxy || h.AgentInPod) && h.Namespaces == nil {
		// kube-proxy's tables and the host-routing agent are the
		// machine's: one such node (or host-routing test) at a time.
		n.unlock, err = harness.LockHostNetwork(ctx, func() {
			log.Info("waiting for another node or host-routing test on this machine to finish")
		})
		if err != nil {
			return nil, fmt.Errorf("start real node: %w", err)
		}
		defer func() {
			if err != nil {
				n.releaseLock()
			}
		}()
		if err := WaitHostFree(ctx, opts.KubeProxy, h.AgentInPod, log); err != nil {
			return nil, fmt.Errorf("start real node: %w", err)
		}
	}
	// The machine's values from before any node's kubelet: the last node
	// to stop restores them.
	if h.Sysctls, err = machineKubeletSysctls().hold(h.CgroupRoot, h.CgroupRoot); err != nil {
		return nil, err
	}
	h.HadLogLinks = exists(containerLogLinks)
	h.HadRunCtrd = exists(runContainerd)
	h.HadVarCNI = exists(varLibCNI)
	h.HadResults = cniResults()
	h.HadDPSocket = exists(devicePluginSocket)
	h.HadKubelet = map[string]bool{}
	for _, d := range kubeletDefaultDirs {
		h.HadKubelet[d] = exists(d)
	}
	if h.AgentInPod && h.Namespaces == nil {
		// The portmap plugin (cni.chainingMode=portmap) makes its nftables
		// tables in the host's namespace and never deletes them: those that
		// are not there yet go with the node.
		for _, tbl := range portmapTables {
			if !nftTableExists(tbl) {
				h.NFTables = append(h.NFTables, tbl)
			}
		}
	}
	if err := os.MkdirAll(n.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("start real node: %w", err)
	}
	if err := n.writeState(); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			err = errors.Join(fmt.Errorf("start real node %s: %w", n.Name, err), n.Stop(context.Background()))
		}
	}()
	began := time.Now()
	if ns := h.Namespaces; ns != nil {
		made, err := ns.Create(ctx, opts.Bridge)
		if err != nil {
			return nil, err
		}
		h.NSMadeDirs = made
		if err := n.writeState(); err != nil {
			return nil, err
		}
	} else if err := nodeLink(h.LinkName, h.LinkName+"p", ip); err != nil {
		return nil, err
	}
	for _, d := range []string{n.CNIBinDir(), n.CNIConfDir(), n.kubeletDir(), n.podLogsDir()} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, err
		}
	}
	if h.Namespaces != nil {
		// The node's / is a shared mount inside its mount namespace.
	} else if h.AgentInPod {
		if err := sharedMount(n.Dir); err != nil {
			return nil, err
		}
	} else if err := os.Symlink(opts.CNIPlugin, filepath.Join(n.CNIBinDir(), devnode.CNIPlugin)); err != nil {
		return nil, err
	}
	if err := os.Symlink(opts.Binaries.Loopback, filepath.Join(n.CNIBinDir(), "loopback")); err != nil {
		return nil, err
	}

	if err := n.startContainerd(ctx); err != nil {
		return nil, err
	}
	for _, img := range opts.Images {
		if _, err := n.Ctr(ctx, "images", "import", "--local", img); err != nil {
			return nil, fmt.Errorf("import image: %w", err)
		}
	}
	if opts.Scheduler {
		if err := n.startScheduler(ctx); err != nil {
			return nil, err
		}
	}
	if err := n.startKubelet(ctx); err != nil {
		return nil, err
	}
	if opts.KubeProxy {
		if err := n.startKubeProxy(ctx); err != nil {
			return nil, err
		}
	}
	if h.AgentInPod {
		log.Info("real node registered; its network comes with cellium's DaemonSet", "name", n.Name, "dir", n.Dir,
			"took", time.Since(began).Round(time.Millisecond))
		return n, nil
	}
	if err := n.startAgent(ctx); err != nil {
		return nil, err
	}
	if err := n.WaitReady(ctx); err != nil {
		return nil, err
	}
	log.Info("real node ready", "name", n.Name, "dir", n.Dir, "took", time.Since(began).Round(time.Millisecond))
	return n, nil
}

// Host paths outside the node's directory that containerd and the kubelet
// use whatever they are told.
const (
	containerLogLinks = "/var/log/containers" // the kubelet's links to pod logs
	// devicePluginSocket is the kubelet's registration socket for device
	// plugins: its path is fixed, whatever --root-dir says.
	devicePluginSocket = "/var/lib/kubelet/device-plugins/kubelet.sock"
	runContainerd      = "/run/containerd" // containerd's default state directory
	varLibCNI          = "/var/lib/cni"    // libcni's cache of results
)

// kubeletDefaultDirs are the kubelet's default directories, which the
// node's flags replace (but for the device plugins' socket, whose path is
// fixed): Stop removes them if they appear, Leftovers reports them.
var kubeletDefaultDirs = []string{"/var/lib/kubelet", "/var/log/pods", "/etc/kubernetes"}

// PickNodeIP picks a random address of 10.254.0.0/16 that is not on this
// machine yet, for Options.IP.
//
// Errors: the machine's addresses cannot be read; none is free after 100
// tries.
func PickNodeIP() (netip.Addr, error) {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return netip.Addr{}, fmt.Errorf("pick node IP: %w", err)
	}
	for range 100 {
		var r [2]byte
		_, _ = rand.Read(r[:])
		if r[1] == 0 || r[1] == 255 {
			continue
		}
		ip := netip.AddrFrom4([4]byte{10, 254, r[0], r[1]})
		taken := slices.ContainsFunc(addrs, func(a net.Addr) bool {
			p, err := netip.ParsePrefix(a.String())
			return err == nil && p.Addr() == ip
		})
		if !taken {
			return ip, nil
		}
	}
	return netip.Addr{}, errors.New("pick node IP: no free address in 10.254.0.0/16")
}

func exists(p string) bool {
	_, err := os.Lstat(p)
	return err == nil
}

// CNIBinDir holds cellium-cni and loopback for containerd, as the host
// sees it (a node in namespaces: its own /opt/cni/bin).
func (n *Node) CNIBinDir() string {
	if ns := n.host.Namespaces; ns != nil {
		return filepath.Join(ns.RootDir(), "opt", "cni", "bin")
	}
	return filepath.Join(n.Dir, "cni-bin")
}

// CNIConfDir is where the agent writes its conflist for containerd, as
// the host sees it (a node in namespaces: its own /etc/cni/net.d).
func (n *Node) CNIConfDir() string {
	if ns := n.host.Namespaces; ns != nil {
		return filepath.Join(ns.RootDir(), "etc", "cni", "net.d")
	}
	return n.agentCfg.CNIConfDir()
}

// ConfListPath is the agent's conflist, as the host sees it.
func (n *Node) ConfListPath() string {
	return filepath.Join(n.CNIConfDir(), filepath.Base(n.agentCfg.ConfListPath()))
}

// Namespaces are the node's own namespaces (Options.Namespaces), nil for
// a node in the host's.
func (n *Node) Namespaces() *NodeNamespaces { return n.host.Namespaces }

// AgentConfig is the agent's configuration (socket, conflist, log).
func (n *Node) AgentConfig() devnode.AgentConfig { return n.agentCfg }

// ContainerdSocket is containerd's gRPC socket (also its CRI endpoint).
func (n *Node) ContainerdSocket() string { return filepath.Join(n.Dir, "containerd.sock") }

func (n *Node) containerdDir() string { return filepath.Join(n.Dir, "containerd") }
func (n *Node) kubeletDir() string    { return filepath.Join(n.Dir, "kubelet") }
func (n *Node) podLogsDir() string    { return filepath.Join(n.Dir, "pod-logs") }

// CgroupProcs is the cgroup.procs file of the node's cgroup subtree (the
// cgroup v2 hierarchy the node's socket programs attach to): a process
// that writes its PID there runs as a process of the node.
func (n *Node) CgroupProcs() string {
	return filepath.Join("/sys/fs/cgroup/unified", n.host.CgroupRoot, "cgroup.procs")
}

// NetnsDir is where the node's containerd pins the pods' network
// namespaces (netns_mounts_under_state_dir: its CRI plugin's state
// directory, /netns).
func (n *Node) NetnsDir() string {
	return filepath.Join(n.containerdDir(), "state", "io.containerd.grpc.v1.cri", "netns")
}

// maxShimSocketDir is the longest socket_dir containerd accepts.
const maxShimSocketDir = 42

// shimSocketDir is the directory of the shims' sockets: in the node's
// directory if its path is short enough for containerd, else
// /run/cellium-<link name> (a name of this node alone), which Stop removes.
func (n *Node) shimSocketDir() string {
	if d := filepath.Join(n.containerdDir(), "s"); len(d) <= maxShimSocketDir {
		return d
	}
	return filepath.Join("/run", "cellium-"+n.host.LinkName)
}

// LogFile is the log of a process of the node (Containerd, Kubelet,
// KubeScheduler, devnode.Agent).
func (n *Node) LogFile(name string) string {
	if name == devnode.Agent {
		return filepath.Join(n.agentCfg.Dir, devnode.Agent+".log")
	}
	return filepath.Join(n.Dir, name+".log")
}

// Ctr runs ctr against the node's containerd in the k8s.io namespace (the
// CRI's) and returns its standard output; a failure's error carries its
// standard error.
func (n *Node) Ctr(ctx context.Context, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, n.opts.Binaries.Ctr, append([]string{"--address", n.ContainerdSocket(), "--namespace", "k8s.io"}, args...)...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return out, fmt.Errorf("ctr %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return out, nil
}

// nodeProcess is process, run inside the node's namespaces if it has
// them (nsenter execs the program: the pid file stays right).
func (n *Node) nodeProcess(name, path string, args []string, env ...string) harness.Process {
	p := n.process(name, path, args, env...)
	if ns := n.host.Namespaces; ns != nil {
		p.Path = "nsenter"
		p.Args = ns.Wrap(path, args...)
	}
	return p
}

func (n *Node) process(name, path string, args []string, env ...string) harness.Process {
	return harness.Process{
		Name:    name,
		Path:    path,
		Args:    args,
		Env:     env,
		Dir:     n.Dir,
		LogFile: n.LogFile(name),
		PidFile: filepath.Join(n.Dir, name+".pid"),
		Detach:  n.opts.Detach,
	}
}

// start starts p and waits until ready returns nil, p exits or the start
// timeout ends.
func (n *Node) start(ctx context.Context, p harness.Process, ready func(context.Context) error) (*harness.Running, error) {
	r, err := p.Start()
	if err != nil {
		return nil, err
	}
	n.procs = append(n.procs, r)
	ctx, cancel := context.WithTimeout(ctx, n.opts.StartTimeout)
	defer cancel()
	began := time.Now()
	if err := devnode.WaitFor(ctx, r, func() error { return ready(ctx) }); err != nil {
		return r, err
	}
	n.log.Debug("component ready", "name", p.Name, "took", time.Since(began).Round(time.Millisecond))
	return r, nil
}

func (n *Node) startContainerd(ctx context.Context) error {
	d := n.containerdDir()
	cfg := containerdConfig{
		Root:          filepath.Join(d, "root"),
		State:         filepath.Join(d, "state"),
		Temp:          filepath.Join(d, "tmp"),
		Socket:        n.ContainerdSocket(),
		ShimSocketDir: n.shimSocketDir(),
		RuncRoot:      filepath.Join(d, "runc"),
		Runc:          n.opts.Binaries.Runc,
		CNIBinDir:     n.CNIBinDir(),
		CNIConfDir:    n.agentCfg.CNIConfDir(),
		SandboxImage:  SandboxImage,
	}
	if n.host.Namespaces != nil {
		// The paths inside the node's mount namespace: its own folders,
		// where the chart's default host paths point.
		cfg.CNIBinDir = "/opt/cni/bin"
		cfg.CNIConfDir = "/etc/cni/net.d"
		cfg.NetnsInVarRun = true // the chart's netnsDir
	}
	if cfg.ShimSocketDir != filepath.Join(d, "s") {
		// Recorded before it is made, for Stop and Recover.
		n.host.ShimSocketDir = cfg.ShimSocketDir
		if err := n.writeState(); err != nil {
			return err
		}
	}
	for _, dir := range []string{cfg.Root, cfg.State, cfg.Temp, cfg.ShimSocketDir, cfg.RuncRoot} {
		if err := os.MkdirAll(dir, 0o711); err != nil {
			return err
		}
	}
	text, err := cfg.render()
	if err != nil {
		return err
	}
	conf := filepath.Join(n.Dir, "containerd.toml")
	if err := os.WriteFile(conf, text, 0o644); err != nil {
		return err
	}
	// containerd finds its shim on PATH.
	path := filepath.Dir(n.opts.Binaries.ContainerdShim) + string(os.PathListSeparator) + os.Getenv("PATH")
	p := n.nodeProcess(Containerd, n.opts.Binaries.Containerd, []string{"--config", conf, "--log-level", "info"}, "PATH="+path)
	_, err = n.start(ctx, p, func(ctx context.Context) error {
		_, err := n.Ctr(ctx, "version")
		return err
	})
	return err
}

func (n *Node) startScheduler(ctx context.Context) error {
	kc, err := n.opts.Cluster.ClientCertKubeconfig("kube-scheduler", "system:kube-scheduler")
	if err != nil {
		return err
	}
	port, err := devnode.FreePort()
	if err != nil {
		return err
	}
	p := n.process(KubeScheduler, n.opts.Binaries.KubeScheduler, []string{
		"--kubeconfig=" + kc,
		"--authentication-kubeconfig=" + kc,
		"--authorization-kubeconfig=" + kc,
		"--authentication-skip-lookup=true",
		"--leader-elect=false",
		"--bind-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(port),
	})
	_, err = n.start(ctx, p, func(ctx context.Context) error {
		return httpsOK(ctx, "https://127.0.0.1:"+strconv.Itoa(port)+"/healthz")
	})
	return err
}

func (n *Node) startKubelet(ctx context.Context) error {
	c := n.opts.Cluster
	kc, err := c.ClientCertKubeconfig("node-"+n.Name, "system:node:"+n.Name, "system:nodes")
	if err != nil {
		return err
	}
	ports, err := freePorts(2)
	if err != nil {
		return err
	}
	text, err := kubeletConfig{
		RuntimeSocket: n.ContainerdSocket(),
		CgroupRoot:    n.host.CgroupRoot,
		PodLogsDir:    n.podLogsDir(),
		NodeIP:        n.IP.String(),
		Port:          ports[0],
		HealthzPort:   ports[1],
		ClientCAFile:  c.CACertFile(),
		ClusterDNS:    n.opts.ClusterDNS,
		ClusterDomain: ClusterDomain,
	}.render()
	if err != nil {
		return err
	}
	conf := filepath.Join(n.Dir, "kubelet.yaml")
	if err := os.WriteFile(conf, text, 0o644); err != nil {
		return err
	}
	if err := makeCgroupRoot(n.host.CgroupRoot); err != nil {
		return err
	}
	if err := n.mountAgentCgroup(ctx); err != nil {
		return err
	}
	p := n.nodeProcess(Kubelet, n.opts.Binaries.Kubelet, []string{
		"--config=" + conf,
		"--kubeconfig=" + kc,
		"--root-dir=" + n.kubeletDir(),
		"--cert-dir=" + filepath.Join(n.kubeletDir(), "pki"),
		"--hostname-override=" + n.Name,
		"--node-ip=" + n.IP.String(),
		"--v=2",
	})
	// Registered: the Node object exists.
	_, err = n.start(ctx, p, func(ctx context.Context) error {
		_, err := c.Clientset().CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
		return err
	})
	return err
}

// AgentCgroupRoot is the chart's default agent.cgroupRoot, where the
// agent's socket load balancer finds the cgroup v2 hierarchy it attaches
// to (--cgroup-root).
const AgentCgroupRoot = "/run/cellium/cgroupv2"

// mountAgentCgroup bind-mounts, for a node in namespaces of its own, the
// node's cgroup v2 subtree (the unified hierarchy's cgroup root, where
// runc puts the node's containers too) at AgentCgroupRoot inside the
// node's mount namespace, so that its agent's cgroup programs see the
// node's sockets only, never another node's. The chart's mount-cgroup
// step leaves a cgroup2 mount there alone. Nothing for a node in the
// host's namespaces.
func (n *Node) mountAgentCgroup(ctx context.Context) error {
	ns := n.host.Namespaces
	if ns == nil {
		return nil
	}
	sub := filepath.Join("/sys/fs/cgroup/unified", n.host.CgroupRoot)
	if _, err := os.Stat(sub); err != nil {
		return fmt.Errorf("the node's cgroup v2 subtree: %w (a machine without the unified hierarchy at /sys/fs/cgroup/unified cannot give each node its own)", err)
	}
	out, err := ns.Command(ctx, "sh", "-c", "mkdir -p "+AgentCgroupRoot+" && mount --bind "+sub+" "+AgentCgroupRoot).CombinedOutput()
	if err != nil {
		return fmt.Errorf("bind-mount the node's cgroup v2 subtree %s at %s: %w: %s", sub, AgentCgroupRoot, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// hostFreeWait bounds how long Start waits for another node's kube-proxy
// tables or host-routing agent to go away.
const hostFreeWait = 15 * time.Minute

// WaitHostFree waits (at most hostFreeWait) until no kube-proxy tables
// exist (if kubeProxy) and no cilium_host (if hostRouting: an agent with
// host routing), left by a node or test that does not hold
// harness.LockHostNetwork (a detached make up, an older branch's test).
// While a process that may own them runs in this network namespace
// (kube-proxy, cellium-agent, kubelet, devcluster: [hostNetworkOwners])
// they are never touched; once none has run for [orphanGrace], they are
// a killed run's and are removed (logged), so that one SIGKILLed run does
// not fail every run after it. Call it with the lock held, before making
// any of them.
//
// Errors: they are still there after hostFreeWait, or ctx ends.
func WaitHostFree(ctx context.Context, kubeProxy, hostRouting bool, log *slog.Logger) error {
	return waitHostFree(ctx, kubeProxy, hostRouting, orphanGrace, log)
}

// waitHostFree is [WaitHostFree] with the grace before orphans go.
func waitHostFree(ctx context.Context, kubeProxy, hostRouting bool, grace time.Duration, log *slog.Logger) error {
	ctx, cancel := context.WithTimeout(ctx, hostFreeWait)
	defer cancel()
	told := false
	var ownerless time.Time // since when no owner runs; zero while one does
	for {
		var busy, tables []string
		for _, tbl := range kubeProxyTables {
			if kubeProxy && nftTableExists(tbl) {
				busy = append(busy, "nftables table "+tbl)
				tables = append(tables, tbl)
			}
		}
		_, err := net.InterfaceByName(routes.HostDevice)
		agentLeft := hostRouting && err == nil
		if agentLeft {
			busy = append(busy, "link "+routes.HostDevice)
		}
		if len(busy) == 0 {
			return nil
		}
		if !told {
			told = true
			log.Info("waiting for another node on this machine to stop", "busy", strings.Join(busy, ", "))
		}
		switch {
		case len(hostNetworkOwners()) > 0:
			ownerless = time.Time{}
		case ownerless.IsZero():
			ownerless = time.Now()
		case time.Since(ownerless) >= grace:
			log.Warn("removing what a killed run left in this network namespace (no process that may own it has run for a while)",
				"left", strings.Join(busy, ", "), "ownerless", grace)
			if err := removeOrphans(ctx, tables, agentLeft); err != nil {
				return fmt.Errorf("remove a killed run's %s: %w", strings.Join(busy, ", "), err)
			}
			ownerless = time.Time{}
			continue
		}
		select {
		case <-ctx.Done():
			owners := hostNetworkOwners()
			if len(owners) == 0 {
				owners = []string{"none running: a killed run left them (make down, or delete them by hand)"}
			}
			return fmt.Errorf("another node's %s still there after %s (a make up running? make down stops it); processes in this network namespace that may own them: %s",
				strings.Join(busy, ", "), hostFreeWait, strings.Join(owners, "; "))
		case <-time.After(2 * time.Second):
		}
	}
}

// orphanGrace is how long [WaitHostFree] waits with no owner running
// before it removes what is left: longer than a Stop or a make down takes
// between its processes' exit and its cleanup.
const orphanGrace = time.Minute

// removeOrphans deletes kube-proxy's tables and, if agent, the host
// network state of an agent with host routing.
func removeOrphans(ctx context.Context, tables []string, agent bool) error {
	var errs []error
	for _, tbl := range tables {
		if _, err := NFT(ctx, append([]string{"delete", "table"}, strings.Fields(tbl)...)...); err != nil {
			errs = append(errs, err)
		}
	}
	if agent {
		errs = append(errs, devnode.RemoveAgentHostNetwork(ctx))
	}
	return errors.Join(errs...)
}

// kubeProxyTables are the nftables tables of kube-proxy's nftables mode.
var kubeProxyTables = []string{"ip kube-proxy", "ip6 kube-proxy"}

// portmapTables are the nftables tables of the portmap CNI plugin's
// nftables backend (containernetworking/plugins v1.10.0).
var portmapTables = []string{"ip cni_hostport", "ip6 cni_hostport"}

func (n *Node) startKubeProxy(ctx context.Context) error {
	bindIP := "127.0.0.1"
	if n.host.Namespaces != nil {
		// Its tables are the node's network namespace's, and go with it.
		bindIP = n.IP.String()
	} else {
		for _, tbl := range kubeProxyTables {
			if nftTableExists(tbl) {
				return fmt.Errorf("nftables table %s exists already (another kube-proxy on this machine?): delete it with nft delete table %s", tbl, tbl)
			}
		}
		// Recorded before kube-proxy makes them, for Stop and Recover.
		n.host.NFTables = append(n.host.NFTables, kubeProxyTables...)
		if err := n.writeState(); err != nil {
			return err
		}
	}
	kc, err := n.opts.Cluster.ClientCertKubeconfig("kube-proxy-"+n.Name, "system:kube-proxy")
	if err != nil {
		return err
	}
	ports, err := freePorts(2)
	if err != nil {
		return err
	}
	text, err := kubeProxyConfig{
		Kubeconfig:  kc,
		NodeName:    n.Name,
		ClusterCIDR: n.opts.ClusterCIDR,
		BindIP:      bindIP,
		HealthzPort: ports[0],
		MetricsPort: ports[1],
	}.render()
	if err != nil {
		return err
	}
	conf := filepath.Join(n.Dir, "kube-proxy.yaml")
	if err := os.WriteFile(conf, text, 0o644); err != nil {
		return err
	}
	p := n.nodeProcess(KubeProxy, n.opts.Binaries.KubeProxy, []string{"--config=" + conf, "--v=2"})
	_, err = n.start(ctx, p, func(ctx context.Context) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+net.JoinHostPort(bindIP, strconv.Itoa(ports[0]))+"/healthz", nil)
		if err != nil {
			return err
		}
		resp, err := (&http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}).Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("kube-proxy healthz: %s", resp.Status)
		}
		return nil
	})
	return err
}

// NFT runs nft with args and returns its standard output.
func NFT(ctx context.Context, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, "nft", args...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return out, fmt.Errorf("nft %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return out, nil
}

// nftTableExists reports whether the nftables table ("<family> <name>")
// exists.
func nftTableExists(table string) bool {
	_, err := NFT(context.Background(), append([]string{"list", "table"}, strings.Fields(table)...)...)
	return err == nil
}

// writeState records the node's hostState in its directory.
func (n *Node) writeState() error {
	state, err := json.Marshal(n.host)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(n.Dir, stateFile), state, 0o644); err != nil {
		return fmt.Errorf("record node state: %w", err)
	}
	return nil
}

func (n *Node) startAgent(ctx context.Context) error {
	p, err := n.agentCfg.Process()
	if err != nil {
		return err
	}
	r, err := p.Start()
	if err != nil {
		return err
	}
	n.procs = append(n.procs, r)
	ctx, cancel := context.WithTimeout(ctx, n.opts.StartTimeout)
	defer cancel()
	return devnode.WaitAgent(ctx, n.agentCfg, r)
}

// WaitReady waits (at most the start timeout) for the Node's Ready
// condition: the kubelet runs and containerd's CRI has found a CNI
// configuration.
func (n *Node) WaitReady(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, n.opts.StartTimeout)
	defer cancel()
	return devnode.WaitFor(ctx, n.kubeletProc(), func() error {
		node, err := n.opts.Cluster.Clientset().CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		for _, c := range node.Status.Conditions {
			if c.Type == corev1.NodeReady {
				if c.Status == corev1.ConditionTrue {
					return nil
				}
				return fmt.Errorf("node %s not ready: %s", n.Name, c.Message)
			}
		}
		return fmt.Errorf("node %s has no Ready condition yet", n.Name)
	})
}

func (n *Node) kubeletProc() *harness.Running {
	for _, r := range n.procs {
		if r.Name() == Kubelet {
			return r
		}
	}
	return nil
}

// Stop stops the node and removes what it left on the host: the pods bound
// to it are deleted and their sandboxes stopped by the kubelet (CNI DEL
// through the agent), then the processes stop in reverse order; tasks
// still left are killed through ctr, mounts under the node's directory
// unmounted, the cgroup root removed, the kubelet's sysctls restored, its
// links in /var/log/containers removed, the node link deleted, and the
// Node and CiliumNode objects deleted. The directory itself stays (its
// logs). Stop is for a node that Start returned, or that Start is cleaning
// up after.
func (n *Node) Stop(ctx context.Context) error {
	err := n.stop(ctx)
	n.releaseLock()
	return err
}

// stop is Stop without releasing the host network lock: a [Cluster]
// releases it once its blackhole routes are gone too, so that the next
// holder of the lock finds the machine's namespace free.
func (n *Node) stop(ctx context.Context) error {
	var errs []error
	cs := n.opts.Cluster.Clientset()
	switch {
	case n.host.AgentInPod && n.running(Kubelet) && exists(n.agentCfg.SocketPath()):
		errs = append(errs, DrainPodNetwork(ctx, cs, n.Name, n.agentCfg.SocketPath()))
	case n.kubeletProc() != nil && n.agentRunning():
		errs = append(errs, n.drain(ctx))
	}
	for i := len(n.procs) - 1; i >= 0; i-- {
		r := n.procs[i]
		if r.Name() == Containerd {
			errs = append(errs, n.killTasks(ctx))
		}
		errs = append(errs, r.Stop(stopTimeout))
	}
	n.procs = nil
	errs = append(errs, n.host.clean(n.Dir, n.log)...)
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := cs.CoreV1().Nodes().Delete(dctx, n.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		errs = append(errs, fmt.Errorf("delete Node %s: %w", n.Name, err))
	}
	err := cs.CoreV1().RESTClient().Delete().AbsPath("/apis/cilium.io/v2/ciliumnodes", n.Name).Do(dctx).Error()
	if err != nil && !apierrors.IsNotFound(err) {
		errs = append(errs, fmt.Errorf("delete CiliumNode %s: %w", n.Name, err))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("stop real node %s: %w", n.Name, err)
	}
	return nil
}

// releaseLock releases the host network lock if the node holds it.
func (n *Node) releaseLock() {
	if n.unlock != nil {
		n.unlock()
		n.unlock = nil
	}
}

// running reports whether the node started the process name and it has
// not exited.
func (n *Node) running(name string) bool {
	for _, r := range n.procs {
		if r.Name() == name {
			select {
			case <-r.Done():
				return false
			default:
				return true
			}
		}
	}
	return false
}

func (n *Node) agentRunning() bool { return n.running(devnode.Agent) }

// drain deletes the pods bound to the node at once and waits until
// containerd runs no task any more and the agent has no pod's endpoint left:
// the kubelet has stopped every sandbox, and containerd has released its
// network through CNI DEL (after the sandbox's task stopped, so no
// running task alone is not enough).
func (n *Node) drain(ctx context.Context) error {
	cs := n.opts.Cluster.Clientset()
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	pods, err := cs.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + n.Name})
	if err != nil {
		return fmt.Errorf("drain: %w", err)
	}
	zero := int64(0)
	for _, p := range pods.Items {
		err := cs.CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero})
		if err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("drain: %w", err)
		}
	}
	agent := client.New(n.agentCfg.SocketPath())
	defer agent.Close()
	return devnode.WaitFor(ctx, n.kubeletProc(), func() error {
		ids, err := n.tasks(ctx)
		if err != nil {
			return err
		}
		if len(ids) > 0 {
			return fmt.Errorf("drain: %d tasks still run", len(ids))
		}
		eps, err := agent.GetEndpoints(ctx)
		if err != nil {
			return fmt.Errorf("drain: %w", err)
		}
		// The agent's own health endpoint stays.
		for _, ep := range eps {
			if ep.Spec != nil && ep.Spec.K8sPodName != "" {
				return fmt.Errorf("drain: the agent still has the endpoint %d of pod %s/%s", ep.ID, ep.Spec.K8sNamespace, ep.Spec.K8sPodName)
			}
		}
		return nil
	})
}

// tasks lists the IDs of containerd's running tasks.
func (n *Node) tasks(ctx context.Context) ([]string, error) {
	out, err := n.Ctr(ctx, "tasks", "ls")
	if err != nil {
		return nil, err
	}
	var ids []string
	s := bufio.NewScanner(strings.NewReader(string(out)))
	for s.Scan() {
		f := strings.Fields(s.Text())
		if len(f) == 3 && f[0] != "TASK" && f[2] == "RUNNING" {
			ids = append(ids, f[0])
		}
	}
	return ids, nil
}

// killTasks kills and deletes whatever task containerd still has (the
// kubelet did not get to stop it).
func (n *Node) killTasks(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	ids, err := n.tasks(ctx)
	if err != nil {
		return nil // containerd is gone already: its shims died with it
	}
	failed := map[string]error{}
	for _, id := range ids {
		n.log.Info("killing a task the kubelet left", "id", id)
		var errs []error
		if _, err := n.Ctr(ctx, "tasks", "kill", "--signal", "SIGKILL", id); err != nil {
			errs = append(errs, err)
		}
		if _, err := n.Ctr(ctx, "tasks", "delete", "--force", id); err != nil {
			errs = append(errs, err)
		}
		if len(errs) > 0 {
			failed[id] = errors.Join(errs...)
		}
	}
	if len(failed) == 0 {
		return nil
	}
	// A pod's tasks share one shim, which exits with its sandbox's task:
	// deleting the pod's other task then fails ("ttrpc: closed") although
	// it is gone. Only a task still listed is an error.
	left, err := n.tasks(ctx)
	if err != nil {
		return nil // containerd is gone: its shims died with it
	}
	var errs []error
	for _, id := range left {
		errs = append(errs, failed[id])
	}
	return errors.Join(errs...)
}

// removeLogLinks removes the kubelet's links in /var/log/containers that
// point into the node's pod logs, and the directory if the node made it
// and it is empty.
func (h *hostState) removeLogLinks() error {
	links, err := h.logLinks()
	if err != nil {
		return err
	}
	var errs []error
	for _, l := range links {
		if err := os.Remove(l); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	errs = append(errs, removeEmptyTree(containerLogLinks, h.HadLogLinks))
	return errors.Join(errs...)
}

// logLinks lists the links in /var/log/containers into the node's pod
// logs.
func (h *hostState) logLinks() ([]string, error) {
	entries, err := os.ReadDir(containerLogLinks)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range entries {
		p := filepath.Join(containerLogLinks, e.Name())
		if t, err := os.Readlink(p); err == nil && strings.HasPrefix(t, h.PodLogsDir+"/") {
			out = append(out, p)
		}
	}
	return out, nil
}

// removeEmptyTree removes dir if keep is false and it holds nothing but
// empty directories.
func removeEmptyTree(dir string, keep bool) error {
	if keep || !exists(dir) {
		return nil
	}
	var dirs []string
	empty := true
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			dirs = append(dirs, p)
		} else {
			empty = false
		}
		return nil
	})
	if err != nil || !empty {
		return err // not ours alone: leave it
	}
	for i := len(dirs) - 1; i >= 0; i-- {
		if err := os.Remove(dirs[i]); err != nil {
			return err
		}
	}
	return nil
}

// mountsUnder lists the mount points under dir, deepest first.
func mountsUnder(dir string) ([]string, error) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	var out []string
	for line := range strings.Lines(string(b)) {
		f := strings.Fields(line)
		if len(f) < 5 {
			continue
		}
		mp := unescapeMount(f[4])
		if strings.HasPrefix(mp, dir+"/") {
			out = append(out, mp)
		}
	}
	slices.SortFunc(out, func(a, b string) int { return len(b) - len(a) })
	return slices.Compact(out), nil
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// unmountUnder unmounts everything under dir (network namespaces of pods
// the kubelet did not stop, container root filesystems).
func unmountUnder(dir string) error {
	mps, err := mountsUnder(dir)
	if err != nil {
		return err
	}
	var errs []error
	for _, mp := range mps {
		if err := unix.Unmount(mp, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("unmount %s: %w", mp, err))
		}
	}
	return errors.Join(errs...)
}

// clean undoes on the host what the node in dir did, once its processes
// are gone: the processes still in its cgroups (containers) and the shims
// of its containerd are killed, mounts under dir unmounted, the cgroup root
// removed, the sysctls restored, the log links, CNI results, the
// device-plugin socket and the host directories the node made removed,
// and its link deleted.
func (h *hostState) clean(dir string, log *slog.Logger) []error {
	var errs []error
	errs = append(errs, killNodeProcesses(h.CgroupRoot, h.Socket, log))
	errs = append(errs, unmountUnder(dir))
	switch {
	case h.Namespaces != nil:
		// Everything the agent, kube-proxy and portmap made is in the
		// node's namespaces, and goes with them.
		errs = append(errs, h.Namespaces.Remove(h.NSMadeDirs))
	case h.AgentInPod:
		errs = append(errs, unmountDir(dir), devnode.RemoveAgentHostNetwork(context.Background()))
	}
	errs = append(errs, removeCgroupRoot(h.CgroupRoot))
	if h.Sysctls != nil {
		errs = append(errs, machineKubeletSysctls().release(h.CgroupRoot, h.Sysctls))
	}
	errs = append(errs, h.removeLogLinks())
	for name := range cniResults() {
		if !h.HadResults[name] && isNodeResult(name) {
			log.Info("removing a CNI result no CNI DEL released", "file", name)
			if err := os.Remove(filepath.Join(varLibCNI, "results", name)); err != nil && !errors.Is(err, os.ErrNotExist) {
				errs = append(errs, err)
			}
		}
	}
	if h.ShimSocketDir != "" {
		if err := os.RemoveAll(h.ShimSocketDir); err != nil {
			errs = append(errs, err)
		}
	}
	errs = append(errs, removeEmptyTree(runContainerd, h.HadRunCtrd))
	errs = append(errs, removeEmptyTree(varLibCNI, h.HadVarCNI))
	if !h.HadDPSocket {
		if err := os.Remove(devicePluginSocket); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	for _, d := range kubeletDefaultDirs {
		errs = append(errs, removeEmptyTree(d, h.HadKubelet[d]))
	}
	for _, tbl := range h.NFTables {
		if nftTableExists(tbl) {
			if _, err := NFT(context.Background(), append([]string{"delete", "table"}, strings.Fields(tbl)...)...); err != nil {
				errs = append(errs, err)
			}
		}
	}
	errs = append(errs, deleteLink(h.LinkName))
	return errs
}

// Recover cleans up after a node in dir whose test or command died
// without stopping it: the processes recorded by pid files in dir
// (containerd, kubelet, scheduler, agent) are killed if they still run,
// then the host is cleaned as [Node.Stop] does, from the state Start
// recorded in dir. Pods' network is not released through CNI (the agent
// may be gone): their namespaces and veths go with their processes. The
// Node and CiliumNode objects stay. A dir without a node state is no
// error: nothing was changed yet.
//
// Errors: the state file cannot be read; something cannot be removed.
func Recover(dir string, log *slog.Logger) error {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	h, err := readHostState(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("recover real node in %s: %w", dir, err)
	}
	var errs []error
	for _, name := range []string{devnode.Agent, KubeProxy, Kubelet, KubeScheduler, Containerd} {
		pidFile := filepath.Join(dir, name+".pid")
		if name == devnode.Agent {
			pidFile = filepath.Join(dir, "agent", name+".pid")
		}
		pid, running, err := harness.ReadPidFile(pidFile)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if running {
			log.Info("killing a process of the dead node", "name", name, "pid", pid)
			errs = append(errs, killAndWait(pid))
		}
		_ = os.Remove(pidFile)
	}
	errs = append(errs, h.clean(dir, log)...)
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("recover real node %s: %w", h.Name, err)
	}
	return nil
}

// readHostState reads the state Start recorded in dir.
func readHostState(dir string) (hostState, error) {
	var h hostState
	b, err := os.ReadFile(filepath.Join(dir, stateFile))
	if err != nil {
		return h, err
	}
	if err := json.Unmarshal(b, &h); err != nil {
		return h, fmt.Errorf("%s: %w", filepath.Join(dir, stateFile), err)
	}
	return h, nil
}

// killNodeProcesses kills what still runs of a node whose containerd and
// kubelet are gone: the shims that serve its containerd's socket, and every
// process in its cgroup tree (the containers).
func killNodeProcesses(cgroupRoot, socket string, log *slog.Logger) error {
	var pids []int
	procs, err := os.ReadDir("/proc")
	if err != nil {
		return err
	}
	for _, p := range procs {
		pid, err := strconv.Atoi(p.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		cmdline, _ := os.ReadFile(filepath.Join("/proc", p.Name(), "cmdline"))
		args := strings.Split(string(cmdline), "\x00")
		if len(args) > 0 && filepath.Base(args[0]) == "containerd-shim-runc-v2" && slices.Contains(args, socket) {
			pids = append(pids, pid)
			continue
		}
		cg, _ := os.ReadFile(filepath.Join("/proc", p.Name(), "cgroup"))
		for line := range strings.Lines(string(cg)) {
			// hierarchy-id:controllers:path
			if f := strings.SplitN(strings.TrimSpace(line), ":", 3); len(f) == 3 &&
				(f[2] == cgroupRoot || strings.HasPrefix(f[2], cgroupRoot+"/")) {
				pids = append(pids, pid)
				break
			}
		}
	}
	var errs []error
	for _, pid := range pids {
		log.Info("killing a process the node left", "pid", pid)
		errs = append(errs, killAndWait(pid))
	}
	return errors.Join(errs...)
}

// killAndWait sends SIGKILL to pid and waits (up to 10s) until it is gone
// or a zombie.
func killAndWait(pid int) error {
	if err := unix.Kill(pid, unix.SIGKILL); err != nil {
		if errors.Is(err, unix.ESRCH) {
			return nil
		}
		return fmt.Errorf("kill %d: %w", pid, err)
	}
	for range 100 {
		stat, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
		if err != nil {
			return nil
		}
		if i := strings.LastIndexByte(string(stat), ')'); i > 0 && len(stat) > i+2 && stat[i+2] == 'Z' {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("process %d survived SIGKILL for 10s", pid)
}

// Leftovers lists what the node left on the host after Stop: its link,
// cgroups, mounts under its directory, links in /var/log/containers,
// sysctls that differ from before, and /run/containerd or /var/lib/cni if
// they were not there before. Empty means clean.
func (n *Node) Leftovers() []string {
	if n.unlock == nil {
		defer lockHostNetworkForCheck()() // as Cluster.Leftovers
	}
	return n.host.leftovers(n.Dir)
}

func (h *hostState) leftovers(dir string) []string {
	var out []string
	if _, err := net.InterfaceByName(h.LinkName); err == nil {
		out = append(out, "link "+h.LinkName)
	}
	for _, c := range cgroupRootExists(h.CgroupRoot) {
		out = append(out, "cgroup "+c)
	}
	if mps, err := mountsUnder(dir); err == nil {
		for _, mp := range mps {
			out = append(out, "mount "+mp)
		}
	}
	switch {
	case h.Namespaces != nil:
		out = append(out, h.Namespaces.Leftovers(h.NSMadeDirs)...)
	case h.AgentInPod:
		out = append(out, agentHostNetworkLeftovers()...)
		if isMountPoint(dir) {
			out = append(out, "mount "+dir)
		}
	}
	if links, err := h.logLinks(); err == nil {
		for _, l := range links {
			out = append(out, "log link "+l)
		}
	}
	// While another node runs (another test package, a `make up`), the
	// sysctls are its kubelet's to set.
	if others, err := machineKubeletSysctls().others(h.CgroupRoot); err != nil {
		out = append(out, "kubelet sysctls: "+err.Error())
	} else if now, err := readSysctls(KubeletSysctls); err == nil && len(others) == 0 {
		for k, v := range h.Sysctls {
			if now[k] != v {
				out = append(out, fmt.Sprintf("sysctl %s=%s (was %s)", k, now[k], v))
			}
		}
	}
	for _, d := range kubeletDefaultDirs {
		if !h.HadKubelet[d] && exists(d) {
			out = append(out, "directory "+d)
		}
	}
	for _, tbl := range h.NFTables {
		if nftTableExists(tbl) {
			out = append(out, "nftables table "+tbl)
		}
	}
	if h.ShimSocketDir != "" && exists(h.ShimSocketDir) {
		out = append(out, "directory "+h.ShimSocketDir)
	}
	if !h.HadDPSocket && exists(devicePluginSocket) {
		out = append(out, "socket "+devicePluginSocket)
	}
	for name := range cniResults() {
		if !h.HadResults[name] && isNodeResult(name) {
			out = append(out, "CNI result "+filepath.Join(varLibCNI, "results", name))
		}
	}
	for p, had := range map[string]bool{runContainerd: h.HadRunCtrd, varLibCNI: h.HadVarCNI, containerLogLinks: h.HadLogLinks} {
		if !had && exists(p) {
			out = append(out, "directory "+p)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// nodeNetworks are the names of the networks a node's containerd sets
// up, as they prefix libcni's cached results (<network>-<container
// ID>-<interface>): cellium's conflist ("cellium", or "portmap" when
// cni.chainingMode=portmap names the chained list, as Cilium does) and the
// loopback plugin's ("cni-loopback"), which containerd's CRI runs itself.
var nodeNetworks = []string{"cellium", "portmap", "cni-loopback"}

// isNodeResult reports whether a file of libcni's result cache is of a
// network a node's containerd sets up (nodeNetworks) for a container:
// <network>-<64 hex digits>-<interface>.
func isNodeResult(name string) bool {
	for _, network := range nodeNetworks {
		rest, ok := strings.CutPrefix(name, network+"-")
		if !ok {
			continue
		}
		id, ifname, ok := strings.Cut(rest, "-")
		if ok && ifname != "" && len(id) == 64 && strings.Trim(id, "0123456789abcdef") == "" {
			return true
		}
	}
	return false
}

// cniResults lists the files of libcni's result cache.
func cniResults() map[string]bool {
	out := map[string]bool{}
	entries, _ := os.ReadDir(filepath.Join(varLibCNI, "results"))
	for _, e := range entries {
		out[e.Name()] = true
	}
	return out
}

// httpsOK asks url over TLS without verifying the server (a component's
// self-signed health endpoint) and returns nil on 200.
func httpsOK(ctx context.Context, url string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	hc := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{
		TLSClientConfig:   &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // loopback health check of a self-signed server
		DisableKeepAlives: true,
	}}
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", url, resp.Status)
	}
	return nil
}

// freePorts returns n distinct TCP ports that were free a moment ago.
func freePorts(count int) ([]int, error) {
	var ports []int
	for range count {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("find a free port: %w", err)
		}
		defer l.Close()
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}
