package realnode

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cellium/cellium/api/client/clientset/versioned"
	"github.com/cellium/cellium/install"
	"github.com/cellium/cellium/test/harness"
	"github.com/cellium/cellium/test/privileged"
)

// TestPrivilegedRealClusterTwoNodes is Up with two nodes, each in network
// and mount namespaces of its own on the nodes' bridge, cellium installed
// once from the chart with its default host paths (routing mode tunnel, the
// default): both nodes are Ready with an agent pod Running on each; two
// pods pinned (nodeName) to different nodes reach each other over TCP, and
// a default-deny ingress NetworkPolicy selecting one stops the other's
// connections to it while the other direction still works. The agent of
// the second node is then killed (SIGKILL) under a TCP stream through that
// node (checkAgentKill), and the node removed. Stop then leaves nothing on
// the host (ClusterLeftovers).
func TestPrivilegedRealClusterTwoNodes(t *testing.T) {
	testTwoNodes(t, "tunnel", false, nil)
}

// TestPrivilegedRealClusterTwoNodesNative is the same in native routing
// mode: each node routes the other's pod CIDR via the other's address
// (auto-direct-node-routes), no tunnel device; and with
// CiliumEndpointSlices (ciliumEndpointSlice.enabled): the agents learn the
// other node's pods from the operator's slices, not from CiliumEndpoints;
// and with kube-proxy replacement (kubeProxyReplacement=true, no
// kube-proxy on either node): NodePorts with both external traffic
// policies are cellium's (checkNodePorts).
func TestPrivilegedRealClusterTwoNodesNative(t *testing.T) {
	testTwoNodes(t, "native", true, []string{"routingMode=native", "autoDirectNodeRoutes=true",
		"ipv4NativeRoutingCIDR=" + DefaultPodCIDR, "ciliumEndpointSlice.enabled=true"})
}

// TestPrivilegedRealClusterTwoNodesKVStore is TestPrivilegedRealClusterTwoNodes
// (tunnel mode, CiliumEndpoints) installed in the etcd kvstore mode
// (ClusterOptions.KVStore: identityAllocationMode=kvstore, etcd.enabled,
// etcd.endpoints the control plane's etcd on the nodes' bridge): the same
// checks pass, and etcd holds what the agents exchanged through it
// (checkKVStore): both nodes' keys, each pod's ipcache key with its node
// and identity, each pod's identity, which is no CiliumIdentity object;
// each node's ipcache has the other node's pod from its key. The agents'
// kvstore lease lasts 30 s (--kvstore-lease-ttl, 15 minutes by default):
// the removed node's agent is killed with the node and leaves its lease,
// and its pods' ipcache keys expire with it within the removal check's
// minute. (Its node key may go sooner: the operator's kvstore nodes GC,
// like Cilium's --synchronize-k8s-nodes, deletes it once the CiliumNode
// and the agent pod are gone; the ipcache keys it leaves, as Cilium's.)
func TestPrivilegedRealClusterTwoNodesKVStore(t *testing.T) {
	testTwoNodes(t, "tunnel", false, []string{"agent.extraArgs={--kvstore-lease-ttl=30s}"}, twoNodesOptions{kvstore: true})
}

// twoNodesOptions vary testTwoNodes beyond routing mode, kube-proxy
// replacement and chart values.
type twoNodesOptions struct {
	// kvstore installs cellium in the etcd kvstore mode
	// (ClusterOptions.KVStore) and, once the pods run, checks that the
	// nodes, the pods' identities and their ipcache entries went through
	// etcd (checkKVStore).
	kvstore bool
}

