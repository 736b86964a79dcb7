package realnode

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cellium/cellium/api/v1/client"
	"github.com/cellium/cellium/install"
	"github.com/cellium/cellium/test/devkubelet/devnode"
	"github.com/cellium/cellium/test/privileged"
)

// TestPrivilegedRealClusterDaemonSet is make up's cluster through its Go
// API, detached as make up runs it: cellium is installed from the chart
// (DaemonSet and Deployment from the locally packed image, no agent
// process on the host). The agent's pod becomes Ready; its init container
// installed cellium-cni into the node's CNI directory and it wrote the
// conflist containerd uses; demo pods scheduled by kube-scheduler get
// cellium endpoints with ready CiliumEndpoints and addresses from the
// operator's pool; one pod reaches another over HTTP; the init container
// installed portmap too and the conflist chains it, so that two pods with
// the same hostPort on different hostIPs (127.0.0.1 and the node's
// address, as the HostPort conformance spec) answer the host there. Down (make down,
// from the state on disk) then leaves nothing: no process, mount, cgroup,
// link, route, nftables table or sysctl change. Another node with
// kube-proxy or host-routing agent on the machine is waited for (Start).
func TestPrivilegedRealClusterDaemonSet(t *testing.T) {
	privileged.Require(t)
	bins := nodeBinaries(t)
	ctx := t.Context()
	var logged bytes.Buffer
	logger := slog.New(slog.NewTextHandler(io.MultiWriter(t.Output(), &logged), nil))
	dir, err := os.MkdirTemp("", "crc-")
	if err != nil {
		t.Fatal(err)
	}
	down := false
	t.Cleanup(func() {
		if !down {
			if err := Down(context.Background(), dir, logger); err != nil {
				t.Errorf("down: %v", err)
			}
		}
		if t.Failed() {
			t.Logf("cluster logs kept in %s", dir)
			return
		}
		_ = os.RemoveAll(dir)
	})
	c, err := Up(ctx, ClusterOptions{Dir: dir, Detach: true, NodeBinaries: bins, Logger: logger})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			for _, name := range []string{Containerd, Kubelet, KubeProxy} {
				t.Logf("--- last lines of %s ---\n%s", name, tail(c.Node.LogFile(name), 25))
			}
			logs, _ := filepath.Glob(filepath.Join(c.Node.Dir, "pod-logs", install.Namespace+"_*", "*", "*.log"))
			for _, l := range logs {
				t.Logf("--- last lines of %s ---\n%s", l, tail(l, 25))
			}
		}
	})
	cs := c.Control.Clientset()

	// The agent runs in its DaemonSet's pod, Ready, on the node.
	pods, err := cs.CoreV1().Pods(install.Namespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=agent"})
	if err != nil {
		t.Fatal(err)
	}
	if len(pods.Items) != 1 || pods.Items[0].Spec.NodeName != c.Node.Name || !podReady(&pods.Items[0]) {
		t.Fatalf("want one Ready agent pod on node %s, have %d: %+v", c.Node.Name, len(pods.Items), pods.Items)
	}
	// Its init container installed the plugin (a file, not a link) and
	// the agent wrote the conflist where containerd looks.
	st, err := os.Lstat(filepath.Join(c.Node.CNIBinDir(), "cellium-cni"))
	if err != nil || !st.Mode().IsRegular() || st.Mode().Perm()&0o111 == 0 {
		t.Fatalf("cellium-cni in %s: %v %v", c.Node.CNIBinDir(), st, err)
	}
	// With portmap (DevValues: cni.chainingMode=portmap) beside it.
	st, err = os.Lstat(filepath.Join(c.Node.CNIBinDir(), "portmap"))
	if err != nil || !st.Mode().IsRegular() || st.Mode().Perm()&0o111 == 0 {
		t.Fatalf("portmap in %s: %v %v", c.Node.CNIBinDir(), st, err)
	}
	if conf, err := os.ReadFile(c.Node.AgentConfig().ConfListPath()); err != nil || !strings.Contains(string(conf), `"portmap"`) {
		t.Fatalf("the agent's conflist (want portmap chained): %s %v", conf, err)
	}
	// Its API answers on the host socket the CNI plugin uses.
	agent := client.New(c.AgentSocket())
	defer agent.Close()
	if _, err := agent.GetHealthz(ctx); err != nil {
		t.Fatalf("the agent's socket %s: %v", c.AgentSocket(), err)
	}

	demo, err := c.DeployDemo(ctx, 2*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	pool := netip.MustParsePrefix(DefaultPodCIDR)
	byName := map[string]DemoPod{}
	for _, d := range demo {
		byName[d.Name] = d
		if ip, err := netip.ParseAddr(d.IP); err != nil || !pool.Contains(ip) {
			t.Errorf("pod %s has IP %s, not in the pool %s", d.Name, d.IP, pool)
		}
		if d.EndpointID == 0 || d.Identity == 0 {
			t.Errorf("pod %s: endpoint %d, identity %d", d.Name, d.EndpointID, d.Identity)
		}
	}
	eps, err := agent.GetEndpoints(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// The pods' host veths: down must remove them.
	var veths []string
	for _, ep := range eps {
		if ep.Spec != nil && ep.Spec.InterfaceName != "" {
			veths = append(veths, ep.Spec.InterfaceName)
		}
	}
	if len(veths) < len(demo) {
		t.Fatalf("host veths %v for %d demo pods", veths, len(demo))
	}
	for _, d := range demo {
		found := false
		for _, ep := range eps {
			found = found || ep.Spec != nil && ep.Spec.K8sNamespace == DemoNamespace && ep.Spec.K8sPodName == d.Name && ep.ID == d.EndpointID
		}
		if !found {
			t.Errorf("the agent has no endpoint %d for pod %s", d.EndpointID, d.Name)
		}
	}

	// web-1 reaches web-2 through cellium (veths, host routes, the BPF
	// programs).
	pid := taskPID(t, c.Node, DemoNamespace, "web-1")
	netns, err := ns.GetNS(fmt.Sprintf("/proc/%d/ns/net", pid))
	if err != nil {
		t.Fatal(err)
	}
	defer netns.Close()
	eventually(t, 30*time.Second, "web-1 reaching web-2", func() error {
		body, err := httpGetIn(netns, byName["web-2"].IP+":8080")
		if err != nil {
			return err
		}
		if body != "hello from web-2\n" {
			return fmt.Errorf("answer %q", body)
		}
		return nil
	})
	// And through a ClusterIP: the socket load balancer translates it to
	// db-1, the Service db's one backend (the EndpointSlice comes from the
	// controller-manager, the agent reflects it).
	if byName["db-1"].ServiceIP == "" {
		t.Fatal("the demo has no ClusterIP for db")
	}
	eventually(t, 30*time.Second, "web-1 reaching db through its ClusterIP", func() error {
		body, err := httpGetIn(netns, byName["db-1"].ServiceIP+":8080")
		if err != nil {
			return err
		}
		if body != "hello from db-1\n" {
			return fmt.Errorf("answer %q", body)
		}
		return nil
	})
	_ = netns.Close()
	agent.Close()

	checkHostPorts(t, c)

	// A Deployment's pod: down must release it although its ReplicaSet
	// would recreate it.
	one := int32(1)
	labels := map[string]string{"app": "replicated"}
	_, err = cs.AppsV1().Deployments(DemoNamespace).Create(ctx, &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "replicated"},
		Spec: appsv1.DeploymentSpec{
			Replicas: &one,
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{
					Name: "app", Image: DemoImage, ImagePullPolicy: corev1.PullNever,
				}}},
			},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, time.Minute, "the Deployment's pod running", func() error {
		d, err := cs.AppsV1().Deployments(DemoNamespace).Get(ctx, "replicated", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if d.Status.ReadyReplicas != 1 {
			return fmt.Errorf("%d ready replicas", d.Status.ReadyReplicas)
		}
		return nil
	})

	// make down, from the state on disk.
	down = true
	began := time.Now()
	if err := Down(context.Background(), dir, logger); err != nil {
		t.Fatal(err)
	}
	t.Logf("down took %s", time.Since(began).Round(time.Millisecond))
	c.ReleaseHostNetworkLock()
	// The control plane's processes are gone; this closes its clients.
	if err := c.Control.Stop(); err != nil {
		t.Error(err)
	}
	if strings.Contains(logged.String(), "could not release") {
		t.Error("down did not release the pods' network through the agent (see its warning above)")
	}
	for _, v := range veths {
		if _, err := net.InterfaceByName(v); err == nil {
			t.Errorf("host veth %s of a pod left after down", v)
		}
	}
	if left := ClusterLeftovers(dir); len(left) > 0 {
		t.Fatalf("down left on the host:\n  %s", strings.Join(left, "\n  "))
	}
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// checkHostPorts runs two pods with the same hostPort on different hostIPs
// (127.0.0.1 and the node's address), as Kubernetes' HostPort conformance
// spec does, and reaches each from the host at its hostIP:hostPort
// (portmap chained after cellium-cni).
func checkHostPorts(t *testing.T, c *Cluster) {
	t.Helper()
	ctx := t.Context()
	cs := c.Control.Clientset()
	node, err := cs.CoreV1().Nodes().Get(ctx, c.Node.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var nodeIP string
	for _, a := range node.Status.Addresses {
		if a.Type == corev1.NodeInternalIP {
			nodeIP = a.Address
		}
	}
	port, err := devnode.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	host := hostNS(t)
	hostIPs := map[string]string{"hostport-local": "127.0.0.1", "hostport-node": nodeIP}
	for name, hostIP := range hostIPs {
		_, err := cs.CoreV1().Pods(DemoNamespace).Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{
				Name: "app", Image: DemoImage, ImagePullPolicy: corev1.PullNever,
				Ports: []corev1.ContainerPort{{ContainerPort: 8080, HostPort: int32(port), HostIP: hostIP, Protocol: corev1.ProtocolTCP}},
			}}},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
	}
	for name, hostIP := range hostIPs {
		eventually(t, 2*time.Minute, name+" Ready", func() error {
			p, err := cs.CoreV1().Pods(DemoNamespace).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if !podReady(p) {
				return fmt.Errorf("phase %s", p.Status.Phase)
			}
			return nil
		})
		addr := net.JoinHostPort(hostIP, fmt.Sprint(port))
		eventually(t, 30*time.Second, "the host reaching "+name+" at "+addr, func() error {
			body, err := httpGetIn(host, addr)
			if err != nil {
				return err
			}
			if body != "hello from "+name+"\n" {
				return fmt.Errorf("answer %q", body)
			}
			return nil
		})
	}
}

// hostNS is the test's own (the host's) network namespace.
func hostNS(t *testing.T) ns.NetNS {
	t.Helper()
	n, err := ns.GetCurrentNS()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Close() })
	return n
}
