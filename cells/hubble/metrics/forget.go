package metrics

import (
	"sync"
	"time"
)

// podKey is a pod's namespace and name.
type podKey struct{ namespace, name string }

// Forgetter removes the series of deleted pods after a grace period (so
// that the last counts are scraped), as Hubble does a minute after a pod's
// CiliumEndpoint is deleted. A pod created again under the same name
// within the grace period keeps its series. It is safe for concurrent use.
type Forgetter struct {
	metrics *Metrics
	grace   time.Duration

	mu      sync.Mutex
	pending map[podKey]time.Time
}

// NewForgetter forgets the pods of m grace after their deletion.
func NewForgetter(m *Metrics, grace time.Duration) *Forgetter {
	return &Forgetter{metrics: m, grace: grace, pending: map[podKey]time.Time{}}
}

// Deleted records that the pod went at now.
func (f *Forgetter) Deleted(namespace, name string, now time.Time) {
	f.mu.Lock()
	f.pending[podKey{namespace, name}] = now.Add(f.grace)
	f.mu.Unlock()
}

// Exists records that the pod exists (again): its series stay.
func (f *Forgetter) Exists(namespace, name string) {
	f.mu.Lock()
	delete(f.pending, podKey{namespace, name})
	f.mu.Unlock()
}

// Pending is how many deleted pods wait for their grace period to end.
func (f *Forgetter) Pending() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.pending)
}

// Forget deletes the series of the pods whose grace period ended by now,
// and returns how many series went.
func (f *Forgetter) Forget(now time.Time) int {
	var due []podKey
	f.mu.Lock()
	for k, at := range f.pending {
		if !now.Before(at) {
			due = append(due, k)
			delete(f.pending, k)
		}
	}
	f.mu.Unlock()
	n := 0
	for _, k := range due {
		n += f.metrics.ForgetPod(k.namespace, k.name)
	}
	return n
}
