package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"iter"
	"log/slog"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cilium/statedb"
	"github.com/vishvananda/netlink"
	"go.uber.org/goleak"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	"github.com/cellium/cellium/api/client/clientset/versioned"
	"github.com/cellium/cellium/api/v1/client"
	"github.com/cellium/cellium/api/v1/models"
	"github.com/cellium/cellium/datapath/healthep"
	"github.com/cellium/cellium/datapath/link"
	"github.com/cellium/cellium/datapath/routing"
	"github.com/cellium/cellium/statedb/routes"
	"github.com/cellium/cellium/test/devkubelet"
	"github.com/cellium/cellium/test/devkubelet/devnode"
	"github.com/cellium/cellium/test/harness"
	"github.com/cellium/cellium/test/privileged"
	"github.com/cellium/cellium/test/realnode"
)

// cluster is the API server (and etcd) every test's node runs against.
// No controller-manager: the garbage collection under test is cellium's.
// Its Service range is one nobody else on the machine uses (the socket
// load balancer's programs act on every socket of the machine: a
// ClusterIP of another cluster must not be translated or refused by them).
var cluster = harness.NewShared(harness.Options{ServiceClusterIPRange: serviceRange.String()})

// serviceRange is this process's Service range, 10.252.X.0/24.
var serviceRange = netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 252, byte(os.Getpid()%200) + 20, 0}), 24)

