package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"strings"
	"text/tabwriter"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cellium/cellium/install"
	"github.com/cellium/cellium/test/harness"
	"github.com/cellium/cellium/test/realnode"
)

// Kinds of node up runs (--node).
const (
	nodeReal = "real" // containerd, kubelet, kube-scheduler, kube-proxy; cellium from its chart
	nodeDev  = "dev"  // the devkubelet and an agent process
)

// upReal starts a control plane and real nodes in dir with cellium
// installed from its chart (realnode.Up, detached), then the demo pods, and
// prints what to try. Of o it reads the chart values (--set), the
// number of nodes, whether to run kube-proxy or cellium's replacement, the
// demo pods switch and binDir (make build's bin/, may be empty: where
// cellium's image finds its programs).
func upReal(ctx context.Context, stdout, stderr io.Writer, dir string, timeout time.Duration, o nodeOptions) error {
	demoPods := o.demoPods
	if err := checkRoot(os.Geteuid(), false); err != nil {
		return err
	}
	log := logger(stderr)
	bins, err := harness.EnsureNodeBinaries(ctx, log)
	if err != nil {
		return err
	}
	if err := prepareDir(dir, stderr); err != nil {
		return err
	}
	st := state{Started: time.Now().UTC(), Node: nodeReal}
	if err := writeState(dir, st); err != nil {
		return err
	}
	hint := fmt.Sprintf("\n(logs are in %s and %s/node; `make down` or `devcluster down --dir %s` cleans up)",
		relativeToWD(dir), relativeToWD(dir), relativeToWD(dir))
	c, err := realnode.Up(ctx, realnode.ClusterOptions{
		Dir:          dir,
		Detach:       true,
		NodeBinaries: bins,
		HubbleRelay:  true,
		Values:       o.values,
		BinDir:       o.binDir,
		Nodes:        o.nodes,
		StartTimeout: timeout,
		Logger:       log,

		KubeProxyReplacement: o.kubeProxyReplacement,
	})
	if err != nil {
		return fmt.Errorf("%w%s", err, hint)
	}
	// The cluster runs on without this process.
	c.ReleaseHostNetworkLock()
	for _, p := range c.Control.Processes() {
		st.Processes = append(st.Processes, p.Name())
	}
	st.APIServer, st.Kubeconfig = c.Control.APIServerURL(), c.Kubeconfig()
	if err := writeState(dir, st); err != nil {
		return err
	}
	kc := relativeToWD(c.Kubeconfig())
	k := kubectl(ctx, log) + " --kubeconfig " + kc
	names := make([]string, 0, len(c.Nodes))
	for _, n := range c.Nodes {
		names = append(names, n.Name)
	}
	if len(names) == 0 {
		names = append(names, c.Node.Name)
	}
	services := "kube-proxy nftables"
	if o.kubeProxyReplacement {
		services = "no kube-proxy: cellium's kube-proxy replacement"
	}
	fmt.Fprintf(stdout, "cluster is up: kube-apiserver %s, node %s (containerd, kubelet, kube-scheduler, %s)\n",
		c.Control.APIServerURL(), strings.Join(names, ", "), services)
	fmt.Fprintf(stdout, "cellium installed from its chart: %s (DaemonSet %s, Deployment %s in %s)\n",
		relativeToWD(c.Node.Dir+"/cellium.yaml"), realnode.AgentDaemonSet, realnode.OperatorDeployment, install.Namespace)
	fmt.Fprintf(stdout, "cluster DNS: CoreDNS %s (Deployment %s, Service %s %s in %s), domain %s\n",
		bins.CoreDNSVersion, realnode.CoreDNSDeployment, realnode.DNSService, c.DNSServiceIP, metav1.NamespaceSystem, realnode.ClusterDomain)
	fmt.Fprintf(stdout, "kubeconfig: %s\n  export KUBECONFIG=%s\n\n", kc, c.Kubeconfig())
	// The chart sets CELLIUM_SOCK in the agent's container: no --host.
	agentExec := fmt.Sprintf("%s -n %s exec ds/%s -c cellium-agent -- cellium",
		k, install.Namespace, realnode.AgentDaemonSet)
	try := []string{
		k + " get nodes,ciliumnodes -o wide",
		k + " get pods -A -o wide",
		agentExec + " status",
		agentExec + " endpoint list",
		k + " get cep -A",
	}
	if demoPods {
		demo, err := c.DeployDemo(ctx, timeout)
		if err != nil {
			return fmt.Errorf("%w (see %s describe pods -n %s)%s", err, k, realnode.DemoNamespace, hint)
		}
		fmt.Fprintf(stdout, "demo pods in namespace %s (image %s, HTTP on :8080):\n", realnode.DemoNamespace, realnode.DemoImage)
		tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "  POD\tIP\tENDPOINT\tIDENTITY")
		for _, d := range demo {
			fmt.Fprintf(tw, "  %s\t%s\t%d\t%d\n", d.Name, d.IP, d.EndpointID, d.Identity)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		fmt.Fprintln(stdout)
		try = append(try,
			// Through the cluster DNS: db.demo is the Service db's name.
			fmt.Sprintf("%s -n %s exec %s -- demoapp --get http://db.%s:8080/", k, realnode.DemoNamespace, demo[0].Name, realnode.DemoNamespace),
			fmt.Sprintf("%s -n %s exec %s -- demoapp --resolve kubernetes.default.svc.%s", k, realnode.DemoNamespace, demo[0].Name, realnode.ClusterDomain),
			fmt.Sprintf("%s -n %s exec %s -- demoapp --get http://%s:8080/", k, realnode.DemoNamespace, demo[0].Name, demo[1].IP),
			fmt.Sprintf("%s -n %s get services   # then: exec %s -- demoapp --get http://%s:8080/ (Service db's ClusterIP)", k, realnode.DemoNamespace, demo[0].Name, demo[len(demo)-1].ServiceIP),
			fmt.Sprintf("%s -n %s logs %s", k, realnode.DemoNamespace, demo[1].Name),
			fmt.Sprintf("curl http://%s:%d/   # the demo's NodePort (Service web), from this machine", nodeAddress(c), realnode.DemoNodePort),
			fmt.Sprintf("%s run hello --image=%s --image-pull-policy=Never", k, realnode.DemoImage),
		)
	}
	pod := ""
	if demoPods {
		pod = "web-1"
	}
	try = append(try, hubbleTry(k, hubbleCommand(), pod)...)
	try = append(try, "make down")
	printTry(stdout, try)
	nodeDir := "node"
	if o.nodes > 1 {
		nodeDir = "node<i>" // one directory per node: node1, node2, ...
	}
	fmt.Fprintf(stdout, "logs: %s/*.log (control plane), %s/%s/*.log (node), %s/%s/pod-logs (pods)\n",
		relativeToWD(dir), relativeToWD(dir), nodeDir, relativeToWD(dir), nodeDir)
	return nil
}