// testTwoNodes runs the two-node checks in routing mode mode, installed
// with values, with kube-proxy or (kpr) cellium's kube-proxy replacement,
// varied by opts (at most one).
func testTwoNodes(t *testing.T, mode string, kpr bool, values []string, opts ...twoNodesOptions) {
	privileged.Require(t)
	var o twoNodesOptions
	if len(opts) > 0 {
		o = opts[0]
	}
	bins := nodeBinaries(t)
	ctx := t.Context()
	var logged bytes.Buffer
	logger := slog.New(slog.NewTextHandler(io.MultiWriter(t.Output(), &logged), nil))
	dir, err := os.MkdirTemp("", "crc2-")
	if err != nil {
		t.Fatal(err)
	}
	stopped := false
	var c *Cluster
	t.Cleanup(func() {
		if !stopped {
			if c != nil {
				if err := c.Stop(context.Background()); err != nil {
					t.Errorf("stop: %v", err)
				}
			} else if err := Down(context.Background(), dir, logger); err != nil {
				t.Errorf("down: %v", err)
			}
		}
		if t.Failed() {
			t.Logf("cluster logs kept in %s", dir)
			return
		}
		_ = os.RemoveAll(dir)
	})
	began := time.Now()
	c, err = Up(ctx, ClusterOptions{Dir: dir, Nodes: 2, NodeBinaries: bins, Values: values, KubeProxyReplacement: kpr, KVStore: o.kvstore, Logger: logger})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("Up with 2 nodes took %s", time.Since(began).Round(time.Second))
	t.Cleanup(func() {
		if t.Failed() && !stopped {
			dumpNodes(t, c)
			if o.kvstore {
				dumpKVStore(t, c)
			}
		}
	})
	if len(c.Nodes) != 2 || c.Node != c.Nodes[0] {
		t.Fatalf("want 2 nodes with Node the first, have %d", len(c.Nodes))
	}
	cs := c.Control.Clientset()

	// Both nodes Ready (Up waited), an agent pod Running and Ready on each.
	agents, err := cs.CoreV1().Pods(install.Namespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=agent"})
	if err != nil {
		t.Fatal(err)
	}
	onNode := map[string]bool{}
	for _, p := range agents.Items {
		if p.Status.Phase == corev1.PodRunning && podReady(&p) {
			onNode[p.Spec.NodeName] = true
		}
	}
	for _, n := range c.Nodes {
		if !onNode[n.Name] {
			t.Errorf("no Running, Ready agent pod on node %s (agent pods: %d)", n.Name, len(agents.Items))
		}
		if n.Namespaces() == nil {
			t.Errorf("node %s runs in the host's namespaces", n.Name)
		}
	}
	if t.Failed() {
		t.FailNow()
	}
	// Each node's agent has its own cgroup v2 subtree at the chart's
	// cgroupRoot, and its socket load balancer's programs are attached
	// there (not to the machine's cgroup v2 root).
	for _, n := range c.Nodes {
		checkNodeCgroup(t, n)
	}

	// Each node reaches the other's pod CIDR the mode's way: into
	// cilium_vxlan (tunnel), or via the other node's address (native).
	checkRemoteRoutes(t, c, mode)

	// Two pods, one per node.
	const space = "twonodes"
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: space}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	names := []string{"a", "b"}
	for i, name := range names {
		_, err := cs.CoreV1().Pods(space).Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"app": name}},
			Spec: corev1.PodSpec{
				NodeName:   c.Nodes[i].Name,
				Containers: []corev1.Container{{Name: "app", Image: DemoImage, ImagePullPolicy: corev1.PullNever}},
			},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
	}
	ips := map[string]string{}
	for _, name := range names {
		eventually(t, 2*time.Minute, "pod "+name+" Ready", func() error {
			p, err := cs.CoreV1().Pods(space).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if !podReady(p) || p.Status.PodIP == "" {
				return fmt.Errorf("phase %s, IP %q", p.Status.Phase, p.Status.PodIP)
			}
			ips[name] = p.Status.PodIP
			return nil
		})
	}
	// Each node knows the other node's pod by its identity, from its
	// CiliumEndpoint or, with ciliumEndpointSlice.enabled, from the
	// operator's slice: the same ipcache row either way.
	checkRemoteEndpoints(t, c, space, names, slices.Contains(values, "ciliumEndpointSlice.enabled=true"))
	if o.kvstore {
		// In kvstore mode, through etcd.
		checkKVStore(t, c, space, names, ips)
	}

	netnsOf := map[string]ns.NetNS{}
	for i, name := range names {
		pid := taskPID(t, c.Nodes[i], space, name)
		n, err := ns.GetNS(fmt.Sprintf("/proc/%d/ns/net", pid))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = n.Close() })
		netnsOf[name] = n
	}
	reach := func(from, to string) error {
		body, err := httpGetIn(netnsOf[from], ips[to]+":8080")
		if err != nil {
			return err
		}
		if body != "hello from "+to+"\n" {
			return fmt.Errorf("answer %q", body)
		}
		return nil
	}
	// Across the nodes, both ways.
	eventually(t, 30*time.Second, "a (node "+c.Nodes[0].Name+") reaching b (node "+c.Nodes[1].Name+") at "+ips["b"], func() error { return reach("a", "b") })
	eventually(t, 30*time.Second, "b reaching a at "+ips["a"], func() error { return reach("b", "a") })

	// NodePorts from outside the nodes and from each node; a runs on
	// node 1.
	checkNodePorts(t, c, space, "a", kpr)

	// Default-deny ingress on b: a's connections to b stop, b still
	// reaches a.
	_, err = cs.NetworkingV1().NetworkPolicies(space).Create(ctx, &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "deny-b"},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "b"}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "the policy stopping a's connections to b", func() error {
		if err := reach("a", "b"); err == nil {
			return fmt.Errorf("a still reaches b")
		}
		return nil
	})
	// Stays stopped.
	for range 3 {
		if err := reach("a", "b"); err == nil {
			t.Fatal("a reached b under the default-deny ingress policy")
		}
	}
	if err := reach("b", "a"); err != nil {
		t.Fatalf("b no longer reaches a (no policy selects a): %v", err)
	}

	// Node 2's agent killed (SIGKILL) while a stream from b to a runs
	// through node 2: the stream carries on, the deny on b holds while
	// the agent is down, the kubelet brings the agent back. With kpr, a
	// stream through node 2's NodePort to a carries on and new NodePort
	// connections through node 2 are served while its agent is down.
	checkAgentKill(t, c, c.Nodes[1], netnsOf, ips, "b", "a", kpr)

	// Node 2 removed (its pods drained, its processes stopped, its Node
	// and CiliumNode deleted: Node.Stop): node 1 keeps no route to its pod
	// CIDR and no ipcache row of it (its address, pod CIDR, pods).
	for _, n := range netnsOf {
		_ = n.Close()
	}
	checkNodeRemoved(t, c, c.Nodes[1], c.Nodes[0])

	// Stop leaves nothing.
	stopped = true
	began = time.Now()
	if err := c.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Logf("Stop took %s", time.Since(began).Round(time.Millisecond))
	if left := ClusterLeftovers(dir); len(left) > 0 {
		t.Fatalf("Stop left on the host:\n  %s", strings.Join(left, "\n  "))
	}
}

