package realnode

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	"github.com/cellium/cellium/api/client/clientset/versioned"
	"github.com/cellium/cellium/api/v1/client"
	"github.com/cellium/cellium/test/devkubelet/devnode"
	"github.com/cellium/cellium/test/harness"
	"github.com/cellium/cellium/test/privileged"
)

// coldNodeBuild is what a test needs left on its clock to build the node
// binaries from scratch on 2 busy cores.
const coldNodeBuild = 30 * time.Minute

// realNodeEnv set to 1 (by `make test-realnode`) builds missing node
// binaries instead of skipping.
const realNodeEnv = "CELLIUM_REAL_NODE"

// nodeBinaries returns the cached node binaries. When they are not cached,
// the test skips saying how to build them, unless
// CELLIUM_REQUIRE_PRIVILEGED=1 (CI), where it builds them.
func nodeBinaries(t *testing.T) harness.NodeBinaries {
	t.Helper()
	bins, missing, err := harness.CachedNodeBinaries()
	if err != nil {
		t.Fatal(err)
	}
	if len(missing) == 0 {
		return bins
	}
	if os.Getenv(realNodeEnv) != "1" {
		// Not a privilege skip: the real node has its own target, so
		// that a cold `make test` stays short; CI runs both.
		t.Skipf("real node skipped: %s not built or installed yet; run `make test-realnode` (builds them, ~15 minutes cold), "+
			"or `make node-binaries` once", strings.Join(missing, ", "))
	}
	if bins.Runc == "" {
		t.Fatal("runc is not installed: run make deps (Debian: apt-get install runc)")
	}
	if deadline, ok := t.Deadline(); ok && time.Until(deadline) < coldNodeBuild {
		t.Fatalf("%s not built yet: building them takes up to %s, more than this test's deadline allows (%s left); "+
			"run `make node-binaries` first, or go test with -timeout 45m", strings.Join(missing, ", "), coldNodeBuild, time.Until(deadline).Round(time.Second))
	}
	bins, err = harness.EnsureNodeBinaries(t.Context(), slog.New(slog.NewTextHandler(t.Output(), nil)))
	if err != nil {
		t.Fatal(err)
	}
	return bins
}

