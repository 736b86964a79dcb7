package api

import (
	"context"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"

	v2 "github.com/cellium/cellium/api/cilium.io/v2"
	v2alpha1 "github.com/cellium/cellium/api/cilium.io/v2alpha1"
	"github.com/cellium/cellium/api/client/clientset/versioned/fake"
	"github.com/cellium/cellium/api/client/informers/externalversions"
)

// TestGeneratedClients is a smoke test of the generated fake clientset,
// informers and listers, as the cells' tests will use them.
func TestGeneratedClients(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	cep := &v2.CiliumEndpoint{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "shop"},
		Status:     v2.EndpointStatus{ID: 7, State: v2.EndpointStateReady},
	}
	cs := fake.NewSimpleClientset(cep)

	got, err := cs.CiliumV2().CiliumEndpoints("shop").Get(ctx, "web", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get CiliumEndpoint: %v", err)
	}
	if got.Status.ID != 7 || got.Status.State != v2.EndpointStateReady {
		t.Fatalf("got status %+v", got.Status)
	}

	factory := externalversions.NewSharedInformerFactory(cs, 0)
	nodes := factory.Cilium().V2().CiliumNodes()
	slices := factory.Cilium().V2alpha1().CiliumEndpointSlices()
	nodeInformer, sliceInformer := nodes.Informer(), slices.Informer()
	factory.Start(ctx.Done())
	defer factory.Shutdown()
	defer cancel()
	if !cache.WaitForCacheSync(ctx.Done(), nodeInformer.HasSynced, sliceInformer.HasSynced) {
		t.Fatal("informers did not sync")
	}

	if _, err := cs.CiliumV2().CiliumNodes().Create(ctx,
		&v2.CiliumNode{ObjectMeta: metav1.ObjectMeta{Name: "node-a"}}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create CiliumNode: %v", err)
	}
	if _, err := cs.CiliumV2alpha1().CiliumEndpointSlices().Create(ctx,
		&v2alpha1.CiliumEndpointSlice{ObjectMeta: metav1.ObjectMeta{Name: "ces-1"}, Namespace: "shop"},
		metav1.CreateOptions{}); err != nil {
		t.Fatalf("create CiliumEndpointSlice: %v", err)
	}
	for {
		n, nerr := nodes.Lister().Get("node-a")
		s, serr := slices.Lister().Get("ces-1")
		if nerr == nil && serr == nil {
			if n.Name != "node-a" || s.Namespace != "shop" {
				t.Fatalf("listers returned %+v and %+v", n, s)
			}
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("listers never saw the objects: %v, %v", nerr, serr)
		case <-time.After(10 * time.Millisecond):
		}
	}
}
