package lbevents

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/cilium/statedb"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	k8stables "github.com/cellium/cellium/statedb/k8s"
	"github.com/cellium/cellium/statedb/lb"
)

// Component is the source component of the Events.
const Component = "cellium-agent"

// RetryInterval is how long a failed Event waits before it is tried again.
const RetryInterval = 5 * time.Second

// Config is what an Emitter reads and writes.
type Config struct {
	DB     *statedb.DB
	States statedb.Table[*lb.ServiceState]
	// Services and Pods give the objects' UIDs (may be nil: the Event
	// then names the object without its UID).
	Services statedb.Table[*corev1.Service]
	Pods     statedb.Table[*corev1.Pod]
	// Core creates the Events (core/v1 events: create).
	Core kubernetes.Interface
	// NodeName is the Events' source host: every agent reports what it
	// refuses.
	NodeName string
	Log      *slog.Logger
}

// Emitter writes one Warning Event per new state (or new message) of a
// row of the states table. Create it with New; Run it in one goroutine.
type Emitter struct {
	c Config
	// sent is the message of each owner's last Event written; an owner
	// whose row went is forgotten, so that a recurrence is reported.
	sent map[string]string
}

// New returns an Emitter; it starts nothing.
func New(c Config) *Emitter {
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	return &Emitter{c: c, sent: map[string]string{}}
}

// Run writes Events until ctx ends.
func (e *Emitter) Run(ctx context.Context, health interface {
	OK(string)
	Degraded(string, error)
}) {
	for {
		w, failed := e.Step(ctx)
		if failed > 0 {
			health.Degraded("write Events", fmt.Errorf("%d Events failed; retrying", failed))
			w = after(RetryInterval)
		} else {
			health.OK(fmt.Sprintf("%d Services or pods not served as asked", len(e.sent)))
		}
		select {
		case <-ctx.Done():
			return
		case <-w:
		}
	}
}

func after(d time.Duration) <-chan struct{} {
	ch := make(chan struct{})
	time.AfterFunc(d, func() { close(ch) })
	return ch
}

// Step writes the Events of the rows not reported yet. It returns a
// channel closed when the table changes and how many Events failed.
func (e *Emitter) Step(ctx context.Context) (<-chan struct{}, int) {
	rtxn := e.c.DB.ReadTxn()
	rows, w := e.c.States.AllWatch(rtxn)
	seen := map[string]bool{}
	failed := 0
	for s := range rows {
		seen[s.Owner] = true
		if e.sent[s.Owner] == s.State+s.Message {
			continue
		}
		e.c.Log.Warn("Service not served as asked", "owner", s.Owner, "state", s.State, "reason", s.Reason, "message", s.Message)
		if err := e.event(ctx, rtxn, s); err != nil {
			e.c.Log.Warn("Could not write the Event", "owner", s.Owner, "error", err)
			failed++
			continue
		}
		e.sent[s.Owner] = s.State + s.Message
	}
	for owner := range e.sent {
		if !seen[owner] {
			delete(e.sent, owner)
		}
	}
	return w, failed
}

// event creates the Warning Event of s on its Service or pod.
func (e *Emitter) event(ctx context.Context, rtxn statedb.ReadTxn, s *lb.ServiceState) error {
	ns, name := s.Object()
	ref := corev1.ObjectReference{APIVersion: "v1", Kind: "Service", Namespace: ns, Name: name}
	if s.IsPod() {
		ref.Kind = "Pod"
		if e.c.Pods != nil {
			if p, _, ok := e.c.Pods.Get(rtxn, k8stables.NameIndex[*corev1.Pod]().Query(ns+"/"+name)); ok {
				ref.UID, ref.ResourceVersion = p.UID, p.ResourceVersion
			}
		}
	} else if e.c.Services != nil {
		if svc, _, ok := e.c.Services.Get(rtxn, k8stables.NameIndex[*corev1.Service]().Query(ns+"/"+name)); ok {
			ref.UID, ref.ResourceVersion = svc.UID, svc.ResourceVersion
		}
	}
	now := metav1.Now()
	msg := s.Message
	if e.c.NodeName != "" {
		msg = "node " + e.c.NodeName + ": " + msg
	}
	ev := &corev1.Event{
		ObjectMeta:     metav1.ObjectMeta{Name: fmt.Sprintf("%s.%x", name, now.UnixNano()), Namespace: ns},
		InvolvedObject: ref,
		Reason:         s.Reason, Message: msg, Type: corev1.EventTypeWarning,
		Source:         corev1.EventSource{Component: Component, Host: e.c.NodeName},
		FirstTimestamp: now, LastTimestamp: now, Count: 1,
		ReportingController: "cellium.io/" + Component, ReportingInstance: e.c.NodeName,
	}
	if _, err := e.c.Core.CoreV1().Events(ns).Create(ctx, ev, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create Event on %s %s/%s: %w", ref.Kind, ns, name, err)
	}
	return nil
}