// eventually polls cond every 100ms until it returns nil, failing the test
// with its last error after timeout.
func eventually(t *testing.T, timeout time.Duration, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s: %v", timeout, what, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// nodeEnv is a test's cluster and real node.
type nodeEnv struct {
	c    *harness.Cluster
	node *Node
	// stopped is set once the test has stopped the node itself.
	stopped bool
}

// startNode starts a cluster (with the Node authorizer and the
// controller-manager), an operator with podPool, and a real node with the
// pause, demo and cellium images, all stopped when the test ends; on
// failure the logs are kept and their last lines printed.
func startNode(t *testing.T) *nodeEnv {
	t.Helper()
	privileged.Require(t)
	bins := nodeBinaries(t)
	ctx := t.Context()
	logger := slog.New(slog.NewTextHandler(t.Output(), nil))

	// The kubelet authenticates as system:node:<ip> and is authorised by
	// the Node authorizer; the API server reaches it by its InternalIP.
	c := harness.ForTest(t, harness.Options{
		ControllerManager: true,
		NodeAuthorizer:    true,
		APIServerArgs:     []string{"--kubelet-preferred-address-types=InternalIP"},
	})
	dir, err := os.MkdirTemp("", "crn-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("real node logs kept in %s", dir)
			return
		}
		_ = os.RemoveAll(dir)
	})
	cellium, err := devnode.BuildBinaries(ctx, filepath.Join(dir, "bin"), devnode.Agent, devnode.Operator, devnode.CNIPlugin)
	if err != nil {
		t.Fatal(err)
	}
	var images []string
	for _, spec := range []ImageSpec{PauseSpec, DemoSpec, CelliumSpec} {
		img, err := BuildImage(ctx, filepath.Join(dir, "images"), spec)
		if err != nil {
			t.Fatal(err)
		}
		images = append(images, img)
	}

	// Nothing sent to the pods' addresses leaves the machine: the host
	// has no route to them (the agent runs without endpoint routes).
	for _, p := range []string{podPool, "10.254.0.0/16"} {
		remove, err := Blackhole(netip.MustParsePrefix(p))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := remove(); err != nil {
				t.Error(err)
			}
		})
	}

	opKubeconfig, err := c.OperatorKubeconfig(ctx)
	if err != nil {
		t.Fatal(err)
	}
	agentKubeconfig, err := c.AgentKubeconfig(ctx)
	if err != nil {
		t.Fatal(err)
	}
	op, err := devnode.StartOperator(ctx, devnode.OperatorConfig{
		Binary:                  cellium.Operator,
		Kubeconfig:              opKubeconfig,
		Dir:                     dir,
		ClusterPoolIPv4CIDR:     podPool,
		ClusterPoolIPv4MaskSize: 24,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = op.Stop(15 * time.Second) })

	node, err := Start(ctx, Options{
		Cluster:         c,
		Binaries:        bins,
		Agent:           cellium.Agent,
		CNIPlugin:       cellium.CNIPlugin,
		AgentKubeconfig: agentKubeconfig,
		Dir:             filepath.Join(dir, "node"),
		Images:          images,
		Scheduler:       true,
		KubeProxy:       true,
		ClusterCIDR:     podPool,
		Logger:          logger,
	})
	if err != nil {
		t.Fatal(err)
	}
	e := &nodeEnv{c: c, node: node}
	t.Cleanup(func() {
		if e.stopped {
			return
		}
		if err := node.Stop(context.Background()); err != nil {
			t.Errorf("stop node: %v", err)
		}
	})
	t.Cleanup(func() {
		if t.Failed() {
			for _, name := range []string{Containerd, Kubelet, KubeScheduler, devnode.Agent} {
				t.Logf("--- last lines of %s ---\n%s", name, tail(node.LogFile(name), 25))
			}
		}
	})

	return e
}

