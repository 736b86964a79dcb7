package identity

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	k8stesting "k8s.io/client-go/testing"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	"github.com/cellium/cellium/cells/k8s"
	"github.com/cellium/cellium/statedb/identity"
	"github.com/cellium/cellium/statedb/labels"
)

func TestReservedIdentities(t *testing.T) {
	cs := newFakeClientset()
	ag := startAgent(t, cs, nil)
	ctx := ctxTimeout(t, 10*time.Second)
	tests := []struct {
		labels []string
		want   identity.NumericIdentity
	}{
		{[]string{"reserved:host"}, identity.ReservedIdentityHost},
		{[]string{"reserved:world"}, identity.ReservedIdentityWorld},
		{[]string{"reserved:unmanaged"}, identity.ReservedIdentityUnmanaged},
		{[]string{"reserved:health"}, identity.ReservedIdentityHealth},
		{[]string{"reserved:init"}, identity.ReservedIdentityInit},
		{[]string{"reserved:remote-node"}, identity.ReservedIdentityRemoteNode},
		{[]string{"reserved:remote-node", "reserved:kube-apiserver"}, identity.ReservedIdentityKubeAPIServer},
		{[]string{"reserved:ingress"}, identity.ReservedIdentityIngress},
	}
	for _, tt := range tests {
		got, err := ag.alloc.Allocate(ctx, labels.ParseLabels(tt.labels...))
		if err != nil || got.ID != tt.want {
			t.Errorf("Allocate(%v) = %d, %v; want %d", tt.labels, got.ID, err, tt.want)
		}
		if err := ag.alloc.Release(ctx, got.ID); err != nil {
			t.Errorf("Release(%d): %v", got.ID, err)
		}
		if l, ok := ag.alloc.lookup(tt.want); !ok || l.ID != tt.want {
			t.Errorf("Lookup(%d) = %v, %v", tt.want, l, ok)
		}
	}
	if n := len(cs.cids(t)); n != 0 {
		t.Errorf("reserved identities created %d CiliumIdentity objects", n)
	}
}

func TestAllocateErrors(t *testing.T) {
	ag := startAgent(t, newFakeClientset(), nil)
	ctx := ctxTimeout(t, 10*time.Second)
	if _, err := ag.alloc.Allocate(ctx, labels.Labels{}); !errors.Is(err, ErrNoLabels) {
		t.Errorf("empty labels: %v, want ErrNoLabels", err)
	}
	if _, err := ag.alloc.Allocate(ctx, labels.ParseLabels("cidr:10.0.0.0/8")); !errors.Is(err, ErrUnsupportedScope) {
		t.Errorf("CIDR labels: %v, want ErrUnsupportedScope", err)
	}
	if err := ag.alloc.Release(ctx, 4242); !errors.Is(err, ErrNotAllocated) {
		t.Errorf("Release of an unknown identity: %v, want ErrNotAllocated", err)
	}
	if _, ok := ag.alloc.lookup(4242); ok {
		t.Error("Lookup of an unknown identity succeeded")
	}
}

// A disabled clientset (no kubeconfig) fails allocations with a message
// that says what to configure, but reserved identities still resolve.
func TestAllocateWithoutKubernetes(t *testing.T) {
	ag := startAgent(t, disabledClientset{newFakeClientset()}, nil)
	ctx := ctxTimeout(t, 5*time.Second)
	_, err := ag.alloc.Allocate(ctx, podLabels("web", "default"))
	if !errors.Is(err, k8s.ErrNotConfigured) {
		t.Errorf("Allocate = %v, want k8s.ErrNotConfigured", err)
	}
	if id, err := ag.alloc.Allocate(ctx, labels.ParseLabels("reserved:health")); err != nil || id.ID != identity.ReservedIdentityHealth {
		t.Errorf("reserved:health = %v, %v", id, err)
	}
}

type disabledClientset struct{ *fakeClientset }

func (disabledClientset) IsEnabled() bool { return false }