// checkRemoteEndpoints fails unless node i's pod (names[i], in space) has
// an ipcache row on every other node with its CiliumEndpoint's identity
// and node i's address as tunnel endpoint; in slice mode, the pod's
// endpoint is also in exactly one CiliumEndpointSlice of space, with that
// identity.
func checkRemoteEndpoints(t *testing.T, c *Cluster, space string, names []string, slicesMode bool) {
	t.Helper()
	ctx := t.Context()
	cilium := versioned.NewForConfigOrDie(c.Control.RESTConfig())
	cli, _ := filepath.Glob(filepath.Join(c.Dir, "images", "bin-*", "cellium"))
	if len(cli) == 0 {
		t.Fatal("no cellium CLI in the packed image's folder")
	}
	for i, name := range names {
		var id int64
		var ip string
		eventually(t, time.Minute, "the CiliumEndpoint of "+space+"/"+name+" with an identity", func() error {
			cep, err := cilium.CiliumV2().CiliumEndpoints(space).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if cep.Status.Identity == nil || cep.Status.Networking == nil || len(cep.Status.Networking.Addressing) == 0 {
				return fmt.Errorf("status %+v", cep.Status)
			}
			id, ip = cep.Status.Identity.ID, cep.Status.Networking.Addressing[0].IPV4
			return nil
		})
		if slicesMode {
			eventually(t, time.Minute, "the endpoint "+space+"/"+name+" in one CiliumEndpointSlice", func() error {
				list, err := cilium.CiliumV2alpha1().CiliumEndpointSlices().List(ctx, metav1.ListOptions{})
				if err != nil {
					return err
				}
				var in []string
				for _, ces := range list.Items {
					for _, ep := range ces.Endpoints {
						if ces.Namespace == space && ep.Name == name {
							if ep.IdentityID != id {
								return fmt.Errorf("slice %s has identity %d, the CiliumEndpoint %d", ces.Name, ep.IdentityID, id)
							}
							in = append(in, ces.Name)
						}
					}
				}
				if len(in) != 1 {
					return fmt.Errorf("in slices %v (of %d)", in, len(list.Items))
				}
				return nil
			})
		}
		for j, viewer := range c.Nodes {
			if j == i {
				continue
			}
			want := []string{ip + "/32", strconv.FormatInt(id, 10)}
			eventually(t, time.Minute, "node "+viewer.Name+" knowing "+name+" ("+ip+") as identity "+want[1], func() error {
				out, err := exec.Command(cli[0], "--host", "unix://"+viewer.AgentConfig().SocketPath(), "ipcache", "list").CombinedOutput()
				if err != nil {
					return fmt.Errorf("ipcache list: %v: %s", err, out)
				}
				for _, line := range strings.Split(string(out), "\n") {
					f := strings.Fields(line)
					if len(f) >= 2 && f[0] == want[0] {
						if f[1] != want[1] || !slices.Contains(f, c.Nodes[i].IP.String()) {
							return fmt.Errorf("row %q; want identity %s, tunnel endpoint %s", line, want[1], c.Nodes[i].IP)
						}
						t.Logf("node %s: %s (slices %v)", viewer.Name, strings.Join(f, " "), slicesMode)
						return nil
					}
				}
				return fmt.Errorf("no row for %s in:\n%s", want[0], out)
			})
		}
	}
}