// TestPrivilegedRealNodeSmoke runs a pod through a real node: the scheduler
// binds it to the node; the kubelet runs it through containerd's CRI and
// runc, its sandbox from the locally packed pause image and its app from
// the locally packed demo image (imported with ctr, like the cellium
// image, nothing pulled);
// containerd's CNI ADD reaches cellium-cni and the agent, which give the
// pod its IP from the operator's pool, an endpoint and a ready
// CiliumEndpoint. The app answers on the pod's IP inside the pod's network
// namespace, and its log reaches a client through the API server and the
// kubelet; kube-proxy in nftables mode programs a Service of it.
// Deleting the pod removes the endpoint, the CEP and the host veth (CNI
// DEL). Stopping the node with a second pod still running
// releases that one too (no CNI result left) and leaves nothing on the
// host (kube-proxy's tables included); the kubelet's sysctls are back.
func TestPrivilegedRealNodeSmoke(t *testing.T) {
	privileged.Require(t)
	e := startNode(t)
	c, node, ctx := e.c, e.node, t.Context()
	// The images are in containerd's CRI namespace under their names.
	listed, err := node.Ctr(ctx, "images", "ls", "--quiet")
	if err != nil {
		t.Fatal(err)
	}
	for _, img := range []string{SandboxImage, DemoImage, CelliumImage} {
		if !slices.Contains(strings.Fields(string(listed)), img) {
			t.Errorf("image %s not imported; containerd has:\n%s", img, listed)
		}
	}

	cs := c.Clientset()
	cilium := versioned.NewForConfigOrDie(c.RESTConfig())
	agent := client.New(node.AgentConfig().SocketPath())
	defer agent.Close()
	namespace := c.TestNamespace(t)

	// "demo" is checked, then deleted; "stays" is still running when the
	// node stops, whose drain must release it too.
	never := corev1.PullNever
	for _, name := range []string{"demo", "stays"} {
		_, err := cs.CoreV1().Pods(namespace).Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"app": name}},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{
				Name: "app", Image: DemoImage, ImagePullPolicy: never,
				Ports: []corev1.ContainerPort{{ContainerPort: 8080}},
			}}},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
	}
	var pod *corev1.Pod
	eventually(t, 2*time.Minute, "the pods Running with IPs", func() error {
		for _, name := range []string{"stays", "demo"} {
			pod, err = cs.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if pod.Status.Phase != corev1.PodRunning || pod.Status.PodIP == "" {
				return fmt.Errorf("pod %s: phase %s, IP %q, conditions %v", name, pod.Status.Phase, pod.Status.PodIP, pod.Status.Conditions)
			}
		}
		return nil
	})
	if pod.Spec.NodeName != node.Name {
		t.Fatalf("pod scheduled to %q, want the real node %s", pod.Spec.NodeName, node.Name)
	}
	if !netip.MustParsePrefix(podPool).Contains(netip.MustParseAddr(pod.Status.PodIP)) {
		t.Errorf("pod IP %s is not from the operator's pool %s", pod.Status.PodIP, podPool)
	}

	var cep *ciliumv2.CiliumEndpoint
	eventually(t, time.Minute, "a ready CiliumEndpoint of the pod", func() error {
		cep, err = cilium.CiliumV2().CiliumEndpoints(namespace).Get(ctx, "demo", metav1.GetOptions{})
		if err != nil {
			return err
		}
		st := cep.Status
		switch {
		case st.State != ciliumv2.EndpointStateReady:
			return fmt.Errorf("CEP state %q", st.State)
		case st.Networking == nil || len(st.Networking.Addressing) == 0 || st.Networking.Addressing[0] == nil:
			return fmt.Errorf("CEP has no addressing")
		case st.Networking.Addressing[0].IPV4 != pod.Status.PodIP:
			return fmt.Errorf("CEP IPv4 %s, pod IP %s", st.Networking.Addressing[0].IPV4, pod.Status.PodIP)
		case st.Networking.NodeIP != node.IP.String():
			return fmt.Errorf("CEP node IP %q, want %s", st.Networking.NodeIP, node.IP)
		case st.Identity == nil || st.Identity.ID == 0:
			return fmt.Errorf("CEP has no identity")
		}
		return nil
	})

	// The agent's endpoint is the sandbox containerd made, with its veth.
	eps, err := agent.GetEndpoints(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var hostVeth, sandboxID string
	for _, ep := range eps {
		if ep.Spec != nil && ep.Spec.K8sNamespace == namespace && ep.Spec.K8sPodName == "demo" {
			hostVeth, sandboxID = ep.Spec.InterfaceName, ep.Spec.ContainerID
			if ep.ID != cep.Status.ID {
				t.Errorf("endpoint ID %d, CEP says %d", ep.ID, cep.Status.ID)
			}
		}
	}
	if hostVeth == "" {
		t.Fatalf("no agent endpoint for the pod among %d", len(eps))
	}
	if _, err := netlink.LinkByName(hostVeth); err != nil {
		t.Errorf("host veth %s of the endpoint: %v", hostVeth, err)
	}
	out, err := node.Ctr(ctx, "containers", "ls")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(out), sandboxID) || !strings.Contains(string(out), SandboxImage) || !strings.Contains(string(out), DemoImage) {
		t.Errorf("containerd's containers lack the sandbox %s of %s or the app of %s:\n%s", sandboxID, SandboxImage, DemoImage, out)
	}

	// The app runs in the pod's network namespace and answers on the
	// pod's IP there.
	pid := taskPID(t, node, namespace, "demo")
	netns, err := ns.GetNS(fmt.Sprintf("/proc/%d/ns/net", pid))
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "the demo app answering on the pod IP", func() error {
		body, err := httpGetIn(netns, pod.Status.PodIP+":8080")
		if err != nil {
			return err
		}
		if body != "hello from demo\n" {
			return fmt.Errorf("answer %q", body)
		}
		return nil
	})
	_ = netns.Close()

	// The API server reaches the kubelet by the node's IP, with a
	// certificate the kubelet trusts: the pod's log through the API.
	eventually(t, 30*time.Second, "the app's log through the API server", func() error {
		b, err := cs.CoreV1().Pods(namespace).GetLogs("demo", &corev1.PodLogOptions{}).DoRaw(ctx)
		if err != nil {
			return err
		}
		if !strings.Contains(string(b), "demoapp demo serving HTTP on :8080") {
			return fmt.Errorf("log %q", b)
		}
		return nil
	})

	// kube-proxy (nftables mode) programs a Service of the app with the
	// pod as its endpoint.
	svc, err := cs.CoreV1().Services(namespace).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "demo"},
		Spec: corev1.ServiceSpec{
			Selector: map[string]string{"app": "demo"},
			Ports:    []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromInt32(8080)}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, time.Minute, "kube-proxy's nftables rules for the Service", func() error {
		out, err := NFT(ctx, "list", "table", "ip", "kube-proxy")
		if err != nil {
			return err
		}
		for _, want := range []string{svc.Spec.ClusterIP, pod.Status.PodIP} {
			if !strings.Contains(string(out), want) {
				return fmt.Errorf("table ip kube-proxy lacks %s", want)
			}
		}
		return nil
	})

	// Deleting the pod: the kubelet stops the sandbox (CNI DEL) and the
	// endpoint, its CEP and its veth go.
	if err := cs.CoreV1().Pods(namespace).Delete(ctx, "demo", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 90*time.Second, "the pod, its CEP, endpoint and veth gone", func() error {
		if _, err := cs.CoreV1().Pods(namespace).Get(ctx, "demo", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			return fmt.Errorf("pod still there (%v)", err)
		}
		if _, err := cilium.CiliumV2().CiliumEndpoints(namespace).Get(ctx, "demo", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			return fmt.Errorf("CEP still there (%v)", err)
		}
		eps, err := agent.GetEndpoints(ctx)
		if err != nil {
			return err
		}
		for _, ep := range eps {
			if ep.Spec != nil && ep.Spec.K8sNamespace == namespace && ep.Spec.K8sPodName == "demo" {
				return fmt.Errorf("endpoint %d of demo still there", ep.ID)
			}
		}
		if _, err := netlink.LinkByName(hostVeth); err == nil {
			return fmt.Errorf("veth %s still there", hostVeth)
		}
		return nil
	})

	e.stopped = true
	if err := node.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	if left := node.Leftovers(); len(left) > 0 {
		t.Errorf("the node left on the host:\n%s", strings.Join(left, "\n"))
	}
}