func TestAllocateCreatesAndCounts(t *testing.T) {
	cs := newFakeClientset()
	ag := startAgent(t, cs, nil)
	ctx := ctxTimeout(t, 10*time.Second)
	lbls := podLabels("web", "prod")

	first, err := ag.alloc.Allocate(ctx, lbls)
	if err != nil {
		t.Fatal(err)
	}
	if !identity.DefaultLayout().InAllocationRange(first.ID) {
		t.Errorf("identity %d outside the default range", first.ID)
	}
	objs := cs.cids(t)
	if len(objs) != 1 {
		t.Fatalf("%d objects, want 1", len(objs))
	}
	obj := objs[first.ID.StringID()]
	if obj == nil {
		t.Fatalf("no object named %s: %v", first.ID.StringID(), slices.Collect(maps.Keys(objs)))
	}
	wantSec := map[string]string{
		"k8s:app":                                 "web",
		"k8s:io.kubernetes.pod.namespace":         "prod",
		"k8s:io.cilium.k8s.policy.cluster":        "default",
		"k8s:io.cilium.k8s.policy.serviceaccount": "default",
	}
	if !maps.Equal(obj.SecurityLabels, wantSec) {
		t.Errorf("security-labels = %v, want %v", obj.SecurityLabels, wantSec)
	}
	if want := map[string]string{
		"app": "web", "io.kubernetes.pod.namespace": "prod",
		"io.cilium.k8s.policy.cluster": "default", "io.cilium.k8s.policy.serviceaccount": "default",
	}; !maps.Equal(obj.Labels, want) {
		t.Errorf("metadata.labels = %v, want %v", obj.Labels, want)
	}

	// The same labels, written in another order, reuse it.
	reversed := lbls.List()
	slices.Reverse(reversed)
	again, err := ag.alloc.Allocate(ctx, labels.New(reversed...))
	if err != nil || again.ID != first.ID {
		t.Fatalf("second Allocate = %v, %v; want %d", again, err, first.ID)
	}
	if got := ag.refs(first.ID); got != 2 {
		t.Errorf("refs = %d, want 2", got)
	}
	if got, ok := ag.alloc.lookup(first.ID); !ok || !got.Labels.Equal(lbls) {
		t.Errorf("Lookup(%d) = %v, %v", first.ID, got, ok)
	}
	other, err := ag.alloc.Allocate(ctx, podLabels("db", "prod"))
	if err != nil || other.ID == first.ID {
		t.Fatalf("other labels got %v, %v", other, err)
	}

	for range 2 {
		if err := ag.alloc.Release(ctx, first.ID); err != nil {
			t.Fatal(err)
		}
	}
	if got := ag.refs(first.ID); got != 0 {
		t.Errorf("refs after two releases = %d", got)
	}
	if err := ag.alloc.Release(ctx, first.ID); !errors.Is(err, ErrNotAllocated) {
		t.Errorf("third Release = %v, want ErrNotAllocated", err)
	}
	// Releasing never deletes: that is the operator's GC.
	if _, ok := cs.cids(t)[first.ID.StringID()]; !ok {
		t.Error("Release deleted the CiliumIdentity")
	}
	// Allocating it again finds the object.
	if got, err := ag.alloc.Allocate(ctx, lbls); err != nil || got.ID != first.ID {
		t.Errorf("Allocate after release = %v, %v; want %d", got, err, first.ID)
	}
	if n := len(cs.cids(t)); n != 2 {
		t.Errorf("%d objects, want 2", n)
	}
}

// An existing identity is reused, the oldest of duplicates is preferred,
// and the operator's heartbeat mark is removed from it.
func TestReuseExisting(t *testing.T) {
	now := time.Now()
	lbls := []string{"k8s:app=web", "k8s:io.kubernetes.pod.namespace=prod"}
	newer := cidObject("1000", now, lbls...)
	older := cidObject("2000", now.Add(-time.Hour), lbls...)
	older.Annotations = map[string]string{ciliumv2.HeartbeatAnnotation: now.Format(time.RFC3339Nano)}
	outOfRange := cidObject("70000", now.Add(-2*time.Hour), lbls...) // cluster 1's range
	cs := newFakeClientset(newer, older, outOfRange)
	ag := startAgent(t, cs, nil)

	got, err := ag.alloc.Allocate(ctxTimeout(t, 10*time.Second), labels.ParseLabels(lbls...))
	if err != nil || got.ID != 2000 {
		t.Fatalf("Allocate = %v, %v; want 2000", got, err)
	}
	// The object, written without metadata labels (as Cilium does), gets
	// them, so that kubectl get ciliumid -l app=web finds it too.
	eventually(t, "the heartbeat mark removed and labels added", func() error {
		o := cs.cids(t)["2000"]
		if marked(o) {
			return fmt.Errorf("still marked")
		}
		if o.Labels["app"] != "web" || o.Labels["io.kubernetes.pod.namespace"] != "prod" {
			return fmt.Errorf("labels %v", o.Labels)
		}
		return nil
	})
	if n := len(cs.cids(t)); n != 3 {
		t.Errorf("%d objects, want the 3 seeded", n)
	}
}

