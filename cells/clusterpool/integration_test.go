package clusterpool_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
	corev1 "k8s.io/api/core/v1"
	apiextclientset "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	k8serrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	"github.com/cellium/cellium/api/client/clientset/versioned"
	"github.com/cellium/cellium/api/crds"
	"github.com/cellium/cellium/cells/clusterpool"
	"github.com/cellium/cellium/cells/crdregister"
	"github.com/cellium/cellium/cells/endpointgc"
	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/cells/hive/hivetest"
	"github.com/cellium/cellium/cells/identitygc"
	"github.com/cellium/cellium/cells/k8s"
	"github.com/cellium/cellium/cells/k8s/k8stest"
	"github.com/cellium/cellium/cells/leaderelection"
	"github.com/cellium/cellium/test/harness"
)

// cluster is the real etcd and kube-apiserver of the integration test,
// started by the first test that needs it. It runs without the
// controller-manager, so no ownerReference GC deletes CiliumEndpoints for
// us: what disappears, the operator's own collectors removed.
var cluster = harness.NewShared(harness.Options{})

// TestOperatorControllersIntegration runs the three operator controllers of
// this issue (cluster-pool IPAM, CiliumEndpoint GC, identity GC) in a
// partial operator hive with the real k8s cells against a real API server.
func TestOperatorControllersIntegration(t *testing.T) {
	if testing.Short() {
		t.Skip("starts etcd and kube-apiserver")
	}
	c := cluster.Get(t)
	ns := c.TestNamespace(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	apiext, err := apiextclientset.NewForConfig(c.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	all, err := crds.All()
	if err != nil {
		t.Fatal(err)
	}
	if err := crdregister.Register(ctx, apiext.ApiextensionsV1().CustomResourceDefinitions(), all, hivetest.Logger(t)); err != nil {
		t.Fatal(err)
	}
	cilium, err := versioned.NewForConfig(c.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	core := c.Clientset()
	cns := cilium.CiliumV2().CiliumNodes()
	cids := cilium.CiliumV2().CiliumIdentities()

	// Before the operator starts: node-a already has a CIDR (restored),
	// node-b has none.
	mustCreate(t, cns, &ciliumv2.CiliumNode{ObjectMeta: metav1.ObjectMeta{Name: "node-a"},
		Spec: ciliumv2.NodeSpec{IPAM: ciliumv2.IPAMSpec{PodCIDRs: []string{"10.99.0.0/24"}}}})
	mustCreate(t, cns, &ciliumv2.CiliumNode{ObjectMeta: metav1.ObjectMeta{Name: "node-b"}})

	// Two pods with their CiliumEndpoints, and the identities they use.
	live := mustCreatePod(ctx, t, core, ns, "live")
	doomed := mustCreatePod(ctx, t, core, ns, "doomed")
	mustCreate(t, cilium.CiliumV2().CiliumEndpoints(ns), cep(ns, "live", live.UID, 1000))
	mustCreate(t, cilium.CiliumV2().CiliumEndpoints(ns), cep(ns, "doomed", doomed.UID, 1001))
	// Health endpoints: node-a's stays, the gone node's goes.
	mustCreate(t, cilium.CiliumV2().CiliumEndpoints("kube-system"), cep("kube-system", "cilium-health-node-a", "", 4))
	mustCreate(t, cilium.CiliumV2().CiliumEndpoints("kube-system"), cep("kube-system", "cilium-health-node-gone", "", 4))
	for _, id := range []string{"1000", "1001", "1002"} {
		mustCreate(t, cids, &ciliumv2.CiliumIdentity{ObjectMeta: metav1.ObjectMeta{Name: id}, SecurityLabels: map[string]string{"k8s:app": id}})
	}
	t.Cleanup(func() {
		ctx := context.Background()
		for _, n := range []string{"node-a", "node-b", "node-c"} {
			_ = cns.Delete(ctx, n, metav1.DeleteOptions{})
		}
		for _, n := range []string{"cilium-health-node-a", "cilium-health-node-gone"} {
			_ = cilium.CiliumV2().CiliumEndpoints("kube-system").Delete(ctx, n, metav1.DeleteOptions{})
		}
		_ = cids.DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{})
	})

	ignore := goleak.IgnoreCurrent() // the harness and the test's clients
	var (
		health    hive.HealthReporter
		k8sClient k8s.Clientset
	)
	h := hivetest.New(t, []string{
		"--k8s-kubeconfig-path=" + c.Kubeconfig(),
		"--leader-election=false",
		"--cluster-pool-ipv4-cidr=10.99.0.0/16",
		"--cluster-pool-ipv4-mask-size=24",
		"--cilium-endpoint-gc-interval=500ms",
		"--identity-gc-interval=300ms",
		"--identity-heartbeat-timeout=1s",
	}, k8s.ClientCell, k8s.OperatorResourcesCell, leaderelection.Cell,
		clusterpool.Cell, endpointgc.Cell, identitygc.Cell, hivetest.Capture(&health), hivetest.Capture(&k8sClient))
	if err := h.Start(ctx); err != nil {
		t.Fatal(err)
	}
	stopped := false
	defer func() {
		if !stopped {
			_ = h.Stop(context.Background())
		}
	}()
	t0 := time.Now()

	// Cluster pool: node-a keeps its CIDR, node-b and a new node-c get the
	// next free ones.
	mustCreate(t, cns, &ciliumv2.CiliumNode{ObjectMeta: metav1.ObjectMeta{Name: "node-c"}})
	for node, want := range map[string]string{"node-a": "10.99.0.0/24", "node-b": "10.99.1.0/24", "node-c": "10.99.2.0/24"} {
		k8stest.Eventually(t, node+" pod CIDR", func() error {
			cn, err := cns.Get(ctx, node, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if !slices.Equal(cn.Spec.IPAM.PodCIDRs, []string{want}) {
				return fmt.Errorf("podCIDRs %q, want [%s]", cn.Spec.IPAM.PodCIDRs, want)
			}
			return nil
		})
	}
	t.Logf("pod CIDRs written %s after start", time.Since(t0).Round(time.Millisecond))

	// CEP GC: the pod "doomed" is deleted while "its agent is down"; its
	// CiliumEndpoint goes, and so does the health CEP of the gone node.
	if err := core.CoreV1().Pods(ns).Delete(ctx, "doomed", *metav1.NewDeleteOptions(0)); err != nil {
		t.Fatal(err)
	}
	tDel := time.Now()
	gone := func(namespace, name string) func() error {
		return func() error {
			_, err := cilium.CiliumV2().CiliumEndpoints(namespace).Get(ctx, name, metav1.GetOptions{})
			if k8serrors.IsNotFound(err) {
				return nil
			}
			return fmt.Errorf("still there (err %v)", err)
		}
	}
	k8stest.Eventually(t, "the CiliumEndpoint of the deleted pod removed", gone(ns, "doomed"))
	t.Logf("CiliumEndpoint of the deleted pod removed %s after the pod", time.Since(tDel).Round(time.Millisecond))
	k8stest.Eventually(t, "the health CiliumEndpoint of the gone node removed", gone("kube-system", "cilium-health-node-gone"))

	// Identity GC: 1002 was never used, 1001 lost its only user; both go
	// after the heartbeat timeout. 1000 stays.
	for _, id := range []string{"1001", "1002"} {
		k8stest.Eventually(t, "identity "+id+" deleted", func() error {
			_, err := cids.Get(ctx, id, metav1.GetOptions{})
			if k8serrors.IsNotFound(err) {
				return nil
			}
			return fmt.Errorf("still there (err %v)", err)
		})
	}
	t.Logf("unused identities deleted %s after start (heartbeat timeout 1s)", time.Since(t0).Round(time.Millisecond))

	// Later GC passes (each reports "last pass at <time>") leave everything
	// live alone: wait until both collectors report a pass that started
	// at least two seconds from now.
	after := time.Now().Add(2 * time.Second)
	for _, module := range []string{"k8s-endpoints-gc", "k8s-identities-gc"} {
		k8stest.Eventually(t, module+" passes", func() error {
			for _, st := range health.Statuses() {
				rest, ok := strings.CutPrefix(st.Message, "last pass at ")
				if !ok || st.Module != module {
					continue
				}
				stamp, _, _ := strings.Cut(rest, ": ")
				if when, err := time.Parse(time.RFC3339, stamp); err == nil && !when.Before(after.Truncate(time.Second)) {
					return nil
				}
			}
			return fmt.Errorf("no pass reported after %s yet", after.Format(time.RFC3339))
		})
	}
	for _, key := range []struct{ ns, name string }{{ns, "live"}, {"kube-system", "cilium-health-node-a"}} {
		if _, err := cilium.CiliumV2().CiliumEndpoints(key.ns).Get(ctx, key.name, metav1.GetOptions{}); err != nil {
			t.Errorf("live CiliumEndpoint %s/%s: %v", key.ns, key.name, err)
		}
	}
	cid, err := cids.Get(ctx, "1000", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("identity 1000, in use: %v", err)
	}
	if _, marked := cid.Annotations[ciliumv2.HeartbeatAnnotation]; marked {
		t.Errorf("identity 1000 is in use but marked for deletion")
	}

	if err := h.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	stopped = true
	// The client cell closes its idle connections at stop; a connection
	// whose cancelled watches were still closing then is closed here.
	for range 5 {
		k8s.CloseIdleConnections(k8sClient)
		if err = goleak.Find(ignore, goleak.IgnoreAnyFunction("k8s.io/klog/v2.(*loggingT).flushDaemon")); err == nil {
			return
		}
	}
	t.Fatalf("goroutines left after stop: %v", err)
}

type creator[T any] interface {
	Create(context.Context, T, metav1.CreateOptions) (T, error)
}

func mustCreate[T any](t *testing.T, c creator[T], obj T) T {
	t.Helper()
	out, err := c.Create(context.Background(), obj, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func mustCreatePod(ctx context.Context, t *testing.T, core kubernetes.Interface, ns, name string) *corev1.Pod {
	t.Helper()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "registry.k8s.io/pause:3.10"}}},
	}
	out, err := core.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// cep is a CiliumEndpoint with identity id, owned by the pod with podUID
// ("": no owner, as a health endpoint).
func cep(ns, name string, podUID types.UID, id int64) *ciliumv2.CiliumEndpoint {
	c := &ciliumv2.CiliumEndpoint{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	if podUID != "" {
		c.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: name, UID: podUID}}
	}
	c.Status.Identity = &ciliumv2.EndpointIdentity{ID: id}
	c.Status.State = ciliumv2.EndpointStateReady
	return c
}
