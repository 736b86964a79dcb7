// Package devnode runs cellium on this machine as one Kubernetes node of a
// harness cluster (test/harness): cellium-operator and cellium-agent as
// processes, and the devkubelet in-process or as a process, each with its
// state in one directory. The devcluster command (make up), the e2e tests
// and the endpoint benchmark all start their nodes through it, so they
// run the binaries with the same flags.
package devnode

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/cellium/cellium/api/v1/client"
	"github.com/cellium/cellium/test/harness"
)

// Names of the programs, as binaries and as harness process names.
const (
	Agent     = "cellium-agent"
	Operator  = "cellium-operator"
	CNIPlugin = "cellium-cni"
	CLI       = "cellium"
	Kubelet   = "devkubelet"
)

// packages maps each program to its Go package in the repository.
var packages = map[string]string{
	Agent:     "./daemon/cellium-agent",
	Operator:  "./operator/cellium-operator",
	CNIPlugin: "./cni/cellium-cni",
	CLI:       "./cli/cellium",
	Kubelet:   "./test/cmd/devkubelet",
}

// Binaries are the paths of the cellium programs.
type Binaries struct {
	Agent, Operator, CNIPlugin, CLI, Kubelet string
}

func (b Binaries) paths() map[string]*string {
	return map[string]*string{Agent: &b.Agent, Operator: &b.Operator, CNIPlugin: &b.CNIPlugin, CLI: &b.CLI, Kubelet: &b.Kubelet}
}

func binariesIn(dir string) Binaries {
	return Binaries{
		Agent:     filepath.Join(dir, Agent),
		Operator:  filepath.Join(dir, Operator),
		CNIPlugin: filepath.Join(dir, CNIPlugin),
		CLI:       filepath.Join(dir, CLI),
		Kubelet:   filepath.Join(dir, Kubelet),
	}
}

// FindBinaries returns the programs in dir (make build's bin/).
//
// Errors: a program named in need is missing; the error says to run
// make build.
func FindBinaries(dir string, need ...string) (Binaries, error) {
	b := binariesIn(dir)
	paths := b.paths()
	var missing []string
	for _, name := range need {
		p, ok := paths[name]
		if !ok {
			return b, fmt.Errorf("unknown program %q", name)
		}
		if fi, err := os.Stat(*p); err != nil || fi.IsDir() || fi.Mode()&0o111 == 0 {
			missing = append(missing, name)
		}
	}
	if len(missing) > 0 {
		return b, fmt.Errorf("%s missing in %s: run `make build` first", strings.Join(missing, ", "), dir)
	}
	return b, nil
}

