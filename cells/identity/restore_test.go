package identity

import (
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	k8stesting "k8s.io/client-go/testing"

	"github.com/cellium/cellium/statedb/identity"
)

// After a boot with the API server unreachable, the CiliumIdentities are
// never listed: Allocate of the labels of a restored endpoint returns the
// restored number at once, other labels still need the API (they fail when
// ctx ends), and once the API is back the reference is kept in the API
// (the object is created with the restored number and labels).
func TestAllocateRestoredWithoutAPIServer(t *testing.T) {
	cs := newFakeClientset()
	var down atomic.Bool
	down.Store(true)
	cs.cilium.PrependReactor("*", "*", func(k8stesting.Action) (bool, runtime.Object, error) {
		if down.Load() {
			return true, nil, errors.New("dial tcp 127.0.0.1:6443: connect: connection refused")
		}
		return false, nil, nil
	})
	cs.cilium.PrependWatchReactor("*", func(k8stesting.Action) (bool, watch.Interface, error) {
		if down.Load() {
			return true, nil, errors.New("dial tcp 127.0.0.1:6443: connect: connection refused")
		}
		return false, nil, nil
	})
	ag := startAgent(t, cs, nil)
	const restored = identity.NumericIdentity(31000)
	web := podLabels("web", "default")
	ag.alloc.Restore(web, restored)

	got, err := ag.alloc.Allocate(ctxTimeout(t, 5*time.Second), web)
	if err != nil || got.ID != restored {
		t.Fatalf("Allocate(restored labels) without the API = %d, %v; want %d", got.ID, err, restored)
	}
	if _, err := ag.alloc.Allocate(ctxTimeout(t, 200*time.Millisecond), podLabels("db", "default")); err == nil {
		t.Error("Allocate of labels without a restored identity succeeded without the API")
	}

	down.Store(false)
	eventually(t, "the restored identity kept in the API", func() error {
		obj, ok := cs.cids(t)[restored.StringID()]
		if !ok {
			return errors.New("no CiliumIdentity " + restored.StringID())
		}
		if labelsKey(obj) != web.SortedList() {
			return errors.New("labels " + labelsKey(obj))
		}
		return nil
	})
	if n := ag.refs(restored); n != 1 {
		t.Errorf("refs of %d = %d, want 1", restored, n)
	}
	// Listed now: the restored numbers are no longer used.
	eventually(t, "restored numbers dropped", func() error {
		if _, err := ag.alloc.resolveRestored(web.SortedList()); err == nil {
			return errors.New("still resolving from the restored numbers")
		}
		return nil
	})
}

// An API server outage while running: the CiliumIdentities are listed, so
// labels whose identity exists resolve without the API (one this agent
// uses and one only in the cluster); new labels need a Create and fail as
// soon as the API refuses it, not after the allocation timeout.
func TestAllocateDuringAPIServerOutage(t *testing.T) {
	cs := newFakeClientset(cidObject("30500", time.Now(), "k8s:app=db", "k8s:io.kubernetes.pod.namespace=default",
		"k8s:io.cilium.k8s.policy.cluster=default", "k8s:io.cilium.k8s.policy.serviceaccount=default"))
	ag := startAgent(t, cs, nil)
	web, err := ag.alloc.Allocate(ctxTimeout(t, 10*time.Second), podLabels("web", "default"))
	if err != nil {
		t.Fatal(err)
	}
	var down atomic.Bool
	down.Store(true)
	cs.cilium.PrependReactor("*", "*", func(k8stesting.Action) (bool, runtime.Object, error) {
		if down.Load() {
			return true, nil, errors.New("dial tcp 127.0.0.1:6443: connect: connection refused")
		}
		return false, nil, nil
	})
	defer down.Store(false)

	ctx := ctxTimeout(t, time.Minute)
	if got, err := ag.alloc.Allocate(ctx, podLabels("web", "default")); err != nil || got.ID != web.ID {
		t.Errorf("Allocate(labels in use) during the outage = %d, %v; want %d", got.ID, err, web.ID)
	}
	if got, err := ag.alloc.Allocate(ctx, podLabels("db", "default")); err != nil || got.ID != 30500 {
		t.Errorf("Allocate(labels of an existing CiliumIdentity) during the outage = %d, %v; want 30500", got.ID, err)
	}
	if _, err := ag.alloc.Allocate(ctx, podLabels("new", "default")); err == nil || ctx.Err() != nil {
		t.Errorf("Allocate(new labels) during the outage: %v (ctx %v), want the API's error before the timeout", err, ctx.Err())
	}
}
