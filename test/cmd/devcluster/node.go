package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	"github.com/cellium/cellium/api/client/clientset/versioned"
	"github.com/cellium/cellium/api/v1/client"
	"github.com/cellium/cellium/api/v1/models"
	"github.com/cellium/cellium/statedb/health"
	"github.com/cellium/cellium/test/devkubelet"
	"github.com/cellium/cellium/test/devkubelet/devnode"
	"github.com/cellium/cellium/test/harness"
)

// errNotRoot is up's answer to a user who is not root.
var errNotRoot = errors.New("make up (devcluster up) needs root: it creates network namespaces and veths; " +
	"run it as root (sudo make up), or pass --control-plane-only to run etcd and kube-apiserver alone")

// checkRoot refuses to run the node (network namespaces, veths) unless
// euid is root.
func checkRoot(euid int, controlPlaneOnly bool) error {
	if euid != 0 && !controlPlaneOnly {
		return errNotRoot
	}
	return nil
}

// kubeletStateDir is the devkubelet's state directory inside DIR.
const kubeletStateDir = "devkubelet"

// demoNamespace holds the demo pods.
const demoNamespace = "demo"

// nodeOptions configure the node up runs on top of the control plane.
type nodeOptions struct {
	kind             string   // nodeReal or nodeDev
	values           []string // --set: chart values of the real node's install
	controlPlaneOnly bool
	binDir           string
	nodes            int
	nodeName         string
	nodeIP           string
	podCIDR          string
	podMaskSize      int
	demoPods         bool
	hostRouting      bool
	masquerade       bool
	bpf              bool
	socketLB         bool
	// kubeProxyReplacement: with --node real, no kube-proxy; cellium
	// serves every Service type (the chart's kubeProxyReplacement=true).
	kubeProxyReplacement bool
	agentArgs            []string
	operatorArgs         []string

	timeout time.Duration
	bins    devnode.Binaries
	// agentKubeconfig and operatorKubeconfig hold tokens of the
	// ServiceAccounts of install/kubernetes/cellium.yaml: the daemons run
	// with the chart's permissions, not as cluster-admin.
	agentKubeconfig, operatorKubeconfig string
}

func (o *nodeOptions) register(cmd *cobra.Command) {
	fs := cmd.Flags()
	fs.StringVar(&o.kind, "node", nodeDev, "the node: "+nodeReal+" (containerd, kubelet, kube-scheduler, kube-proxy; cellium installed from its chart as a DaemonSet and a Deployment: make up) "+
		"or "+nodeDev+" (the devkubelet and cellium-agent as a process: fast, no container runtime); --node-name, --node-ip, --cluster-pool-*, --host-routing, --masquerade, --bpf, --agent-arg and --operator-arg are for "+nodeDev)
	fs.StringArrayVar(&o.values, "set", nil, "with --node "+nodeReal+": a chart value for cellium's install, helm's --set syntax, after make up's own (repeatable), e.g. --set 'agent.extraArgs={--enable-policy=always}'")
	fs.BoolVar(&o.controlPlaneOnly, "control-plane-only", false, "run etcd and kube-apiserver (and the controller-manager) only: no cellium, no root needed")
	fs.StringVar(&o.binDir, "bin-dir", "", "directory with cellium-agent, cellium-operator, cellium-cni, devkubelet (and cellium) from `make build`; empty: the directory of this program if it has them, else build them with `go build`")
	fs.BoolVar(&o.kubeProxyReplacement, "kube-proxy-replacement", false, "with --node "+nodeReal+": run no kube-proxy and install cellium with kubeProxyReplacement=true, so that its datapath serves ClusterIP, NodePort, LoadBalancer and externalIPs (make up KPR=true)")
	fs.IntVar(&o.nodes, "nodes", 1, "with --node "+nodeReal+": how many real nodes (1 to 4; several run each in network and mount namespaces of its own on a bridge, 10.250.0.<i>)")
	fs.StringVar(&o.nodeName, "node-name", "cellium-node", "name of the node the agent and the devkubelet run")
	fs.StringVar(&o.nodeIP, "node-ip", "127.0.0.2", "the node's InternalIP (reported only, never routed to: a 127.0.0.0/8 address)")
	fs.StringVar(&o.podCIDR, "cluster-pool-ipv4-cidr", "10.244.0.0/16", "the pod address space the operator carves node CIDRs out of")
	fs.IntVar(&o.podMaskSize, "cluster-pool-ipv4-mask-size", 24, "prefix length of each node's pod CIDR")
	fs.BoolVar(&o.demoPods, "demo-pods", true, "create three demo pods in namespace "+demoNamespace)
	fs.BoolVar(&o.hostRouting, "host-routing", true, "let the agent program this machine's network namespace (cilium_host, a route per pod, ip_forward) so that pods reach each other and the node; down removes them and restores the sysctls")
	fs.BoolVar(&o.masquerade, "masquerade", false, "with --host-routing, let the agent masquerade pod traffic leaving the machine (pods then reach whatever this machine reaches)")
	fs.BoolVar(&o.bpf, "bpf", false, "let the agent attach its eBPF programs to the pods' veths (--enable-bpf-datapath), pinned in a bpffs of its own in the cluster directory; down unmounts it")
	fs.BoolVar(&o.socketLB, "socket-lb", false, "with --bpf, let the agent translate Service ClusterIPs at the socket (--bpf-lb-sock): its cgroup programs act on every socket of this machine, for the cluster's Service range (--service-cluster-ip-range of the API server)")
	fs.StringSliceVar(&o.agentArgs, "agent-arg", nil, "extra cellium-agent flag (repeatable)")
	fs.StringSliceVar(&o.operatorArgs, "operator-arg", nil, "extra cellium-operator flag (repeatable)")
}