// podPool is the operator's pod address space in the smoke test.
const podPool = "10.231.0.0/16"

// httpGetIn sends GET / to addr from inside netns and returns the body.
// The connection is made on the calling thread, which Do has moved into
// netns (an http.Client would dial on another goroutine, in the host's
// namespace).
func httpGetIn(netns ns.NetNS, addr string) (string, error) {
	return httpGetPathIn(netns, addr, "/")
}

// httpGetPathIn is httpGetIn for path.
func httpGetPathIn(netns ns.NetNS, addr, path string) (string, error) {
	var body string
	err := netns.Do(func(ns.NetNS) error {
		d := net.Dialer{Timeout: 2 * time.Second}
		conn, err := d.Dial("tcp", addr)
		if err != nil {
			return err
		}
		defer conn.Close()
		_ = conn.SetDeadline(time.Now().Add(2 * time.Second))
		if _, err := io.WriteString(conn, "GET "+path+" HTTP/1.0\r\nHost: demo\r\n\r\n"); err != nil {
			return err
		}
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("status %s", resp.Status)
		}
		body = string(b)
		return err
	})
	return body, err
}

// taskPID returns the host PID of the running task of the app container
// of pod namespace/name (containerd's CRI labels containers with their pod
// and name).
func taskPID(t *testing.T, node *Node, namespace, name string) int {
	t.Helper()
	return containerPID(t, node, namespace, name, "app")
}