// downReal stops the real cluster in dir, if there is one (realnode.Down).
func downReal(ctx context.Context, w io.Writer, dir string) error {
	if !realnode.IsClusterDir(dir) {
		return nil
	}
	fmt.Fprintf(w, "stopping the real node and its pods\n")
	if err := realnode.Down(ctx, dir, logger(w)); err != nil {
		return err
	}
	if left := realnode.ClusterLeftovers(dir); len(left) > 0 {
		return fmt.Errorf("the real node left %v", left)
	}
	return nil
}

// kubectl is the kubectl to print in the hints: the one on $PATH, else the
// cluster's own version from the cache, built now if needed
// (harness.EnsureKubectl, a few minutes once; make kubectl).
func kubectl(ctx context.Context, log *slog.Logger) string {
	if _, err := exec.LookPath("kubectl"); err == nil {
		return "kubectl"
	}
	if p, ok := harness.CachedKubectl(); ok {
		return p
	}
	log.Info("no kubectl on $PATH: building the cluster's version (make kubectl)")
	p, err := harness.EnsureKubectl(ctx, log)
	if err != nil {
		log.Warn("cannot build kubectl", "error", err)
		return "kubectl"
	}
	return p
}

// hubbleTry are the ways to Hubble that up prints: through hubble-relay
// (a port-forward to its Service, then the upstream CLI hubble), and the
// CLI inside an agent's container (the chart sets HUBBLE_SERVER there). k
// is the kubectl command line, pod a demo pod to follow ("" for the whole
// cluster).
func hubbleTry(k, hubble, pod string) []string {
	follow := hubble + " observe --server localhost:4245 --follow"
	if pod != "" {
		follow = fmt.Sprintf("%s observe --server localhost:4245 --pod %s/%s --follow", hubble, realnode.DemoNamespace, pod)
	}
	return []string{
		fmt.Sprintf("%s -n %s port-forward svc/%s 4245:80 &   # hubble-relay, every node's flows", k, install.Namespace, realnode.RelayService),
		hubble + " list nodes --server localhost:4245",
		follow,
		hubble + " observe --server localhost:4245 --verdict DROPPED --last 20",
		fmt.Sprintf("%s -n %s exec ds/%s -c cellium-agent -- hubble observe --last 20   # one node's flows", k, install.Namespace, realnode.AgentDaemonSet),
		fmt.Sprintf("%s -n %s port-forward deploy/%s 12000 &   # then open http://localhost:12000/ (the service map)", k, install.Namespace, realnode.OperatorDeployment),
	}
}

// hubbleCommand is the hubble CLI to print in the hints: the one on
// $PATH, else the cached upstream build (make hubble-binaries; up built
// it for the images).
func hubbleCommand() string {
	if _, err := exec.LookPath("hubble"); err == nil {
		return "hubble"
	}
	if b, ok := harness.CachedHubble(); ok {
		return b.Hubble
	}
	return "hubble"
}

// nodeAddress is the address of the cluster's first node: the one node's,
// or of several the first's.
func nodeAddress(c *realnode.Cluster) string {
	if len(c.Nodes) > 0 {
		return c.Nodes[0].IP.String()
	}
	return c.Node.IP.String()
}