// celliumBinaries finds or builds the cellium programs.
func celliumBinaries(ctx context.Context, binDir string, log *slog.Logger) (devnode.Binaries, error) {
	need := []string{devnode.Agent, devnode.Operator, devnode.CNIPlugin, devnode.Kubelet}
	if binDir != "" {
		return devnode.FindBinaries(binDir, need...)
	}
	if exe, err := os.Executable(); err == nil {
		if b, err := devnode.FindBinaries(filepath.Dir(exe), need...); err == nil {
			return b, nil
		}
	}
	cache, err := harness.CacheDir()
	if err != nil {
		return devnode.Binaries{}, err
	}
	out := filepath.Join(cache, "devcluster-bin")
	log.Info("building the cellium binaries", "dir", out)
	b, err := devnode.BuildBinaries(ctx, out, need...)
	if err != nil {
		return b, err
	}
	// The CLI is only for the user; a CLI that does not build yet does not
	// stop the cluster.
	if _, err := devnode.BuildBinaries(ctx, out, devnode.CLI); err != nil {
		log.Warn("cannot build the cellium CLI", "error", err)
	}
	return b, nil
}

// addon is a program up starts on top of the control plane.
type addon struct {
	process func() (harness.Process, error)
	wait    func(context.Context, *harness.Running) error
}

// agentConfig is the agent's configuration in dir: its socket is
// DIR/cellium.sock, its state DIR/state, its conflist DIR/net.d.
func agentConfig(dir string, c *harness.Cluster, o nodeOptions) devnode.AgentConfig {
	return devnode.AgentConfig{
		Binary:     o.bins.Agent,
		Kubeconfig: o.agentKubeconfig,
		NodeName:   o.nodeName,
		Dir:        dir,
		Args:       append([]string{"--enable-ipv4-masquerade=" + strconv.FormatBool(o.masquerade)}, o.agentArgs...),
		// Pods of `make up` reach each other and the node.
		HostRouting: o.hostRouting,
		BPF:         o.bpf,
		SocketLB:    o.socketLB,
		Detach:      true,
	}
}

// addons returns the programs up starts after the control plane is
// ready, in order: cellium-operator; the devkubelet, which registers the
// Node the agent needs (it stays NotReady until the agent has written its
// CNI configuration); cellium-agent. Each has a log file and a pid file
// in dir and is detached.
func addons(dir string, c *harness.Cluster, o nodeOptions) []addon {
	op := devnode.OperatorConfig{
		Binary:                  o.bins.Operator,
		Kubeconfig:              o.operatorKubeconfig,
		Dir:                     dir,
		ClusterPoolIPv4CIDR:     o.podCIDR,
		ClusterPoolIPv4MaskSize: o.podMaskSize,
		Args:                    o.operatorArgs,
		Detach:                  true,
	}
	agent := agentConfig(dir, c, o)
	cniBin := filepath.Join(dir, "cni-bin")
	return []addon{
		{
			process: op.Process,
			wait: func(ctx context.Context, r *harness.Running) error {
				return devnode.WaitOperator(ctx, op, r)
			},
		},
		{
			process: func() (harness.Process, error) {
				if err := devnode.LinkCNIPlugin(o.bins.CNIPlugin, cniBin); err != nil {
					return harness.Process{}, err
				}
				return harness.Process{
					Name: devnode.Kubelet,
					Path: o.bins.Kubelet,
					Args: []string{
						"run",
						"--kubeconfig=" + c.Kubeconfig(),
						"--node-name=" + o.nodeName,
						"--node-ip=" + o.nodeIP,
						"--cni-conf-dir=" + agent.CNIConfDir(),
						"--cni-bin-dir=" + cniBin,
						"--state-dir=" + filepath.Join(dir, kubeletStateDir),
						"--cleanup",
					},
					LogFile: filepath.Join(dir, devnode.Kubelet+".log"),
					PidFile: filepath.Join(dir, devnode.Kubelet+".pid"),
					Detach:  true,
				}, nil
			},
			wait: func(ctx context.Context, r *harness.Running) error {
				return devnode.WaitFor(ctx, r, func() error {
					_, err := c.Clientset().CoreV1().Nodes().Get(ctx, o.nodeName, metav1.GetOptions{})
					return err
				})
			},
		},
		{
			process: agent.Process,
			wait: func(ctx context.Context, r *harness.Running) error {
				if err := devnode.WaitAgent(ctx, agent, r); err != nil {
					return err
				}
				return devnode.WaitFor(ctx, r, func() error { return nodeReady(ctx, c, o.nodeName) })
			},
		},
	}
}

