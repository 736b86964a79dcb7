package lbevents_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/cilium/statedb"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/cellium/cellium/cells/lbevents"
	k8stables "github.com/cellium/cellium/statedb/k8s"
	"github.com/cellium/cellium/statedb/lb"
)

type health struct{ err error }

func (h *health) OK(string)                  { h.err = nil }
func (h *health) Degraded(_ string, e error) { h.err = e }

// Each new state of a Service or pod becomes one Warning Event on it
// (with its UID, the reason and the message naming the node); an
// unchanged state is not reported again; a state that goes and comes back
// is; a failed Event is retried.
func TestEmitterWritesWarningEvents(t *testing.T) {
	db := statedb.New()
	states, err := lb.NewServiceStatesTable(db)
	if err != nil {
		t.Fatal(err)
	}
	svcs, err := k8stables.NewServicesTable(db)
	if err != nil {
		t.Fatal(err)
	}
	pods, err := k8stables.NewPodsTable(db)
	if err != nil {
		t.Fatal(err)
	}
	wtxn := db.WriteTxn(svcs, pods)
	_, _, _ = svcs.Insert(wtxn, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "big", UID: "uid-big"}})
	_, _, _ = pods.Insert(wtxn, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p", UID: "uid-p"}})
	wtxn.Commit()
	cs := fake.NewClientset()
	e := lbevents.New(lbevents.Config{DB: db, States: states, Services: svcs, Pods: pods, Core: cs, NodeName: "node1"})
	put := func(ss ...*lb.ServiceState) {
		wtxn := db.WriteTxn(states)
		_ = states.DeleteAll(wtxn)
		for _, s := range ss {
			_, _, _ = states.Insert(wtxn, s)
		}
		wtxn.Commit()
	}
	events := func() []corev1.Event {
		l, err := cs.CoreV1().Events("ns").List(context.Background(), metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return l.Items
	}
	refused := &lb.ServiceState{Owner: "ns/big", State: lb.StateRefused, Reason: lb.ReasonLBMapFull,
		Message: "its 40 frontends ... (raise --bpf-lb-map-max, or make the Service smaller)"}
	conflict := &lb.ServiceState{Owner: "ns/p/host-port", State: lb.StateRefused, Reason: lb.ReasonFrontendConflict,
		Message: "NodePort frontend 0.0.0.0:30080/TCP is owned by Service ns/svc1"}
	put(refused, conflict)
	ctx := context.Background()
	if _, failed := e.Step(ctx); failed != 0 {
		t.Fatalf("%d failed", failed)
	}
	evs := events()
	if len(evs) != 2 {
		t.Fatalf("%d Events, want 2: %+v", len(evs), evs)
	}
	byKind := map[string]corev1.Event{}
	for _, ev := range evs {
		byKind[ev.InvolvedObject.Kind] = ev
	}
	if ev := byKind["Service"]; ev.InvolvedObject.Name != "big" || ev.InvolvedObject.UID != "uid-big" || ev.Type != corev1.EventTypeWarning ||
		ev.Reason != lb.ReasonLBMapFull || !strings.HasPrefix(ev.Message, "node node1: ") || !strings.Contains(ev.Message, "--bpf-lb-map-max") {
		t.Errorf("Service Event %+v", ev)
	}
	if ev := byKind["Pod"]; ev.InvolvedObject.Name != "p" || ev.InvolvedObject.UID != "uid-p" || ev.Reason != lb.ReasonFrontendConflict {
		t.Errorf("Pod Event %+v", ev)
	}
	// Nothing new: no Event.
	e.Step(ctx)
	if n := len(events()); n != 2 {
		t.Fatalf("%d Events after an unchanged step, want 2", n)
	}
	// The conflict goes and comes back, the refusal stays: one more.
	put(refused)
	e.Step(ctx)
	put(refused, conflict)
	e.Step(ctx)
	if n := len(events()); n != 3 {
		t.Fatalf("%d Events after the conflict came back, want 3", n)
	}
	// The API server refuses: counted as failed, then retried.
	cs.PrependReactor("create", "events", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, errors.New("forbidden")
	})
	put(refused, conflict, &lb.ServiceState{Owner: "ns/other", State: lb.StateDegraded, Reason: lb.ReasonInvalidEndpoints, Message: "x"})
	if _, failed := e.Step(ctx); failed != 1 {
		t.Fatalf("failed %d, want 1", failed)
	}
	cs.ReactionChain = cs.ReactionChain[1:]
	e.Step(ctx)
	if n := len(events()); n != 4 {
		t.Fatalf("%d Events after the retry, want 4", n)
	}
}