// checkRemoteRoutes fails unless each node of c routes every other node's
// pod CIDR as routing mode mode does, and has cilium_vxlan only in tunnel
// mode.
func checkRemoteRoutes(t *testing.T, c *Cluster, mode string) {
	t.Helper()
	// Up routed each node's pod CIDR on the host via the node's address.
	if len(c.state.Routes) < len(c.Nodes) {
		t.Fatalf("Up routed %d pod CIDRs on the host, want one per node (%d)", len(c.state.Routes), len(c.Nodes))
	}
	for _, n := range c.Nodes {
		s := n.Namespaces()
		for _, r := range c.state.Routes {
			if r.Via == n.IP.String() {
				continue
			}
			eventually(t, time.Minute, fmt.Sprintf("node %s's route to pod CIDR %s of node %s", n.Name, r.CIDR, r.Via), func() error {
				out, err := exec.Command("ip", "-n", s.Name, "route", "show", r.CIDR).CombinedOutput()
				if err != nil {
					return fmt.Errorf("%v: %s", err, out)
				}
				want := "dev cilium_vxlan"
				if mode == "native" {
					want = "via " + r.Via
				}
				if route := strings.TrimSpace(string(out)); !strings.Contains(route, want) {
					return fmt.Errorf("route %q, want one with %q", route, want)
				}
				return nil
			})
		}
		err := exec.Command("ip", "-n", s.Name, "link", "show", "cilium_vxlan").Run()
		if hasTunnel := err == nil; hasTunnel != (mode == "tunnel") {
			t.Errorf("node %s: cilium_vxlan present %v in %s mode", n.Name, hasTunnel, mode)
		}
	}
}

// checkNodeRemoved stops gone and fails unless, within a minute, other
// has neither a route into gone's pod CIDR nor an ipcache row naming
// gone's address (as its node, tunnel endpoint or remote-node address).
func checkNodeRemoved(t *testing.T, c *Cluster, gone, other *Node) {
	t.Helper()
	var cidrs []string
	for _, r := range c.state.Routes {
		if r.Via == gone.IP.String() {
			cidrs = append(cidrs, r.CIDR)
		}
	}
	if len(cidrs) == 0 {
		t.Fatalf("no pod CIDR of node %s on record", gone.Name)
	}
	cli, _ := filepath.Glob(filepath.Join(c.Dir, "images", "bin-*", "cellium"))
	if len(cli) == 0 {
		t.Fatal("no cellium CLI in the packed image's folder")
	}
	ipcacheList := func() (string, error) {
		out, err := exec.Command(cli[0], "--host", "unix://"+other.AgentConfig().SocketPath(), "ipcache", "list").CombinedOutput()
		if err != nil {
			return "", fmt.Errorf("ipcache list: %v: %s", err, out)
		}
		return string(out), nil
	}
	// Before: other has rows of gone (so the check below is not empty).
	before, err := ipcacheList()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(strings.Split(before, "\n"), func(l string) bool { return slices.Contains(strings.Fields(l), gone.IP.String()) }) {
		t.Fatalf("node %s has no ipcache row of node %s before it goes:\n%s", other.Name, gone.Name, before)
	}
	began := time.Now()
	if err := gone.Stop(t.Context()); err != nil {
		t.Fatalf("stop node %s: %v", gone.Name, err)
	}
	t.Logf("node %s stopped and deleted in %s", gone.Name, time.Since(began).Round(time.Millisecond))
	s := other.Namespaces()
	began = time.Now()
	eventually(t, time.Minute, "node "+other.Name+" forgetting node "+gone.Name, func() error {
		for _, cidr := range cidrs {
			out, err := exec.Command("ip", "-n", s.Name, "route", "show", cidr).CombinedOutput()
			if err != nil {
				return fmt.Errorf("%v: %s", err, out)
			}
			if r := strings.TrimSpace(string(out)); r != "" {
				return fmt.Errorf("route left: %s", r)
			}
		}
		out, err := ipcacheList()
		if err != nil {
			return err
		}
		for _, line := range strings.Split(out, "\n") {
			if slices.Contains(strings.Fields(line), gone.IP.String()) || slices.ContainsFunc(cidrs, func(c string) bool { return strings.Contains(line, c) }) {
				return fmt.Errorf("ipcache row left: %s", line)
			}
		}
		return nil
	})
	t.Logf("node %s forgot node %s %s after it was deleted", other.Name, gone.Name, time.Since(began).Round(time.Millisecond))
}