var (
	binOnce sync.Once
	binDir  string
	bins    devnode.Binaries
	binErr  error

	cliOnce sync.Once
	cliErr  error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if err := cluster.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		code = 1
	}
	if binDir != "" {
		_ = os.RemoveAll(binDir)
	}
	if code == 0 {
		if err := goleak.Find(goleak.IgnoreTopFunction("k8s.io/klog/v2.(*flushDaemon).run.func1")); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// binaries builds cellium-agent, cellium-operator and cellium-cni from
// this checkout, once per test run.
func binaries(t *testing.T) devnode.Binaries {
	t.Helper()
	binOnce.Do(func() {
		binDir, binErr = os.MkdirTemp("", "cellium-e2e-bin-")
		if binErr != nil {
			return
		}
		bins, binErr = devnode.BuildBinaries(context.Background(), binDir, devnode.Agent, devnode.Operator, devnode.CNIPlugin)
	})
	if binErr != nil {
		t.Fatal(binErr)
	}
	return bins
}

// cliBinary builds the cellium CLI (once) and returns its path.
func cliBinary(t *testing.T) string {
	t.Helper()
	b := binaries(t)
	cliOnce.Do(func() {
		_, cliErr = devnode.BuildBinaries(context.Background(), binDir, devnode.CLI)
	})
	if cliErr != nil {
		t.Fatal(cliErr)
	}
	return b.CLI
}

// cidrs hands each test's operator a pod address space of its own, so
// that leftovers of one test never meet the next one's addresses.
var cidrs atomic.Int32

// env is one test's node: an operator, a node with the agent and the
// devkubelet, and a namespace for the test's pods.
type env struct {
	t      *testing.T
	ctx    context.Context
	c      *harness.Cluster
	cs     kubernetes.Interface
	cilium versioned.Interface
	node   *devnode.Node
	op     *harness.Running
	ns     string
	dir    string
	agent  *client.Client
}

// envOptions tune a test's env.
type envOptions struct {
	operatorArgs []string
	agentArgs    []string
	// hostRouting and bpf turn on the agent's host routing and eBPF
	// datapath (devnode.NodeOptions).
	hostRouting, bpf bool
	// socketLB turns on the socket load balancer (with bpf).
	socketLB bool
}

// newEnv starts an operator, a node (agent and kubelet) and makes a
// namespace. Everything is stopped and removed when the test ends, on
// failure too; on failure the directory with the logs is kept and the
// last lines of each log are printed.
func newEnv(t *testing.T, o envOptions) *env {
	t.Helper()
	privileged.Require(t)
	c := cluster.Get(t)
	b := binaries(t)
	ctx := t.Context()
	// Short: the agent's socket lives in it.
	dir, err := os.MkdirTemp("", "ce2e-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			for _, f := range []string{"cellium-operator.log", "node/agent/cellium-agent.log", "node/kubelet.log"} {
				t.Logf("--- last lines of %s ---\n%s", f, tail(filepath.Join(dir, f), 40))
			}
			t.Logf("logs kept in %s", dir)
			return
		}
		_ = os.RemoveAll(dir)
	})

	// The operator and the agent run with their ServiceAccounts' tokens,
	// bound to the roles of install/kubernetes/cellium.yaml: a permission
	// missing from the chart fails the test.
	opKubeconfig, err := c.OperatorKubeconfig(ctx)
	if err != nil {
		t.Fatal(err)
	}
	agentKubeconfig, err := c.AgentKubeconfig(ctx)
	if err != nil {
		t.Fatal(err)
	}
	opCfg := devnode.OperatorConfig{
		Binary:                  b.Operator,
		Kubeconfig:              opKubeconfig,
		Dir:                     dir,
		ClusterPoolIPv4CIDR:     fmt.Sprintf("10.%d.0.0/16", 100+cidrs.Add(1)),
		ClusterPoolIPv4MaskSize: 24,
		Args:                    o.operatorArgs,
	}
	op, err := devnode.StartOperator(ctx, opCfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := op.Stop(15 * time.Second); err != nil {
			t.Errorf("stop operator: %v", err)
		}
	})

	if o.hostRouting {
		// One host-routing agent (or real node with kube-proxy: make up,
		// test/realnode) at a time on the machine, across test packages.
		unlock, err := harness.LockHostNetwork(ctx, func() {
			t.Log("waiting for another host-routing test or real node on this machine to finish")
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(unlock)
		// A detached make up holds no lock: wait for its cilium_host.
		if err := realnode.WaitHostFree(ctx, false, true, harness.TextLogger(testWriter{t})); err != nil {
			t.Fatal(err)
		}
		// Registered before the node's cleanup: runs once the agent is gone.
		restoreHostNetwork(t)
	}
	if err := os.MkdirAll(filepath.Join(dir, "node"), 0o755); err != nil {
		t.Fatal(err)
	}
	klog, err := os.Create(filepath.Join(dir, "node", "kubelet.log"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = klog.Close() })
	node, err := devnode.NewNode(agentKubeconfig, c.Clientset(), b, devnode.NodeOptions{
		Name:        "e2e-" + strings.ToLower(strings.ReplaceAll(t.Name(), "/", "-")),
		Dir:         filepath.Join(dir, "node"),
		AgentArgs:   o.agentArgs,
		HostRouting: o.hostRouting,
		BPF:         o.bpf,
		SocketLB:    o.socketLB,
		Logger:      slog.New(slog.NewTextHandler(klog, &slog.HandlerOptions{Level: slog.LevelDebug})),
	})
	if err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, ctx: ctx, c: c, cs: c.Clientset(), cilium: versioned.NewForConfigOrDie(c.RESTConfig()),
		node: node, op: op, dir: dir, agent: node.AgentClient()}
	t.Cleanup(func() {
		e.agent.Close()
		cctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if err := node.Cleanup(cctx); err != nil {
			t.Errorf("node cleanup: %v", err)
		}
		if err := e.cilium.CiliumV2().CiliumNodes().Delete(cctx, node.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("delete CiliumNode: %v", err)
		}
	})
	// The kubelet registers the Node the agent waits for.
	if err := node.StartKubelet(); err != nil {
		t.Fatal(err)
	}
	if err := node.StartAgent(ctx); err != nil {
		t.Fatal(err)
	}
	e.ns = c.TestNamespace(t)
	return e
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

// eventually polls cond until it returns nil, failing the test with the
// last error after timeout.
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

// pod returns a pod of the test's namespace on the test's node.
func (e *env) pod(name string, labels map[string]string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: e.ns, Labels: labels},
		Spec: corev1.PodSpec{
			NodeName:   e.node.Name,
			Containers: []corev1.Container{{Name: "app", Image: "registry.k8s.io/pause:3.10"}},
		},
	}
}

// createPods creates pods (name -> labels) and returns them by name.
func (e *env) createPods(pods map[string]map[string]string) map[string]*corev1.Pod {
	e.t.Helper()
	out := map[string]*corev1.Pod{}
	for name, labels := range pods {
		p, err := e.cs.CoreV1().Pods(e.ns).Create(e.ctx, e.pod(name, labels), metav1.CreateOptions{})
		if err != nil {
			e.t.Fatalf("create pod %s: %v", name, err)
		}
		out[name] = p
	}
	return out
}

