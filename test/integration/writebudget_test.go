package integration

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextclientset "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	"github.com/cellium/cellium/api/client/clientset/versioned"
	"github.com/cellium/cellium/api/crds"
	"github.com/cellium/cellium/api/v1/client"
	"github.com/cellium/cellium/api/v1/models"
	"github.com/cellium/cellium/cells/crdregister"
	"github.com/cellium/cellium/install"
	"github.com/cellium/cellium/test/harness"
)

// writeAuditPolicy logs, at Metadata level, the writes to the objects
// whose cost per pod the write budget counts; nothing else.
const writeAuditPolicy = `apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
- level: Metadata
  verbs: ["create", "update", "patch", "delete", "deletecollection"]
  resources:
  - group: cilium.io
    resources: ["ciliumendpoints", "ciliumendpoints/status", "ciliumendpointslices",
      "ciliumidentities", "ciliumnodes", "ciliumnodes/status"]
- level: None
`

// The aims of issue 19 (Documentation/operations/api-write-budget.md).
const (
	// maxCEPWritesPerLife: one CiliumEndpoint write (its create) per pod
	// life whose identity exists already (Cilium: 3, cilium#15153).
	maxCEPWritesPerLife = 1.0
	// maxCESWritesPerPod: slice writes per pod when 100 pods churn in a
	// burst.
	maxCESWritesPerPod = 0.1
)

// budgetResources are the counted resources, in the order printed.
var budgetResources = []string{"ciliumendpoints", "ciliumendpointslices", "ciliumidentities", "ciliumnodes"}

// TestWriteBudget counts, from the real API server's audit log, the
// writes cellium's ServiceAccounts make per pod life (pod created,
// endpoint made by the CNI path, pod status set, pod deleted gracefully,
// endpoint deleted by the CNI path, pod removed) for CiliumEndpoints,
// CiliumEndpointSlices, CiliumIdentities and CiliumNodes, with the
// controller-manager's garbage collector running as in a real cluster.
// It asserts the aims: at most 1 CiliumEndpoint write per pod life in
// steady state (the identity exists), in either mode, and at most 0.1
// slice writes per pod when 100 pods are created and deleted in a burst.
func TestWriteBudget(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a cluster of its own")
	}
	c := harness.ForTest(t, harness.Options{ControllerManager: true, AuditPolicy: writeAuditPolicy,
		// The CRDs before the controller-manager: its garbage collector
		// knows CiliumEndpoints from its start, as in a cluster where
		// cellium is installed (else only after its 30 s resync, and the
		// agent deletes the first pods' CiliumEndpoints itself).
		BeforeControllerManager: registerCRDs})
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	opKube, err := c.OperatorKubeconfig(ctx)
	if err != nil {
		t.Fatal(err)
	}
	agentKube, err := c.AgentKubeconfig(ctx)
	if err != nil {
		t.Fatal(err)
	}
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-budget"},
		Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "192.0.2.30"}}}}
	if _, err := c.Clientset().CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var summary []string
	for _, mode := range []struct {
		name   string
		slices bool
	}{{"cep", false}, {"ces", true}} {
		t.Run(mode.name, func(t *testing.T) {
			b := startBudgetRun(t, c, opKube, agentKube, node.Name, mode.slices)
			// The first pod's labels need a new identity: not steady state.
			mark := b.mark(t)
			b.life(t, "warmup")
			b.settle(t)
			first := b.countSince(t, mark)
			t.Logf("first pod, a new identity: %s", first.perPod(1))
			summary = append(summary, fmt.Sprintf("%s mode, first pod (new identity): %s", mode.name, first.perPod(1)))

			const lives = 5
			mark = b.mark(t)
			for i := range lives {
				b.life(t, fmt.Sprintf("steady-%d", i))
			}
			b.settle(t)
			steady := b.countSince(t, mark)
			t.Logf("steady state, %d pod lives one after another: %s", lives, steady.perPod(lives))
			summary = append(summary, fmt.Sprintf("%s mode, steady (%d lives): %s", mode.name, lives, steady.perPod(lives)))
			if got := steady.agentAndOperator("ciliumendpoints") / lives; got > maxCEPWritesPerLife {
				t.Errorf("%.2f CiliumEndpoint writes per pod life in steady state, want at most %.0f (%s)", got, maxCEPWritesPerLife, steady.detail())
			}
			if !mode.slices {
				return
			}

			const burst = 100
			mark = b.mark(t)
			b.burst(t, burst)
			b.settle(t)
			churn := b.countSince(t, mark)
			t.Logf("burst of %d pods created, then deleted: %s", burst, churn.perPod(burst))
			summary = append(summary, fmt.Sprintf("%s mode, burst of %d: %s", mode.name, burst, churn.perPod(burst)))
			if got := churn.agentAndOperator("ciliumendpointslices") / burst; got > maxCESWritesPerPod {
				t.Errorf("%.2f CiliumEndpointSlice writes per pod in a burst of %d, want at most %.1f (%s)", got, burst, maxCESWritesPerPod, churn.detail())
			}
			if got := churn.agentAndOperator("ciliumendpoints") / burst; got > maxCEPWritesPerLife {
				t.Errorf("%.2f CiliumEndpoint writes per pod life in the burst, want at most %.0f (%s)", got, maxCEPWritesPerLife, churn.detail())
			}
		})
	}
	for _, s := range summary {
		t.Logf("write budget: %s", s)
	}
}