func TestExhaustedRange(t *testing.T) {
	now := time.Now()
	cs := newFakeClientset(
		cidObject("256", now, "k8s:app=a"),
		cidObject("257", now, "k8s:app=b"),
		cidObject("258", now, "k8s:app=c"),
	)
	ag := startAgent(t, cs, &allocatorOptions{Min: 256, Max: 259, Timeout: 10 * time.Second})
	ctx := ctxTimeout(t, 10*time.Second)
	got, err := ag.alloc.Allocate(ctx, labels.ParseLabels("k8s:app=d"))
	if err != nil || got.ID != 259 {
		t.Fatalf("Allocate = %v, %v; want the only free number 259", got, err)
	}
	_, err = ag.alloc.Allocate(ctx, labels.ParseLabels("k8s:app=e"))
	if !errors.Is(err, ErrNoFreeIdentity) {
		t.Fatalf("Allocate in a full range = %v, want ErrNoFreeIdentity", err)
	}
	t.Logf("error: %v", err)
}

// Numbers the agent's view does not know yet to be taken are found by
// Create's AlreadyExists and skipped.
func TestProbeSkipsUnseenTaken(t *testing.T) {
	cs := newFakeClientset()
	lbls := labels.ParseLabels("k8s:app=x")
	start := 256 + identity.NumericIdentity(probeStart(lbls.SortedList(), 5))
	// Taken behind the agent's back: the reactor adds it just before the
	// agent's first Create, so the watch has not delivered it.
	var once sync.Once
	cs.cilium.PrependReactor("create", "ciliumidentities", func(k8stesting.Action) (bool, runtime.Object, error) {
		once.Do(func() {
			if err := cs.cilium.Tracker().Add(cidObject(start.StringID(), time.Now(), "k8s:app=other")); err != nil {
				t.Error(err)
			}
		})
		return false, nil, nil
	})
	ag := startAgent(t, cs, &allocatorOptions{Min: 256, Max: 260, Timeout: 10 * time.Second})
	got, err := ag.alloc.Allocate(ctxTimeout(t, 10*time.Second), lbls)
	if err != nil {
		t.Fatal(err)
	}
	if got.ID == start {
		t.Fatalf("took %d, which has other labels", start)
	}
	if obj := cs.cids(t)[start.StringID()]; labelsKey(obj) != labels.ParseLabels("k8s:app=other").SortedList() {
		t.Errorf("object %d was changed: %v", start, obj.SecurityLabels)
	}
}

// When another agent created the same labels first under another number,
// the agent that created a duplicate uses the first and deletes its own.
func TestConvergeOnFirstCreated(t *testing.T) {
	cs := newFakeClientset()
	lbls := labels.ParseLabels("k8s:app=web", "k8s:io.kubernetes.pod.namespace=prod")
	var once sync.Once
	cs.cilium.PrependReactor("create", "ciliumidentities", func(action k8stesting.Action) (bool, runtime.Object, error) {
		// The API server stamps the creation time; the fake does not.
		action.(k8stesting.CreateAction).GetObject().(*ciliumv2.CiliumIdentity).CreationTimestamp = metav1.Now()
		once.Do(func() {
			// Another agent's identity, created an hour earlier.
			if err := cs.cilium.Tracker().Add(cidObject("60000", time.Now().Add(-time.Hour), lbls.Strings()...)); err != nil {
				t.Error(err)
			}
		})
		return false, nil, nil
	})
	// Reactors must be in place before the fake is used concurrently.
	ag := startAgent(t, cs, nil)
	// The other agent's identity must reach the table as on a real API
	// server, which the fake guarantees only once the mirror watches.
	cs.waitWatching(t)
	got, err := ag.alloc.Allocate(ctxTimeout(t, 10*time.Second), lbls)
	if err != nil || got.ID != 60000 {
		t.Fatalf("Allocate = %v, %v; want the first-created 60000", got, err)
	}
	objs := cs.cids(t)
	if len(objs) != 1 || objs["60000"] == nil {
		t.Errorf("objects %v, want only 60000 (the duplicate deleted)", slices.Collect(maps.Keys(objs)))
	}
}