// waitRunning waits until the pods run with an IP and returns them.
func (e *env) waitRunning(names []string, timeout time.Duration) map[string]*corev1.Pod {
	e.t.Helper()
	out := map[string]*corev1.Pod{}
	eventually(e.t, timeout, fmt.Sprintf("%d pods Running", len(names)), func() error {
		list, err := e.cs.CoreV1().Pods(e.ns).List(e.ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		got := map[string]*corev1.Pod{}
		for i := range list.Items {
			got[list.Items[i].Name] = &list.Items[i]
		}
		var waiting []string
		for _, n := range names {
			p := got[n]
			if p == nil || p.Status.Phase != corev1.PodRunning || p.Status.PodIP == "" {
				waiting = append(waiting, n)
				continue
			}
			out[n] = p
		}
		if len(waiting) > 0 {
			return fmt.Errorf("not running: %v", waiting)
		}
		return nil
	})
	return out
}

// ceps returns the CiliumEndpoints of the test's namespace by name.
func (e *env) ceps() (map[string]*ciliumv2.CiliumEndpoint, error) {
	list, err := e.cilium.CiliumV2().CiliumEndpoints(e.ns).List(e.ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	out := map[string]*ciliumv2.CiliumEndpoint{}
	for i := range list.Items {
		out[list.Items[i].Name] = &list.Items[i]
	}
	return out, nil
}

// checkCEP returns why cep does not describe pod as ready on this node,
// or nil.
func (e *env) checkCEP(cep *ciliumv2.CiliumEndpoint, pod *corev1.Pod) error {
	if cep == nil {
		return fmt.Errorf("no CiliumEndpoint for pod %s", pod.Name)
	}
	st := cep.Status
	switch {
	case st.State != ciliumv2.EndpointStateReady:
		return fmt.Errorf("CEP %s state %q", cep.Name, st.State)
	case st.Networking == nil || len(st.Networking.Addressing) == 0 || st.Networking.Addressing[0] == nil:
		return fmt.Errorf("CEP %s has no addressing", cep.Name)
	case st.Networking.Addressing[0].IPV4 != pod.Status.PodIP:
		return fmt.Errorf("CEP %s IPv4 %s, pod IP %s", cep.Name, st.Networking.Addressing[0].IPV4, pod.Status.PodIP)
	case st.Networking.NodeIP != e.node.IP.String():
		return fmt.Errorf("CEP %s node %q, want %s", cep.Name, st.Networking.NodeIP, e.node.IP)
	case st.Identity == nil || st.Identity.ID == 0:
		return fmt.Errorf("CEP %s has no identity", cep.Name)
	case st.ID == 0:
		return fmt.Errorf("CEP %s has no endpoint ID", cep.Name)
	}
	owned := false
	for _, ref := range cep.OwnerReferences {
		owned = owned || ref.Kind == "Pod" && ref.Name == pod.Name && ref.UID == pod.UID
	}
	if !owned {
		return fmt.Errorf("CEP %s is not owned by pod %s (%s): %v", cep.Name, pod.Name, pod.UID, cep.OwnerReferences)
	}
	return nil
}

// waitCEPs waits until every pod has its ready CEP and returns them.
func (e *env) waitCEPs(pods map[string]*corev1.Pod, timeout time.Duration) map[string]*ciliumv2.CiliumEndpoint {
	e.t.Helper()
	var ceps map[string]*ciliumv2.CiliumEndpoint
	eventually(e.t, timeout, fmt.Sprintf("%d ready CiliumEndpoints", len(pods)), func() error {
		var err error
		if ceps, err = e.ceps(); err != nil {
			return err
		}
		for _, p := range pods {
			if err := e.checkCEP(ceps[p.Name], p); err != nil {
				return err
			}
		}
		return nil
	})
	return ceps
}

// endpoints returns the agent's endpoints of the test's namespace by pod
// name.
func (e *env) endpoints() (map[string]models.Endpoint, error) {
	eps, err := e.agent.GetEndpoints(e.ctx)
	if err != nil {
		return nil, err
	}
	out := map[string]models.Endpoint{}
	for _, ep := range eps {
		if ep.Spec != nil && ep.Spec.K8sNamespace == e.ns {
			out[ep.Spec.K8sPodName] = ep
		}
	}
	return out, nil
}

// allocations returns the agent's IP allocations of the test's
// namespace's pods, by IP.
func (e *env) allocations() (map[string]string, error) {
	var list []models.IPAMAddress
	if err := e.agent.Do(e.ctx, http.MethodGet, "/v1/ipam", nil, &list); err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, a := range list {
		if strings.HasPrefix(a.Owner, e.ns+"/") {
			out[a.IP] = a.Owner
		}
	}
	return out, nil
}

// sandboxes returns the kubelet's sandboxes of the test's namespace by
// pod name.
func (e *env) sandboxes() map[string]devkubelet.Sandbox {
	out := map[string]devkubelet.Sandbox{}
	sbs, err := devkubelet.LoadSandboxes(e.node.KubeletStateDir())
	if err != nil {
		e.t.Fatal(err)
	}
	for _, sb := range sbs {
		if sb.Namespace == e.ns {
			out[sb.Name] = sb
		}
	}
	return out
}

// linkExists reports whether a host link exists, and its ifindex.
func linkExists(name string) (int, bool) {
	l, err := netlink.LinkByName(name)
	if err != nil {
		return 0, false
	}
	return l.Attrs().Index, true
}

// deletePods deletes pods; grace nil is the default (graceful, the
// kubelet confirms), 0 deletes at once.
func (e *env) deletePods(names []string, grace *int64) {
	e.t.Helper()
	for _, n := range names {
		err := e.cs.CoreV1().Pods(e.ns).Delete(e.ctx, n, metav1.DeleteOptions{GracePeriodSeconds: grace})
		if err != nil && !apierrors.IsNotFound(err) {
			e.t.Fatalf("delete pod %s: %v", n, err)
		}
	}
}

// waitGone waits until nothing of the pods is left: pod objects, CEPs,
// agent endpoints, IP allocations, sandboxes, their netns and host veths.
func (e *env) waitGone(names []string, sbs map[string]devkubelet.Sandbox, timeout time.Duration) {
	e.t.Helper()
	eventually(e.t, timeout, fmt.Sprintf("%d pods gone without a trace", len(names)), func() error {
		ceps, err := e.ceps()
		if err != nil {
			return err
		}
		eps, err := e.endpoints()
		if err != nil {
			return err
		}
		allocs, err := e.allocations()
		if err != nil {
			return err
		}
		now := e.sandboxes()
		for _, n := range names {
			if _, err := e.cs.CoreV1().Pods(e.ns).Get(e.ctx, n, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
				return fmt.Errorf("pod %s still exists (%v)", n, err)
			}
			if ceps[n] != nil {
				return fmt.Errorf("CEP %s still exists", n)
			}
			if ep, ok := eps[n]; ok {
				return fmt.Errorf("endpoint %d of %s still exists", ep.ID, n)
			}
			if _, ok := now[n]; ok {
				return fmt.Errorf("sandbox of %s still exists", n)
			}
			sb, ok := sbs[n]
			if !ok {
				continue
			}
			if owner, ok := allocs[sb.IP]; ok {
				return fmt.Errorf("IP %s of %s still allocated (to %s)", sb.IP, n, owner)
			}
			if _, err := os.Stat(sb.NetnsPath); !os.IsNotExist(err) {
				return fmt.Errorf("netns %s of %s still exists", sb.NetnsName(), n)
			}
			for _, l := range sb.HostInterfaces {
				if _, ok := linkExists(l); ok {
					return fmt.Errorf("veth %s of %s still exists", l, n)
				}
			}
		}
		return nil
	})
}

// jsonEqual compares two values by their JSON encodings, as generic
// JSON (key order and number formatting do not matter).
func jsonEqual(a, b any) (bool, string, string) {
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	var ga, gb any
	_ = json.Unmarshal(ja, &ga)
	_ = json.Unmarshal(jb, &gb)
	na, _ := json.Marshal(ga) // map keys sorted
	nb, _ := json.Marshal(gb)
	return string(na) == string(nb), string(na), string(nb)
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// metavOpts are the options of every Get.
var metavOpts = metav1.GetOptions{}

// hostSysctls are the settings of this machine's namespace the agent
// changes with host routing.
var hostSysctls = []string{"net/ipv4/ip_forward", "net/ipv4/conf/all/rp_filter"}

// restoreHostNetwork saves hostSysctls now and, when the test ends, undoes
// what the agent's host routing leaves in this machine's namespace after
// it stopped (as an agent leaves it for its next run): cilium_host and
// cilium_net, the routes it owns, its nftables table, the health
// endpoint's namespace and veth; then writes the sysctls back.
func restoreHostNetwork(t *testing.T) {
	t.Helper()
	saved := map[string][]byte{}
	for _, p := range hostSysctls {
		v, err := os.ReadFile(filepath.Join("/proc/sys", p))
		if err != nil {
			t.Fatal(err)
		}
		saved[p] = v
	}
	t.Cleanup(func() {
		none := iter.Seq2[*routes.Device, statedb.Revision](func(func(*routes.Device, statedb.Revision) bool) {})
		noRoutes := iter.Seq2[*routes.Route, statedb.Revision](func(func(*routes.Route, statedb.Revision) bool) {})
		names := healthep.Names{}.WithDefaults()
		errs := []error{
			healthep.Remove(context.Background(), link.Host{}, names.NetnsPath(), names.HostIfName),
			routing.DeviceOps{}.Prune(context.Background(), nil, none),
			routing.RemoveNFTable(routing.Netns{}),
			routing.RouteOps{}.Prune(context.Background(), nil, noRoutes),
		}
		for p, v := range saved {
			errs = append(errs, os.WriteFile(filepath.Join("/proc/sys", p), v, 0))
		}
		if err := errors.Join(errs...); err != nil {
			t.Errorf("undo host routing: %v", err)
		}
	})
}

// testWriter writes a logger's lines into the test's log.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Helper()
	w.t.Log(strings.TrimSuffix(string(p), "\n"))
	return len(p), nil
}