// Run reports health and ends with its context.
func TestEmitterRun(t *testing.T) {
	db := statedb.New()
	states, err := lb.NewServiceStatesTable(db)
	if err != nil {
		t.Fatal(err)
	}
	cs := fake.NewClientset()
	e := lbevents.New(lbevents.Config{DB: db, States: states, Core: cs})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	h := &health{}
	go func() { e.Run(ctx, h); close(done) }()
	wtxn := db.WriteTxn(states)
	_, _, _ = states.Insert(wtxn, &lb.ServiceState{Owner: "ns/s", State: lb.StateRefused, Reason: lb.ReasonLBMapFull, Message: "m"})
	wtxn.Commit()
	deadline := time.Now().Add(10 * time.Second)
	for {
		l, _ := cs.CoreV1().Events("ns").List(ctx, metav1.ListOptions{})
		if len(l.Items) == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no Event written by Run")
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	<-done
}

// A host socket on a Service's NodePort or a pod's hostPort (the
// HostPortInUse rows, owner ".../host-socket") is a Warning Event on the
// Service or pod itself, beside the deriver's row of the same object.
func TestEmitterHostPortInUse(t *testing.T) {
	db := statedb.New()
	states, err := lb.NewServiceStatesTable(db)
	if err != nil {
		t.Fatal(err)
	}
	svcs, err := k8stables.NewServicesTable(db)
	if err != nil {
		t.Fatal(err)
	}
	pods, err := k8stables.NewPodsTable(db)
	if err != nil {
		t.Fatal(err)
	}
	wtxn := db.WriteTxn(svcs, pods, states)
	_, _, _ = svcs.Insert(wtxn, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web", UID: "uid-web"}})
	_, _, _ = pods.Insert(wtxn, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p", UID: "uid-p"}})
	for _, s := range []*lb.ServiceState{
		{Owner: "ns/web", State: lb.StateDegraded, Reason: lb.ReasonInvalidEndpoints, Message: "skipped endpoints: x"},
		{Owner: lb.HostSocketOwner("ns/web"), State: lb.StateDegraded, Reason: lb.ReasonHostPortInUse,
			Message: "NodePort 30080/TCP: a host socket is bound to 0.0.0.0:30080 by nginx (pid 812). Traffic from outside the node to the port goes to the Service"},
		{Owner: lb.HostSocketOwner(lb.HostPortOwner("ns/p")), State: lb.StateDegraded, Reason: lb.ReasonHostPortInUse,
			Message: "HostPort 8053/UDP: a host socket is bound to [::]:8053. Traffic from outside the node to the port goes to the pod"},
	} {
		_, _, _ = states.Insert(wtxn, s)
	}
	wtxn.Commit()
	cs := fake.NewClientset()
	e := lbevents.New(lbevents.Config{DB: db, States: states, Services: svcs, Pods: pods, Core: cs, NodeName: "node1"})
	if _, failed := e.Step(context.Background()); failed != 0 {
		t.Fatalf("%d failed", failed)
	}
	l, err := cs.CoreV1().Events("ns").List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	byReason := map[string][]corev1.Event{}
	for _, ev := range l.Items {
		byReason[ev.Reason] = append(byReason[ev.Reason], ev)
	}
	if n := len(byReason[lb.ReasonInvalidEndpoints]); n != 1 || len(l.Items) != 3 {
		t.Fatalf("Events %+v, want one InvalidEndpoints and two HostPortInUse", l.Items)
	}
	got := map[string]corev1.Event{}
	for _, ev := range byReason[lb.ReasonHostPortInUse] {
		got[ev.InvolvedObject.Kind] = ev
	}
	if ev := got["Service"]; ev.InvolvedObject.Name != "web" || ev.InvolvedObject.UID != "uid-web" || ev.Type != corev1.EventTypeWarning ||
		ev.Message != "node node1: NodePort 30080/TCP: a host socket is bound to 0.0.0.0:30080 by nginx (pid 812). Traffic from outside the node to the port goes to the Service" {
		t.Errorf("Service Event %+v", ev)
	}
	if ev := got["Pod"]; ev.InvolvedObject.Name != "p" || ev.InvolvedObject.UID != "uid-p" || ev.Type != corev1.EventTypeWarning ||
		!strings.Contains(ev.Message, "[::]:8053") {
		t.Errorf("Pod Event %+v", ev)
	}
}