// dumpNodes logs, for a failed test, each node's links and routes, the
// agents' ipcache and the ends of the node's logs.
func dumpNodes(t *testing.T, c *Cluster) {
	t.Helper()
	cli, _ := filepath.Glob(filepath.Join(c.Dir, "images", "bin-*", "cellium"))
	for _, n := range c.Nodes {
		s := n.Namespaces()
		if s == nil {
			continue
		}
		for _, args := range [][]string{
			{"ip", "-n", s.Name, "-d", "link"},
			{"ip", "-n", s.Name, "route"},
		} {
			out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
			t.Logf("--- node %s: %s (%v) ---\n%s", n.Name, strings.Join(args, " "), err, out)
		}
		if len(cli) > 0 {
			out, err := exec.Command(cli[0], "--host", "unix://"+n.AgentConfig().SocketPath(), "ipcache", "list").CombinedOutput()
			t.Logf("--- node %s: cellium ipcache list (%v) ---\n%s", n.Name, err, out)
		}
		for _, name := range []string{Containerd, Kubelet, KubeProxy} {
			t.Logf("--- node %s: last lines of %s ---\n%s", n.Name, name, tail(n.LogFile(name), 15))
		}
		logs, _ := filepath.Glob(filepath.Join(n.Dir, "pod-logs", install.Namespace+"_*", "*", "*.log"))
		for _, l := range logs {
			t.Logf("--- last lines of %s ---\n%s", l, tail(l, 20))
		}
	}
	out, err := exec.Command("ip", "route").CombinedOutput()
	t.Logf("--- host: ip route (%v) ---\n%s", err, out)
}

// checkNodeCgroup checks that inside node n's mount namespace
// AgentCgroupRoot is a cgroup2 mount of the node's own subtree (the
// kubelet's cgroup root in the unified hierarchy), and that cgroup programs
// (the agent's socket load balancer, cgroup_inet4_connect) are attached
// to that subtree.
func checkNodeCgroup(t *testing.T, n *Node) {
	t.Helper()
	pid, running, err := harness.ReadPidFile(filepath.Join(n.Dir, Containerd+".pid"))
	if err != nil || !running {
		t.Fatalf("node %s: containerd's pid: %d %v %v", n.Name, pid, running, err)
	}
	info, err := os.ReadFile(fmt.Sprintf("/proc/%d/mountinfo", pid))
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for line := range strings.Lines(string(info)) {
		f := strings.Fields(line)
		// id parent major:minor root mountpoint options ... - fstype ...
		sep := slices.Index(f, "-")
		if len(f) < 5 || sep < 0 || sep+1 >= len(f) || f[4] != AgentCgroupRoot {
			continue
		}
		found = true
		if f[sep+1] != "cgroup2" || f[3] != n.host.CgroupRoot {
			t.Errorf("node %s: %s is %s of %s, want cgroup2 of %s", n.Name, AgentCgroupRoot, f[sep+1], f[3], n.host.CgroupRoot)
		}
	}
	if !found {
		t.Errorf("node %s: nothing mounted at %s in its mount namespace", n.Name, AgentCgroupRoot)
	}
	sub := filepath.Join("/sys/fs/cgroup/unified", n.host.CgroupRoot)
	eventually(t, 30*time.Second, "socket LB programs on "+sub, func() error {
		out, err := exec.Command("bpftool", "cgroup", "show", sub).CombinedOutput()
		if err != nil {
			return fmt.Errorf("bpftool cgroup show %s: %w: %s", sub, err, out)
		}
		if !strings.Contains(string(out), "cgroup_inet4_connect") {
			return fmt.Errorf("no cgroup_inet4_connect program on %s:\n%s", sub, out)
		}
		return nil
	})
}