// nodeReady checks that the Node exists and is Ready.
func nodeReady(ctx context.Context, c *harness.Cluster, name string) error {
	n, err := c.Clientset().CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	for _, cond := range n.Status.Conditions {
		if cond.Type == corev1.NodeReady {
			if cond.Status == corev1.ConditionTrue {
				return nil
			}
			return fmt.Errorf("node %s not ready: %s", name, cond.Message)
		}
	}
	return fmt.Errorf("node %s has no Ready condition", name)
}

// stopOrder is the order down stops the processes in: the devkubelet
// first, since it tears its sandboxes down through the agent, then the
// others in reverse start order.
func stopOrder(procs []string) []string {
	out := make([]string, 0, len(procs))
	if slices.Contains(procs, devnode.Kubelet) {
		out = append(out, devnode.Kubelet)
	}
	for _, name := range slices.Backward(procs) {
		if name != devnode.Kubelet {
			out = append(out, name)
		}
	}
	return out
}

// processStopTimeout is how long down gives a process after SIGTERM: the
// devkubelet tears down its pods' sandboxes through the agent first.
func processStopTimeout(name string) time.Duration {
	if name == devnode.Kubelet {
		return 90 * time.Second
	}
	return stopTimeout
}

// removeNodeLeftovers removes the network namespaces and veths of the
// devkubelet's sandboxes in dir that are still there (the devkubelet
// removes them itself when it stops normally).
func removeNodeLeftovers(dir string, w io.Writer) error {
	stateDir := filepath.Join(dir, kubeletStateDir)
	if _, err := os.Stat(stateDir); err != nil {
		return nil
	}
	removed, err := devkubelet.RemoveLeftovers(stateDir)
	for _, r := range removed {
		fmt.Fprintf(w, "removed %s\n", r)
	}
	return err
}

// demoPod is one demo pod.
type demoPod struct{ name, app string }

var demoPods = []demoPod{{"web-1", "web"}, {"web-2", "web"}, {"db-1", "db"}}