// registerCRDs registers cellium's CRDs as the operator does.
func registerCRDs(ctx context.Context, c *harness.Cluster) error {
	all, err := crds.All()
	if err != nil {
		return err
	}
	apiext := apiextclientset.NewForConfigOrDie(c.RESTConfig())
	return crdregister.Register(ctx, apiext.ApiextensionsV1().CustomResourceDefinitions(), all, slog.New(slog.DiscardHandler))
}

// budgetRun is one operator and one agent (binaries, with their
// ServiceAccounts' credentials) and the pods it drives.
type budgetRun struct {
	c      *harness.Cluster
	ns     string
	node   string
	api    *client.Client
	admin  versioned.Interface
	slices bool
}

func startBudgetRun(t *testing.T, c *harness.Cluster, opKube, agentKube, node string, sliceMode bool) *budgetRun {
	ns := c.TestNamespace(t)
	sl := fmt.Sprintf("--enable-cilium-endpoint-slice=%t", sliceMode)
	op := startDaemon(t, "cellium-operator", nil, "--k8s-kubeconfig-path="+opKube,
		"--operator-api-serve-addr="+freeAddr(t), "--leader-election-namespace="+install.Namespace, sl)
	socket := filepath.Join(t.TempDir(), "a.sock")
	agent := startDaemon(t, "cellium-agent", []string{"K8S_NODE_NAME=" + node}, "--k8s-kubeconfig-path="+agentKube,
		"--socket-path="+socket, "--prometheus-serve-addr="+freeAddr(t), "--state-dir="+t.TempDir(), "--write-cni-conf-when-ready=",
		"--enable-endpoint-routes=false", "--enable-bpf-datapath=false", "--enable-endpoint-health-checking=false", sl)
	// Stopped gracefully: the operator hands its Lease over to the next
	// run's.
	t.Cleanup(func() {
		agent.sigterm(t)
		op.sigterm(t)
	})
	b := &budgetRun{c: c, ns: ns, node: node, api: client.New(socket), admin: versioned.NewForConfigOrDie(c.RESTConfig()), slices: sliceMode}
	t.Cleanup(b.api.Close)
	eventually(t, time.Minute, "the agent's IPAM", func() error {
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		defer cancel()
		// An address for nobody, released at once: the pod CIDR is there.
		r, err := b.api.AllocateIP(ctx, ns+"/probe", "probe")
		if err != nil {
			return err
		}
		return b.api.ReleaseIP(ctx, r.IPv4.IP)
	})
	return b
}

// life is one pod's life as the agent sees it: the pod is created, the
// CNI ADD makes its endpoint, the kubelet sets its status; then it is
// deleted gracefully, the CNI DEL deletes the endpoint and the kubelet
// removes the pod. It returns once the pod's CiliumEndpoint is gone.
func (b *budgetRun) life(t *testing.T, name string) {
	t.Helper()
	if err := b.add(t.Context(), name); err != nil {
		t.Fatal(err)
	}
	b.waitCEPs(t, []string{name}, true)
	if err := b.del(t.Context(), name); err != nil {
		t.Fatal(err)
	}
	b.waitCEPs(t, []string{name}, false)
}

// burst creates n pods and their endpoints (ten at a time, as a kubelet
// runs sandboxes in parallel), waits for their CiliumEndpoints, then
// deletes them all the same way and waits for the CiliumEndpoints (and
// in slice mode the slices) to be gone.
func (b *budgetRun) burst(t *testing.T, n int) {
	t.Helper()
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("burst-%03d", i)
	}
	parallel(t, names, b.add)
	b.waitCEPs(t, names, true)
	if b.slices {
		b.waitSliceEntries(t, n)
	}
	parallel(t, names, b.del)
	b.waitCEPs(t, names, false)
	if b.slices {
		b.waitSliceEntries(t, 0)
	}
}

