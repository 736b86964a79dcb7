package e2enetpol

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
)

// Placement records on which nodes the specs' pods ran: it watches every
// pod outside kube-system and notes, per pod, the node it was bound to and
// when the watch first saw it bound. Specs run one after the other, so the
// pods bound while a spec ran are that spec's.
type Placement struct {
	mu    sync.Mutex
	bound []binding
	seen  map[string]bool
}

type binding struct {
	at   time.Time
	node string
}

// WatchPlacement starts recording the pods of the cluster kubeconfig
// reaches; it stops when ctx ends. It returns once the watch has synced.
//
// Errors: the kubeconfig cannot be read, or the watch does not sync in a
// minute.
func WatchPlacement(ctx context.Context, kubeconfig string) (*Placement, error) {
	rc, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("watch pod placement: %w", err)
	}
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("watch pod placement: %w", err)
	}
	p := &Placement{seen: map[string]bool{}}
	lw := cache.NewListWatchFromClient(cs.CoreV1().RESTClient(), "pods", corev1.NamespaceAll,
		fields.OneTermNotEqualSelector("metadata.namespace", "kube-system"))
	_, ctrl := cache.NewInformerWithOptions(cache.InformerOptions{
		ListerWatcher: lw,
		ObjectType:    &corev1.Pod{},
		Handler: cache.ResourceEventHandlerFuncs{
			AddFunc:    p.note,
			UpdateFunc: func(_, obj any) { p.note(obj) },
		},
	})
	go ctrl.RunWithContext(ctx)
	syncCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if !cache.WaitForCacheSync(syncCtx.Done(), ctrl.HasSynced) {
		return nil, fmt.Errorf("watch pod placement: the pod watch did not sync in a minute")
	}
	return p, nil
}

func (p *Placement) note(obj any) {
	pod, ok := obj.(*corev1.Pod)
	if !ok || pod.Spec.NodeName == "" {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.seen[string(pod.UID)] {
		return
	}
	p.seen[string(pod.UID)] = true
	p.bound = append(p.bound, binding{at: time.Now(), node: pod.Spec.NodeName})
}

// Nodes returns, sorted, the nodes of the pods bound from start to end.
// A nil Placement returns nil.
func (p *Placement) Nodes(start, end time.Time) []string {
	if p == nil {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	var nodes []string
	for _, b := range p.bound {
		if !b.at.Before(start) && !b.at.After(end) && !slices.Contains(nodes, b.node) {
			nodes = append(nodes, b.node)
		}
	}
	slices.Sort(nodes)
	return nodes
}
