package cepsync

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"testing"

	"github.com/cilium/statedb"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	k8stesting "k8s.io/client-go/testing"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	"github.com/cellium/cellium/cells/k8s/k8stest"
	k8stables "github.com/cellium/cellium/statedb/k8s"
)

// A pod re-created under the same name while the old pod's CEP is still
// there (left to the garbage collector, which has not come, and the
// agent's own delete fails: the API server is down): the agent must not
// patch the old pod's CEP with the new pod's status, leaving it owned by
// the old pod. It deletes that CEP and creates one owned by the new pod.
// The chaos soak found a pod without a CEP for a minute so, until the
// operator's GC removed the old one.
func TestRecreatedPodAfterFailedDelete(t *testing.T) {
	db := statedb.New()
	cepTable, err := k8stables.NewCiliumEndpointsTable(db)
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Start(); err != nil {
		t.Fatal(err)
	}
	defer db.Stop()
	cs := k8stest.NewClientset()
	var failDeletes atomic.Bool
	cs.CiliumFake.PrependReactor("delete", "ciliumendpoints", func(k8stesting.Action) (bool, runtime.Object, error) {
		if failDeletes.Load() {
			return true, nil, errors.New("connection refused")
		}
		return false, nil, nil
	})
	tg := &target{log: slog.New(slog.DiscardHandler), client: cs.Cilium(), db: db, ceps: cepTable,
		nodeIP: func() string { return "192.0.2.10" }, uids: map[string]types.UID{}}
	ctx := context.Background()
	desired := func(podUID string, id int64) *DesiredCEP {
		return &DesiredCEP{Namespace: "ns", Name: "web", PodName: "web", PodUID: podUID,
			Status: ciliumv2.EndpointStatus{ID: id, Networking: &ciliumv2.EndpointNetworking{NodeIP: "192.0.2.10"}}}
	}
	owner := func() string {
		cep, err := cs.Cilium().CiliumV2().CiliumEndpoints("ns").Get(ctx, "web", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if len(cep.OwnerReferences) != 1 {
			t.Fatalf("owner references %+v", cep.OwnerReferences)
		}
		return string(cep.OwnerReferences[0].UID)
	}

	if err := tg.Update(ctx, nil, desired("pod-old", 1)); err != nil {
		t.Fatal(err)
	}
	failDeletes.Store(true)
	// The endpoint goes: its CEP is left to the garbage collector.
	if err := tg.Delete(ctx, nil, desired("pod-old", 1)); err != nil {
		t.Fatal(err)
	}
	if owner() != "pod-old" {
		t.Fatal("the old pod's CEP is gone")
	}
	// The new pod's endpoint: while deletes fail, the update fails too
	// (retried by the reconciler) rather than patching the old pod's CEP.
	if err := tg.Update(ctx, nil, desired("pod-new", 2)); err == nil && owner() != "pod-new" {
		t.Fatalf("the old pod's CEP was patched with the new pod's status (owner %s)", owner())
	}
	failDeletes.Store(false)
	if err := tg.Update(ctx, nil, desired("pod-new", 2)); err != nil {
		t.Fatal(err)
	}
	if got := owner(); got != "pod-new" {
		t.Fatalf("CEP owned by %s, want the re-created pod pod-new", got)
	}
}