// parallel runs f for every name, ten at a time, and fails t with the
// first error.
func parallel(t *testing.T, names []string, f func(context.Context, string) error) {
	t.Helper()
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
	)
	work := make(chan string)
	for range 10 {
		wg.Go(func() {
			for name := range work {
				if err := f(t.Context(), name); err != nil {
					mu.Lock()
					if first == nil {
						first = err
					}
					mu.Unlock()
				}
			}
		})
	}
	for _, name := range names {
		work <- name
	}
	close(work)
	wg.Wait()
	if first != nil {
		t.Fatal(first)
	}
}

// add creates the pod and, as the CNI ADD does, its address and endpoint
// (which the agent answers once the endpoint is ready); then sets the
// pod's status as the kubelet does.
func (b *budgetRun) add(ctx context.Context, name string) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	pods := b.c.Clientset().CoreV1().Pods(b.ns)
	p := pod(name, b.node)
	p.Labels = map[string]string{"app": "budget"}
	created, err := pods.Create(ctx, p, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("create pod %s: %w", name, err)
	}
	cid := "cid-" + b.ns + "-" + name
	var ip string
	err = retry(ctx, func() error {
		alloc, err := b.api.AllocateIP(ctx, b.ns+"/"+name, cid)
		if err != nil {
			return err
		}
		ip = alloc.IPv4.IP
		_, err = b.api.PutEndpoint(ctx, &models.EndpointChangeRequest{
			ContainerID: cid, ContainerInterfaceName: "eth0",
			K8sNamespace: b.ns, K8sPodName: name, K8sUID: string(created.UID),
			InterfaceName: "lxc" + name, Addressing: models.AddressPair{IPV4: ip}, SyncBuildEndpoint: true,
		})
		if err != nil {
			_, _ = b.api.ReleaseContainerIP(ctx, ip, cid)
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("CNI ADD of pod %s: %w", name, err)
	}
	created.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}},
		Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}
	if _, err := pods.UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("set the status of pod %s: %w", name, err)
	}
	return nil
}

// retry retries f while the agent is not ready for the pod yet (its pod
// table may lag the API server by a moment).
func retry(ctx context.Context, f func() error) error {
	for {
		err := f()
		if err == nil || ctx.Err() != nil {
			return err
		}
		if client.StatusCode(err) < 500 && client.StatusCode(err) != 404 && client.StatusCode(err) != 409 && client.StatusCode(err) != 0 {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// del deletes the pod as kubectl delete does (a grace period: the pod
// stays, terminating), then, as the kubelet does, the CNI DEL and the
// final removal.
func (b *budgetRun) del(ctx context.Context, name string) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	pods := b.c.Clientset().CoreV1().Pods(b.ns)
	grace := int64(30)
	if err := pods.Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: &grace}); err != nil {
		return fmt.Errorf("delete pod %s: %w", name, err)
	}
	if _, err := b.api.DeleteEndpointByContainerID(ctx, "cid-"+b.ns+"-"+name); err != nil {
		return fmt.Errorf("CNI DEL of pod %s: %w", name, err)
	}
	if err := pods.Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("remove pod %s: %w", name, err)
	}
	return nil
}

// waitCEPs waits until the pods' CiliumEndpoints all exist and are
// ready (exist) or are all gone (!exist).
func (b *budgetRun) waitCEPs(t *testing.T, names []string, exist bool) {
	t.Helper()
	what := "the CiliumEndpoints of " + strings.Join(names[:min(3, len(names))], ", ")
	if !exist {
		what += " gone"
	}
	eventually(t, time.Minute, what, func() error {
		l, err := b.admin.CiliumV2().CiliumEndpoints(b.ns).List(t.Context(), metav1.ListOptions{})
		if err != nil {
			return err
		}
		have := map[string]*ciliumv2.CiliumEndpoint{}
		for i := range l.Items {
			have[l.Items[i].Name] = &l.Items[i]
		}
		for _, n := range names {
			cep, ok := have[n]
			switch {
			case exist && !ok:
				return fmt.Errorf("no CiliumEndpoint %s", n)
			case exist && cep.Status.State != ciliumv2.EndpointStateReady:
				return fmt.Errorf("CiliumEndpoint %s is %s", n, cep.Status.State)
			case !exist && ok:
				return fmt.Errorf("CiliumEndpoint %s still there", n)
			}
		}
		return nil
	})
}