// Two agents (two hives on one API) allocate the same label sets at once,
// several goroutines each: one object per label set, same numbers.
func TestConcurrentAgentsConverge(t *testing.T) {
	cs := newFakeClientset()
	agents := []*testAgent{startAgent(t, cs, nil), startAgent(t, cs, nil)}
	ctx := ctxTimeout(t, 30*time.Second)
	const sets, perAgent = 10, 3
	got := make([][]identity.NumericIdentity, len(agents))
	var (
		wg sync.WaitGroup
		mu sync.Mutex
	)
	for ai, ag := range agents {
		got[ai] = make([]identity.NumericIdentity, sets)
		for s := range sets {
			for range perAgent {
				wg.Go(func() {
					id, err := ag.alloc.Allocate(ctx, podLabels(fmt.Sprintf("app-%d", s), "race"))
					if err != nil {
						t.Error(err)
						return
					}
					mu.Lock()
					defer mu.Unlock()
					if prev := got[ai][s]; prev != 0 && prev != id.ID {
						t.Errorf("agent %d got %d and %d for set %d", ai, prev, id.ID, s)
					}
					got[ai][s] = id.ID
				})
			}
		}
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	if !slices.Equal(got[0], got[1]) {
		t.Errorf("agents disagree: %v vs %v", got[0], got[1])
	}
	if n := len(cs.cids(t)); n != sets {
		t.Errorf("%d CiliumIdentity objects, want %d", n, sets)
	}
	for ai, ag := range agents {
		for s, id := range got[ai] {
			if r := ag.refs(id); r != perAgent {
				t.Errorf("agent %d set %d: refs %d, want %d", ai, s, r, perAgent)
			}
		}
	}
}

// An identity in use that disappears from the API (the operator's GC
// racing with a new user) is created again with the same number and
// labels; a heartbeat mark put on it later is removed.
func TestRecreateAfterDeletion(t *testing.T) {
	cs := newFakeClientset()
	ag := startAgent(t, cs, nil)
	ctx := ctxTimeout(t, 20*time.Second)
	lbls := podLabels("web", "prod")
	id, err := ag.alloc.Allocate(ctx, lbls)
	if err != nil {
		t.Fatal(err)
	}
	client := cs.cilium.CiliumV2().CiliumIdentities()
	if err := client.Delete(ctx, id.ID.StringID(), metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the identity re-created", func() error {
		obj, ok := cs.cids(t)[id.ID.StringID()]
		if !ok {
			return fmt.Errorf("not there")
		}
		if labelsKey(obj) != lbls.SortedList() {
			return fmt.Errorf("labels %v", obj.SecurityLabels)
		}
		return nil
	})

	obj, err := client.Get(ctx, id.ID.StringID(), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	obj.Annotations = map[string]string{ciliumv2.HeartbeatAnnotation: time.Now().Format(time.RFC3339Nano)}
	if _, err := client.Update(ctx, obj, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the mark removed", func() error {
		if o := cs.cids(t)[id.ID.StringID()]; o == nil || marked(o) {
			return fmt.Errorf("marked or gone: %v", o)
		}
		return nil
	})

	// Once released, a deleted identity stays deleted. An identity still in
	// use, deleted right after it, is re-created: the watch and the
	// reconciler got past the first deletion, so its absence means
	// something.
	other, err := ag.alloc.Allocate(ctx, podLabels("db", "prod"))
	if err != nil {
		t.Fatal(err)
	}
	if err := ag.alloc.Release(ctx, id.ID); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{id.ID.StringID(), other.ID.StringID()} {
		if err := client.Delete(ctx, n, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, "the identity in use re-created", func() error {
		if _, ok := cs.cids(t)[other.ID.StringID()]; !ok {
			return fmt.Errorf("not there")
		}
		return nil
	})
	if _, ok := cs.cids(t)[id.ID.StringID()]; ok {
		t.Error("a released identity was re-created")
	}
}

// A number that was deleted and taken by other labels cannot be restored:
// the allocation reports a conflict in its status.
func TestRecreateConflict(t *testing.T) {
	cs := newFakeClientset()
	ag := startAgent(t, cs, nil)
	ctx := ctxTimeout(t, 20*time.Second)
	id, err := ag.alloc.Allocate(ctx, podLabels("web", "prod"))
	if err != nil {
		t.Fatal(err)
	}
	// Deleted and created again by another agent for other labels; the
	// watch may show only the end result, an update.
	if err := cs.cilium.Tracker().Update(ciliumv2.SchemeGroupVersion.WithResource("ciliumidentities"),
		cidObject(id.ID.StringID(), time.Now(), "k8s:app=thief"), ""); err != nil {
		t.Fatal(err)
	}
	eventually(t, "a conflict in the allocation's status", func() error {
		row, _, ok := ag.alloc.allocs.Get(ag.db.ReadTxn(), identity.AllocationIDIndex.Query(id.ID))
		if !ok {
			return fmt.Errorf("row gone")
		}
		if row.Status.Error == "" {
			return fmt.Errorf("status %v", row.Status)
		}
		t.Logf("status: %v", row.Status)
		return nil
	})
}

// An allocation waits for the first list of CiliumIdentities and gives up
// with the context.
func TestAllocateWaitsForList(t *testing.T) {
	cs := newFakeClientset()
	block := make(chan struct{})
	cs.cilium.PrependReactor("list", "ciliumidentities", func(k8stesting.Action) (bool, runtime.Object, error) {
		<-block
		return false, nil, nil
	})
	ag := startAgent(t, cs, nil)
	defer close(block)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	_, err := ag.alloc.Allocate(ctx, podLabels("web", "prod"))
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Allocate = %v, want a deadline error", err)
	}
	t.Logf("error: %v", err)
}