// demo creates the demo pods, waits until they run and have their
// CiliumEndpoints, and prints what to try.
func demo(ctx context.Context, w io.Writer, dir string, c *harness.Cluster, o nodeOptions) error {
	kubeconfig := relativeToWD(c.Kubeconfig())
	agent := agentConfig(dir, c, o)
	cli := "cellium"
	if o.bins.CLI != "" {
		if _, err := os.Stat(o.bins.CLI); err == nil {
			cli = relativeToWD(o.bins.CLI)
		}
	}
	try := []string{
		fmt.Sprintf("kubectl --kubeconfig %s get nodes,ciliumnodes -o wide", kubeconfig),
		fmt.Sprintf("kubectl --kubeconfig %s get cep -A", kubeconfig),
		fmt.Sprintf("%s -H unix://%s status", cli, agent.SocketPath()),
		fmt.Sprintf("%s -H unix://%s endpoint list", cli, agent.SocketPath()),
	}
	if o.hostRouting {
		if ip := showHealthEndpoint(ctx, w, agent, o.timeout); ip != "" {
			try = append(try,
				fmt.Sprintf("curl http://%s:%d%s", ip, health.Port, health.Path),
				fmt.Sprintf("ip netns exec %s ip -4 addr show %s", health.NetnsName, health.IfName))
		}
	}
	if !o.demoPods {
		printTry(w, try)
		return nil
	}
	cs := c.Clientset()
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: demoNamespace}},
		metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create namespace %s: %w", demoNamespace, err)
	}
	if err := c.EnsureServiceAccount(ctx, demoNamespace); err != nil {
		return err
	}
	for _, p := range demoPods {
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: p.name, Namespace: demoNamespace, Labels: map[string]string{"app": p.app}},
			Spec: corev1.PodSpec{
				NodeName:   o.nodeName,
				Containers: []corev1.Container{{Name: p.app, Image: "registry.k8s.io/pause:3.10"}},
			},
		}
		if _, err := cs.CoreV1().Pods(demoNamespace).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("create demo pod %s: %w", p.name, err)
		}
	}
	cilium, err := versioned.NewForConfig(c.RESTConfig())
	if err != nil {
		return err
	}
	wctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	var ceps map[string]*ciliumv2.CiliumEndpoint
	err = devnode.WaitFor(wctx, nil, func() error {
		ceps = map[string]*ciliumv2.CiliumEndpoint{}
		list, err := cilium.CiliumV2().CiliumEndpoints(demoNamespace).List(wctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		for i := range list.Items {
			ceps[list.Items[i].Name] = &list.Items[i]
		}
		for _, p := range demoPods {
			pod, err := cs.CoreV1().Pods(demoNamespace).Get(wctx, p.name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if pod.Status.Phase != corev1.PodRunning || pod.Status.PodIP == "" {
				return fmt.Errorf("pod %s is %s", p.name, pod.Status.Phase)
			}
			cep := ceps[p.name]
			if cep == nil || cep.Status.State != ciliumv2.EndpointStateReady {
				return fmt.Errorf("no ready CiliumEndpoint for pod %s", p.name)
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("demo pods: %w (see kubectl --kubeconfig %s describe pods -n %s)", err, kubeconfig, demoNamespace)
	}

	netns := map[string]string{}
	if sbs, err := devkubelet.LoadSandboxes(filepath.Join(dir, kubeletStateDir)); err == nil {
		for _, sb := range sbs {
			netns[sb.Key()] = sb.NetnsName()
		}
	}
	fmt.Fprintf(w, "demo pods in namespace %s on node %s:\n", demoNamespace, o.nodeName)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "  POD\tIP\tENDPOINT\tIDENTITY\tNETNS")
	for _, p := range demoPods {
		cep := ceps[p.name]
		ip := ""
		if n := cep.Status.Networking; n != nil && len(n.Addressing) > 0 && n.Addressing[0] != nil {
			ip = n.Addressing[0].IPV4
		}
		id := ""
		if cep.Status.Identity != nil {
			id = strconv.FormatInt(cep.Status.Identity.ID, 10)
		}
		fmt.Fprintf(tw, "  %s\t%s\t%d\t%s\t%s\n", p.name, ip, cep.Status.ID, id, netns[demoNamespace+"/"+p.name])
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w)
	try = slices.Insert(try, 1, fmt.Sprintf("kubectl --kubeconfig %s get pods -n %s -o wide", kubeconfig, demoNamespace))
	if ns := netns[demoNamespace+"/"+demoPods[0].name]; ns != "" {
		try = append(try,
			"ip netns list",
			fmt.Sprintf("ip netns exec %s ip -4 addr show eth0", ns),
			fmt.Sprintf("ip netns exec %s ip route", ns))
	}
	printTry(w, try)
	return nil
}

// showHealthEndpoint waits (at most timeout) until the agent's probe of
// its health endpoint answers, prints one line saying where the endpoint
// is and whether it answers, and returns its IP ("" if it has none).
func showHealthEndpoint(ctx context.Context, w io.Writer, agent devnode.AgentConfig, timeout time.Duration) string {
	cl := client.New(agent.SocketPath())
	defer cl.Close()
	wctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var last models.HealthProbe
	err := devnode.WaitFor(wctx, nil, func() error {
		h, err := cl.GetHealthz(wctx)
		if err != nil {
			return err
		}
		if h.ClusterHealth == nil || len(h.ClusterHealth.Probes) == 0 {
			return errors.New("the agent does not probe its health endpoint")
		}
		last = h.ClusterHealth.Probes[0]
		if !last.Reachable {
			return errors.New(last.Error)
		}
		return nil
	})
	switch {
	case err == nil:
		fmt.Fprintf(w, "health endpoint: %s in netns %s (veth %s) answers GET :%d%s (%s)\n\n",
			last.IP, health.NetnsName, health.HostIfName, health.Port, health.Path, last.Latency.Round(time.Microsecond))
	default:
		fmt.Fprintf(w, "health endpoint: %s not reachable yet: %v (cellium status shows Cluster health)\n\n", last.IP, err)
	}
	return last.IP
}

func printTry(w io.Writer, try []string) {
	fmt.Fprintln(w, "try:")
	for _, t := range try {
		fmt.Fprintf(w, "  %s\n", t)
	}
	fmt.Fprintln(w)
}