// waitSliceEntries waits until the namespace's slices hold n entries.
func (b *budgetRun) waitSliceEntries(t *testing.T, n int) {
	t.Helper()
	eventually(t, time.Minute, fmt.Sprintf("%d slice entries", n), func() error {
		l, err := b.admin.CiliumV2alpha1().CiliumEndpointSlices().List(t.Context(), metav1.ListOptions{})
		if err != nil {
			return err
		}
		got := 0
		for _, s := range l.Items {
			if s.Namespace == b.ns {
				got += len(s.Endpoints)
			}
		}
		if got != n {
			return fmt.Errorf("%d entries", got)
		}
		return nil
	})
}

// mark is the number of audit events logged so far.
func (b *budgetRun) mark(t *testing.T) int {
	t.Helper()
	evs, err := harness.ReadAuditLog(b.c.AuditLogPath())
	if err != nil {
		t.Fatal(err)
	}
	return len(evs)
}

// settle waits until no write has been logged for two seconds: the
// asynchronous writes of what was done (the batcher's, the garbage
// collector's) are in.
func (b *budgetRun) settle(t *testing.T) {
	t.Helper()
	last, since := b.mark(t), time.Now()
	for deadline := time.Now().Add(30 * time.Second); time.Since(since) < 2*time.Second; {
		if time.Now().After(deadline) {
			t.Fatalf("writes still logged 30s after the pods were gone")
		}
		time.Sleep(200 * time.Millisecond)
		if n := b.mark(t); n != last {
			last, since = n, time.Now()
		}
	}
}

// writeCounts counts writes by who and what: who is "agent", "operator"
// or the user name of anyone else (the garbage collector runs as the
// controller-manager's user); what is the resource without subresource,
// with the verb.
type writeCounts map[string]map[string]int

func (b *budgetRun) countSince(t *testing.T, mark int) writeCounts {
	t.Helper()
	evs, err := harness.ReadAuditLog(b.c.AuditLogPath())
	if err != nil {
		t.Fatal(err)
	}
	agent := "system:serviceaccount:" + install.Namespace + ":" + install.AgentServiceAccount
	operator := "system:serviceaccount:" + install.Namespace + ":" + install.OperatorServiceAccount
	out := writeCounts{}
	for _, e := range evs[mark:] {
		if e.Stage != "ResponseComplete" || e.ObjectRef == nil {
			continue
		}
		who := e.User.Username
		switch who {
		case agent:
			who = "agent"
		case operator:
			who = "operator"
		}
		if out[who] == nil {
			out[who] = map[string]int{}
		}
		out[who][e.ObjectRef.Resource+" "+e.Verb]++
	}
	return out
}

// agentAndOperator is the writes of cellium's ServiceAccounts to
// resource.
func (w writeCounts) agentAndOperator(resource string) float64 {
	n := 0
	for _, who := range []string{"agent", "operator"} {
		for k, v := range w[who] {
			if strings.HasPrefix(k, resource+" ") {
				n += v
			}
		}
	}
	return float64(n)
}

// perPod prints cellium's writes per pod for each resource, and others'
// (the garbage collector's) in total.
func (w writeCounts) perPod(pods int) string {
	var parts []string
	for _, r := range budgetResources {
		parts = append(parts, fmt.Sprintf("%s %.2f", r, w.agentAndOperator(r)/float64(pods)))
	}
	s := "cellium writes per pod: " + strings.Join(parts, ", ")
	var others []string
	for _, who := range slices.Sorted(maps.Keys(w)) {
		if who == "agent" || who == "operator" {
			continue
		}
		for _, k := range slices.Sorted(maps.Keys(w[who])) {
			others = append(others, fmt.Sprintf("%s %s: %d", who, k, w[who][k]))
		}
	}
	if len(others) > 0 {
		s += "; others: " + strings.Join(others, ", ")
	}
	return s + "; " + w.detail()
}

// detail lists cellium's writes by ServiceAccount, resource and verb.
func (w writeCounts) detail() string {
	var parts []string
	for _, who := range []string{"agent", "operator"} {
		for _, k := range slices.Sorted(maps.Keys(w[who])) {
			parts = append(parts, fmt.Sprintf("%s %s %d", who, k, w[who][k]))
		}
	}
	if len(parts) == 0 {
		return "no cellium writes"
	}
	return "cellium writes: " + strings.Join(parts, ", ")
}