// BuildBinaries builds the named programs (all when none are named) into
// outDir with `go build`, from the repository that contains the working
// directory. Go's build cache makes a rebuild of unchanged code quick.
//
// Errors: not inside the cellium checkout; the build failed (with the
// compiler's output).
func BuildBinaries(ctx context.Context, outDir string, names ...string) (Binaries, error) {
	wd, err := os.Getwd()
	if err != nil {
		return Binaries{}, err
	}
	root, err := harness.RepoRoot(wd)
	if err != nil {
		return Binaries{}, err
	}
	if len(names) == 0 {
		names = []string{Agent, Operator, CNIPlugin, CLI, Kubelet}
	}
	if outDir, err = filepath.Abs(outDir); err != nil {
		return Binaries{}, err
	}
	if err := os.MkdirAll(outDir, 0o755); err != nil {
		return Binaries{}, fmt.Errorf("build cellium binaries: %w", err)
	}
	args := []string{"build", "-o", outDir + "/"}
	for _, n := range names {
		pkg, ok := packages[n]
		if !ok {
			return Binaries{}, fmt.Errorf("unknown program %q", n)
		}
		args = append(args, pkg)
	}
	gobin := "go"
	if goroot := os.Getenv("GOROOT"); goroot != "" {
		if p := filepath.Join(goroot, "bin", "go"); fileExists(p) {
			gobin = p
		}
	}
	cmd := exec.CommandContext(ctx, gobin, args...)
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return Binaries{}, fmt.Errorf("go %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	return binariesIn(outDir), nil
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// OperatorConfig configures cellium-operator.
type OperatorConfig struct {
	// Binary is the cellium-operator executable.
	Binary string
	// Kubeconfig is the operator's kubeconfig: the harness's
	// Cluster.OperatorKubeconfig (its ServiceAccount's token), so that it
	// runs with the chart's permissions. WaitOperator uses it too.
	Kubeconfig string
	// Dir receives cellium-operator.log and .pid.
	Dir string
	// ClusterPoolIPv4CIDR and ClusterPoolIPv4MaskSize are the pod address
	// space and the size of each node's share.
	ClusterPoolIPv4CIDR     string
	ClusterPoolIPv4MaskSize int
	// APIAddr is the operator's health API (host:port); empty picks a
	// free port on 127.0.0.1 (Process fills it in).
	APIAddr string
	// Args are more flags (e.g. --cilium-endpoint-gc-interval=2s).
	Args []string
	// Detach lets the process outlive the caller (devcluster up).
	Detach bool
}

// Process describes the operator's process; it fills in APIAddr when
// empty.
func (c *OperatorConfig) Process() (harness.Process, error) {
	if c.APIAddr == "" {
		port, err := FreePort()
		if err != nil {
			return harness.Process{}, err
		}
		c.APIAddr = "127.0.0.1:" + strconv.Itoa(port)
	}
	args := []string{
		"--k8s-kubeconfig-path=" + c.Kubeconfig,
		"--cluster-pool-ipv4-cidr=" + c.ClusterPoolIPv4CIDR,
		"--cluster-pool-ipv4-mask-size=" + strconv.Itoa(c.ClusterPoolIPv4MaskSize),
		"--leader-election-namespace=kube-system",
		"--operator-api-serve-addr=" + c.APIAddr,
	}
	return harness.Process{
		Name:    Operator,
		Path:    c.Binary,
		Args:    append(args, c.Args...),
		LogFile: filepath.Join(c.Dir, Operator+".log"),
		PidFile: filepath.Join(c.Dir, Operator+".pid"),
		Detach:  c.Detach,
	}, nil
}

// WaitOperator waits until the operator's health API answers ok and the
// API server serves the cilium.io resources the operator registers (an
// agent started earlier would back off listing them), or the process
// exits.
func WaitOperator(ctx context.Context, cfg OperatorConfig, proc *harness.Running) error {
	if err := waitOperatorHealth(ctx, cfg.APIAddr, proc); err != nil {
		return err
	}
	rc, err := clientcmd.BuildConfigFromFlags("", cfg.Kubeconfig)
	if err != nil {
		return err
	}
	disc, err := discovery.NewDiscoveryClientForConfig(rc)
	if err != nil {
		return err
	}
	return WaitFor(ctx, proc, func() error {
		list, err := disc.ServerResourcesForGroupVersion("cilium.io/v2")
		if err != nil {
			return err
		}
		served := map[string]bool{}
		for _, r := range list.APIResources {
			served[r.Name] = true
		}
		for _, r := range []string{"ciliumendpoints", "ciliumidentities", "ciliumnodes"} {
			if !served[r] {
				return fmt.Errorf("cilium.io/v2 %s not served yet", r)
			}
		}
		return nil
	})
}

func waitOperatorHealth(ctx context.Context, addr string, proc *harness.Running) error {
	hc := &http.Client{Timeout: 2 * time.Second}
	var last error
	return WaitFor(ctx, proc, func() error {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/healthz", nil)
		resp, err := hc.Do(req)
		if err != nil {
			last = err
			return last
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			last = fmt.Errorf("health %s", resp.Status)
			return last
		}
		return nil
	})
}

// AgentConfig configures cellium-agent for one node.
type AgentConfig struct {
	// Binary is the cellium-agent executable.
	Binary string
	// Kubeconfig is the agent's kubeconfig: the harness's
	// Cluster.AgentKubeconfig (its ServiceAccount's token), so that it runs
	// with the chart's permissions.
	Kubeconfig string
	// NodeName is the agent's node (K8S_NODE_NAME).
	NodeName string
	// Dir holds the agent's socket, state, CNI configuration directory,
	// log and pid file. Keep it short: the socket path must fit in 107
	// bytes.
	Dir string
	// Args are more flags.
	Args []string
	// HostRouting lets the agent program the host's network namespace
	// (cilium_host, routes to pods, ip_forward: --enable-endpoint-routes)
	// and give the health endpoint its namespace, veth and responder
	// (--enable-endpoint-health-checking, --enable-health-checking).
	// Off by default: the agent runs in this machine's own namespace, where
	// agents of harness clusters running side by side would each claim
	// cilium_host and prune each other's routes. devcluster up turns it on.
	HostRouting bool
	// BPF lets the agent load and attach its eBPF programs to the pods'
	// veths (--enable-bpf-datapath), with its pins in a bpffs of its own,
	// BPFRoot (mounted by the agent; unmount it with UnmountBPF when the
	// agent is gone). Off by default, like HostRouting.
	BPF bool
	// SocketLB turns on the socket load balancer when BPF is on
	// (--bpf-lb-sock), attached to the machine's cgroup2 mount
	// (--cgroup-root=Cgroup2Mount(), nothing mounted). Off by default:
	// its programs act on every socket of the machine, so the Services of
	// the agent's cluster must use a Service range nobody else on the
	// machine uses.
	SocketLB bool
	// Netns, if set, is the network namespace (a path such as
	// /proc/<pid>/ns/net or a pinned file) the agent runs in (nsenter
	// --net): its host routing, devices and programs are then that
	// namespace's, not the machine's. The mount namespace stays the
	// machine's (socket, state and bpffs under Dir).
	Netns string
	// Detach lets the process outlive the caller (devcluster up).
	Detach bool
}

// SocketPath is the agent's API socket: Dir/cellium.sock.
func (c AgentConfig) SocketPath() string { return filepath.Join(c.Dir, "cellium.sock") }

// BPFRoot is the agent's --bpf-root when BPF is on: Dir/bpffs.
func (c AgentConfig) BPFRoot() string { return filepath.Join(c.Dir, "bpffs") }

// UnmountBPF unmounts the agent's bpffs (BPFRoot), which drops the
// programs it attached; nothing mounted there is not an error.
func (c AgentConfig) UnmountBPF() error {
	if err := unix.Unmount(c.BPFRoot(), 0); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("unmount the agent's bpffs %s: %w", c.BPFRoot(), err)
	}
	return nil
}

// Cgroup2Mount returns where this machine has the cgroup v2 hierarchy
// mounted (/sys/fs/cgroup on a unified host, /sys/fs/cgroup/unified on a
// hybrid one), from /proc/self/mounts.
func Cgroup2Mount() (string, error) {
	b, err := os.ReadFile("/proc/self/mounts")
	if err != nil {
		return "", fmt.Errorf("find the cgroup2 mount: %w", err)
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 3 && f[2] == "cgroup2" {
			return f[1], nil
		}
	}
	return "", fmt.Errorf("no cgroup2 mount in /proc/self/mounts: mount one for the socket load balancer")
}

// StateDir is the agent's --state-dir: Dir/state.
func (c AgentConfig) StateDir() string { return filepath.Join(c.Dir, "state") }

// CNIConfDir is where the agent writes its conflist: Dir/net.d.
func (c AgentConfig) CNIConfDir() string { return filepath.Join(c.Dir, "net.d") }

// ConfListPath is the conflist the agent writes when ready.
func (c AgentConfig) ConfListPath() string {
	return filepath.Join(c.CNIConfDir(), "05-cellium.conflist")
}

// maxSocketPath is the longest path of a unix socket (sun_path less the
// terminating NUL).
const maxSocketPath = 107

// Process describes the agent's process.
//
// Errors: the socket path would be too long for a unix socket.
func (c AgentConfig) Process() (harness.Process, error) {
	if len(c.SocketPath()) > maxSocketPath {
		return harness.Process{}, fmt.Errorf("agent socket path %s is longer than %d bytes: use a shorter directory", c.SocketPath(), maxSocketPath)
	}
	args := []string{
		"--k8s-kubeconfig-path=" + c.Kubeconfig,
		"--socket-path=" + c.SocketPath(),
		"--state-dir=" + c.StateDir(),
		"--write-cni-conf-when-ready=" + c.ConfListPath(),
		"--prometheus-serve-addr=",
		"--enable-endpoint-routes=" + strconv.FormatBool(c.HostRouting),
		// The health endpoint's namespace and veth have fixed names in the
		// machine's namespace (cilium-health, lxc_health), and without
		// host routes its IP is unreachable: both follow HostRouting.
		"--enable-endpoint-health-checking=" + strconv.FormatBool(c.HostRouting),
		"--enable-health-checking=" + strconv.FormatBool(c.HostRouting),
		"--enable-bpf-datapath=" + strconv.FormatBool(c.BPF),
	}
	if c.BPF {
		args = append(args, "--bpf-root="+c.BPFRoot(), "--bpf-lb-sock="+strconv.FormatBool(c.SocketLB))
		if c.SocketLB {
			cg, err := Cgroup2Mount()
			if err != nil {
				return harness.Process{}, err
			}
			args = append(args, "--cgroup-root="+cg)
		}
	}
	path, args := c.Binary, append(args, c.Args...)
	if c.Netns != "" {
		path, args = "nsenter", append([]string{"--net=" + c.Netns, "--", c.Binary}, args...)
	}
	return harness.Process{
		Name:    Agent,
		Path:    path,
		Args:    args,
		Env:     []string{"K8S_NODE_NAME=" + c.NodeName},
		LogFile: filepath.Join(c.Dir, Agent+".log"),
		PidFile: filepath.Join(c.Dir, Agent+".pid"),
		Detach:  c.Detach,
	}, nil
}

// WaitAgent waits until the agent answers on its socket and has written
// its conflist (it can serve pods), or its process exits.
func WaitAgent(ctx context.Context, c AgentConfig, proc *harness.Running) error {
	cl := client.New(c.SocketPath())
	defer cl.Close()
	return WaitFor(ctx, proc, func() error {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		if _, err := cl.GetHealthz(cctx); err != nil {
			return err
		}
		if _, err := os.Stat(c.ConfListPath()); err != nil {
			return fmt.Errorf("no conflist yet: %w", err)
		}
		return nil
	})
}

// WaitFor calls check every 100ms until it succeeds, ctx ends or proc
// (if not nil) exits; the error carries check's last error and the tail
// of the process's log.
func WaitFor(ctx context.Context, proc *harness.Running, check func() error) error {
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	var done <-chan struct{}
	if proc != nil {
		done = proc.Done()
	}
	for {
		err := check()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return withLog(fmt.Errorf("not ready: %w (last: %v)", ctx.Err(), err), proc)
		case <-done:
			return withLog(fmt.Errorf("exited: %v", proc.Err()), proc)
		case <-t.C:
		}
	}
}

