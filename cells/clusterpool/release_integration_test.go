package clusterpool_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextclientset "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	"github.com/cellium/cellium/api/client/clientset/versioned"
	"github.com/cellium/cellium/api/crds"
	"github.com/cellium/cellium/cells/clusterpool"
	"github.com/cellium/cellium/cells/crdregister"
	"github.com/cellium/cellium/cells/hive/hivetest"
	"github.com/cellium/cellium/cells/k8s"
	"github.com/cellium/cellium/cells/k8s/k8stest"
	"github.com/cellium/cellium/cells/leaderelection"
	"github.com/cellium/cellium/test/harness"
)

// gcCluster is a real API server with the controller-manager, whose
// ownerReference garbage collector deletes a node's CiliumNode with its
// Node, as in a real cluster.
var gcCluster = harness.NewShared(harness.Options{ControllerManager: true})

// TestIntegrationReleasesPodCIDR fills a two-CIDR pool and shows that the
// operator gives a node's pod CIDR to a waiting node once the node leaves,
// whether its CiliumNode is deleted or its Node is (the CiliumNode, owned
// by the Node as the agent publishes it, goes with it).
func TestIntegrationReleasesPodCIDR(t *testing.T) {
	if testing.Short() {
		t.Skip("starts etcd, kube-apiserver and kube-controller-manager")
	}
	c := gcCluster.Get(t)
	ctx := t.Context()
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
	cns := cilium.CiliumV2().CiliumNodes()
	knodes := c.Clientset().CoreV1().Nodes()
	t.Cleanup(func() {
		ctx := context.Background()
		for _, n := range []string{"rel-a", "rel-b", "rel-c", "rel-d"} {
			_ = cns.Delete(ctx, n, metav1.DeleteOptions{})
		}
		_ = knodes.Delete(ctx, "rel-a", metav1.DeleteOptions{})
	})
	node := mustCreate(t, knodes, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "rel-a"}})
	mustCreate(t, cns, &ciliumv2.CiliumNode{ObjectMeta: metav1.ObjectMeta{Name: "rel-a",
		OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: node.Name, UID: node.UID}}}})
	mustCreate(t, cns, &ciliumv2.CiliumNode{ObjectMeta: metav1.ObjectMeta{Name: "rel-b"}})

	hivetest.Start(t, []string{
		"--k8s-kubeconfig-path=" + c.Kubeconfig(),
		"--leader-election=false",
		"--cluster-pool-ipv4-cidr=10.98.0.0/23",
		"--cluster-pool-ipv4-mask-size=24",
	}, k8s.ClientCell, k8s.OperatorResourcesCell, leaderelection.Cell, clusterpool.Cell)

	cidrOf := func(name string) []string {
		cn, err := cns.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return nil
		}
		return cn.Spec.IPAM.PodCIDRs
	}
	waitCIDR := func(name string, want []string) {
		t.Helper()
		k8stest.Eventually(t, name+" pod CIDR", func() error {
			if got := cidrOf(name); len(got) != 1 || (want != nil && !slices.Equal(got, want)) {
				return fmt.Errorf("podCIDRs %q, want %q", got, want)
			}
			return nil
		})
	}
	// The garbage collector learns of a CRD's objects at its discovery
	// resync (every 30 s), so the Node's deletion may take that long to
	// reach the CiliumNode.
	waitLong := func(name string, want []string) {
		t.Helper()
		start := time.Now()
		for deadline := start.Add(90 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			got := cidrOf(name)
			if slices.Equal(got, want) {
				t.Logf("%s got %v %s after the Node's deletion", name, got, time.Since(start).Round(time.Millisecond))
				return
			}
			if time.Now().After(deadline) {
				_, err := cns.Get(ctx, "rel-a", metav1.GetOptions{})
				t.Fatalf("%s podCIDRs %q, want %q after 90s (CiliumNode rel-a: %v)", name, got, want, err)
			}
		}
	}
	waitCIDR("rel-a", nil)
	waitCIDR("rel-b", nil)
	a, b := cidrOf("rel-a"), cidrOf("rel-b")

	// The pool is full: rel-c gets rel-b's CIDR once rel-b's CiliumNode
	// is deleted.
	mustCreate(t, cns, &ciliumv2.CiliumNode{ObjectMeta: metav1.ObjectMeta{Name: "rel-c"}})
	if err := cns.Delete(ctx, "rel-b", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitCIDR("rel-c", b)

	// rel-d gets rel-a's once rel-a's Node is deleted: the garbage
	// collector deletes the CiliumNode it owns.
	mustCreate(t, cns, &ciliumv2.CiliumNode{ObjectMeta: metav1.ObjectMeta{Name: "rel-d"}})
	if err := knodes.Delete(ctx, "rel-a", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitLong("rel-d", a)
}