// containerPID returns the host PID of the running task of container
// of pod namespace/name.
func containerPID(t *testing.T, node *Node, namespace, name, container string) int {
	t.Helper()
	out, err := node.Ctr(t.Context(), "containers", "ls", "--quiet",
		`labels."io.kubernetes.container.name"==`+container+`,labels."io.kubernetes.pod.name"==`+name+
			`,labels."io.kubernetes.pod.namespace"==`+namespace)
	if err != nil {
		t.Fatal(err)
	}
	// A restarted container leaves its exited predecessor: the running
	// task is the one.
	ids := strings.Fields(string(out))
	if len(ids) == 0 {
		t.Fatalf("no container %s of pod %s/%s", container, namespace, name)
	}
	tasks, err := node.Ctr(t.Context(), "tasks", "ls")
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(tasks)) {
		f := strings.Fields(line)
		if len(f) == 3 && slices.Contains(ids, f[0]) && f[2] == "RUNNING" {
			pid, err := strconv.Atoi(f[1])
			if err != nil {
				t.Fatal(err)
			}
			return pid
		}
	}
	t.Fatalf("no running task of containers %v:\n%s", ids, tasks)
	return 0
}

// tail returns the last n lines of a file.
func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// TestPrivilegedRealNodeRecover: a node whose processes all die at once
// (SIGKILL, as when the test binary is killed) with a pod running is
// cleaned up by Recover from the state Start recorded: the pod's processes
// and containerd's shims are killed, and nothing is left on the host.
func TestPrivilegedRealNodeRecover(t *testing.T) {
	privileged.Require(t)
	e := startNode(t)
	c, node, ctx := e.c, e.node, t.Context()
	namespace := c.TestNamespace(t)
	never := corev1.PullNever
	_, err := c.Clientset().CoreV1().Pods(namespace).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "orphan"},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{
			Name: "app", Image: DemoImage, ImagePullPolicy: never,
		}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, 2*time.Minute, "the pod Running", func() error {
		p, err := c.Clientset().CoreV1().Pods(namespace).Get(ctx, "orphan", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if p.Status.Phase != corev1.PodRunning {
			return fmt.Errorf("phase %s", p.Status.Phase)
		}
		return nil
	})
	appPID := taskPID(t, node, namespace, "orphan")

	// Everything the node started dies; the shims and the containers
	// survive, as they would.
	for _, r := range node.procs {
		if err := r.Kill(); err != nil {
			t.Fatal(err)
		}
	}
	e.stopped = true
	if shims := shimsOf(node.ContainerdSocket()); len(shims) == 0 {
		t.Fatal("no shim survived its containerd: the test proves nothing")
	}
	if err := Recover(node.Dir, slog.New(slog.NewTextHandler(t.Output(), nil))); err != nil {
		t.Fatal(err)
	}
	if left := node.Leftovers(); len(left) > 0 {
		t.Errorf("left after Recover:\n%s", strings.Join(left, "\n"))
	}
	if shims := shimsOf(node.ContainerdSocket()); len(shims) > 0 {
		t.Errorf("shims still running: %v", shims)
	}
	if running(appPID) {
		t.Errorf("the app (pid %d) still runs", appPID)
	}
	// Recover twice is harmless.
	if err := Recover(node.Dir, nil); err != nil {
		t.Errorf("second Recover: %v", err)
	}
}

// running reports whether pid exists and is not a zombie (killed, its
// parent gone, not reaped yet by init).
func running(pid int) bool {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	i := strings.LastIndexByte(string(stat), ')')
	return i < 0 || len(stat) <= i+2 || stat[i+2] != 'Z'
}

// shimsOf lists the PIDs of the shims serving a containerd socket.
func shimsOf(socket string) []int {
	var out []int
	procs, _ := os.ReadDir("/proc")
	for _, p := range procs {
		pid, err := strconv.Atoi(p.Name())
		if err != nil {
			continue
		}
		b, _ := os.ReadFile(filepath.Join("/proc", p.Name(), "cmdline"))
		args := strings.Split(string(b), "\x00")
		if len(args) > 0 && filepath.Base(args[0]) == "containerd-shim-runc-v2" && slices.Contains(args, socket) && running(pid) {
			out = append(out, pid)
		}
	}
	return out
}