func withLog(err error, proc *harness.Running) error {
	if proc == nil {
		return err
	}
	return fmt.Errorf("%s %w; last lines of %s:\n%s", proc.Name(), err, proc.LogFile(), proc.LogTail(30))
}

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func FreePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free port: %w", err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// LinkCNIPlugin puts the plugin into binDir under its type name, as a
// symbolic link (replacing an older one).
func LinkCNIPlugin(plugin, binDir string) error {
	if err := os.MkdirAll(binDir, 0o755); err != nil {
		return fmt.Errorf("CNI binary directory: %w", err)
	}
	abs, err := filepath.Abs(plugin)
	if err != nil {
		return err
	}
	dst := filepath.Join(binDir, CNIPlugin)
	if err := os.Remove(dst); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return os.Symlink(abs, dst)
}

// NodeIP returns a loopback-range address (127.0.0.0/8, not 127.0.0.1)
// derived from name, to report as a node's InternalIP: every address of
// that range is local to this machine, and nothing is ever routed to it.
// Different names usually get different addresses, so the nodes of
// several clusters on one machine do not share an IP.
func NodeIP(name string) netip.Addr {
	var h uint32 = 2166136261
	for i := 0; i < len(name); i++ {
		h = (h ^ uint32(name[i])) * 16777619
	}
	b := [4]byte{127, byte(h >> 16), byte(h >> 8), byte(h)}
	if b[1] == 0 && b[2] == 0 && b[3] <= 1 {
		b[3] = 2
	}
	if b[3] == 0 || b[3] == 255 {
		b[3] = 2
	}
	return netip.AddrFrom4(b)
}