func TestProbeStartIsStable(t *testing.T) {
	// Agents of every version must try the same numbers for the same labels,
	// or concurrent allocations stop converging: pin the function. With the
	// default range these labels start at 256+1039 = 1295.
	key := podLabels("web", "prod").SortedList()
	if got := probeStart(key, 65280); got != 1039 {
		t.Fatalf("probeStart(%q, 65280) = %d, want 1039", key, got)
	}
}

// `kubectl get ciliumid -l app=web` works: an identity's Kubernetes-sourced
// security labels are its metadata labels, keyed without the "k8s:"
// source; keys and values Kubernetes would reject are left out (they stay
// in security-labels) instead of failing the Create.
func TestIdentitySelectableByLabel(t *testing.T) {
	cs := newFakeClientset()
	ag := startAgent(t, cs, nil)
	ctx := ctxTimeout(t, 10*time.Second)
	long := strings.Repeat("x", 64)
	lbls := labels.ParseLabels("k8s:app=web", "k8s:io.kubernetes.pod.namespace=prod",
		"k8s:io.cilium.k8s.namespace.labels.kubernetes.io/metadata.name=prod",
		"k8s:tier="+long, "k8s:version=1.0 beta", "k8s:bad key=v", "k8s:-dash=v")
	web, err := ag.alloc.Allocate(ctx, lbls)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ag.alloc.Allocate(ctx, podLabels("db", "prod")); err != nil {
		t.Fatal(err)
	}
	obj := cs.cids(t)[web.ID.StringID()]
	want := map[string]string{
		"app": "web", "io.kubernetes.pod.namespace": "prod",
		"io.cilium.k8s.namespace.labels.kubernetes.io/metadata.name": "prod",
	}
	if !maps.Equal(obj.Labels, want) {
		t.Errorf("metadata.labels = %v, want %v", obj.Labels, want)
	}
	if obj.SecurityLabels["k8s:tier"] != long || obj.SecurityLabels["k8s:version"] != "1.0 beta" {
		t.Errorf("security-labels lost the labels invalid for Kubernetes: %v", obj.SecurityLabels)
	}
	list, err := cs.cilium.CiliumV2().CiliumIdentities().List(ctx, metav1.ListOptions{LabelSelector: "app=web"})
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Items) != 1 || list.Items[0].Name != web.ID.StringID() {
		t.Fatalf("-l app=web lists %d identities, want only %s", len(list.Items), web.ID.StringID())
	}
}

func TestMetadataLabels(t *testing.T) {
	for _, tc := range []struct {
		in   []string
		want map[string]string
	}{
		{nil, nil},
		{[]string{"reserved:host"}, nil},
		{[]string{"k8s:app=web", "container:other=x"}, map[string]string{"app": "web"}},
		{[]string{"k8s:app.kubernetes.io/name=web"}, map[string]string{"app.kubernetes.io/name": "web"}},
		{[]string{"k8s:empty="}, map[string]string{"empty": ""}},
		{[]string{"k8s:a/b/c=v", "k8s:x=ends-"}, nil},
	} {
		got := metadataLabels(labels.ParseLabels(tc.in...))
		if !maps.Equal(got, tc.want) || (got == nil) != (tc.want == nil) {
			t.Errorf("metadataLabels(%v) = %v, want %v", tc.in, got, tc.want)
		}
	}
}
