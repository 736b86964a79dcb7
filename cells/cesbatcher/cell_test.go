package cesbatcher

import (
	"context"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	"github.com/cellium/cellium/api/cilium.io/v2alpha1"
	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/cells/k8s"
	"github.com/cellium/cellium/cells/k8s/k8stest"
)

type hooks []hive.Hook

func (h *hooks) Append(k hive.Hook) { *h = append(*h, k) }

// TestWriteClientOwnRate: the batcher writes through a client of its own
// paced at 100 requests a second (bursts of 200), not through the
// operator's shared client at --k8s-client-qps (10), which would hold the
// slice writes below the 50 a second --ces-rate-limits allows. The
// shared client keeps its rate; a fake without a server is used as is.
func TestWriteClientOwnRate(t *testing.T) {
	shared, err := k8s.NewClientsetFromConfig(&rest.Config{Host: "http://127.0.0.1:1", QPS: 10, Burst: 20})
	if err != nil {
		t.Fatal(err)
	}
	var lc hooks
	got, err := writeClient(shared, &lc)
	if err != nil {
		t.Fatal(err)
	}
	type restClient interface{ RESTClient() rest.Interface }
	qps := func(c any) float32 { return c.(restClient).RESTClient().GetRateLimiter().QPS() }
	if q := qps(got); q != writeClientQPS || writeClientQPS < 2*MaxWriteQPS {
		t.Errorf("the batcher's client allows %v requests a second, want %d (at least twice %d)", q, writeClientQPS, MaxWriteQPS)
	}
	if q := qps(shared.Cilium().CiliumV2alpha1()); q != 10 {
		t.Errorf("the shared client allows %v requests a second, want its own 10", q)
	}
	if len(lc) != 1 || lc[0].OnStop == nil {
		t.Fatalf("hooks %+v: want one that closes the client's idle connections", lc)
	}
	if err := lc[0].OnStop(context.Background()); err != nil {
		t.Error(err)
	}

	fake := k8stest.NewClientset()
	lc = nil
	got, err = writeClient(fake, &lc)
	if err != nil || len(lc) != 0 {
		t.Fatalf("with a fake: %v, %d hooks; want the fake's own client", err, len(lc))
	}
	ces := &v2alpha1.CiliumEndpointSlice{ObjectMeta: metav1.ObjectMeta{Name: "ces-1"}}
	if _, err := got.CiliumEndpointSlices().Create(context.Background(), ces, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := fake.Cilium().CiliumV2alpha1().CiliumEndpointSlices().Get(context.Background(), "ces-1", metav1.GetOptions{}); err != nil {
		t.Errorf("a write through the client for a fake did not reach the fake: %v", err)
	}
}
