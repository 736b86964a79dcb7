package nodesgc

import (
	"time"
)

// Cilium's timings (operator/pkg/kvstore/nodesgc).
const (
	// DefaultGrace is how long after a key is written or first seen it is
	// checked: time for a new node's CiliumNode to appear.
	DefaultGrace = time.Minute
	// minRetry and maxRetry bound the backoff while an agent pod still
	// runs on the node or the deletion fails.
	minRetry = time.Second
	maxRetry = 2 * time.Minute
)

// lookups answer the questions about a node the collector asks the
// Kubernetes side.
type lookups interface {
	// ciliumNodeExists is true while the CiliumNode name exists.
	ciliumNodeExists(name string) bool
	// agentRunning is true while an agent pod runs on node name.
	agentRunning(name string) bool
}

// candidate is a node key of the cluster, as last seen.
type candidate struct {
	node string
	rev  int64 // mod revision of the key
	// due is when to check it next; zero while its CiliumNode exists
	// (it is checked again when the CiliumNode goes).
	due   time.Time
	retry time.Duration // the next backoff
	// hadCN is true once its CiliumNode was seen: its deletion makes the
	// key due at once, grace period or not (Cilium's reaction to a
	// deleted CiliumNode).
	hadCN bool
}

// verdict is what check decided about a key.
type verdict int

const (
	notDue       verdict = iota
	keep                 // its CiliumNode exists
	agentRunning         // retried after a backoff
	remove               // to be deleted
)

// tracker keeps the node keys of the cluster and decides when each is
// stale. It does no I/O: the caller feeds it the keys and deletes what
// it says.
type tracker struct {
	grace time.Duration
	keys  map[string]*candidate // by etcd key
}

func newTracker(grace time.Duration) *tracker {
	return &tracker{grace: grace, keys: map[string]*candidate{}}
}

// put records that key (node's) was written at rev, or seen when listed;
// it is checked one grace period later. A key seen again at the same
// revision (a new listing) keeps its schedule.
func (t *tracker) put(key, node string, rev int64, l lookups, now time.Time) {
	if c, ok := t.keys[key]; ok && c.rev == rev {
		return
	}
	t.keys[key] = &candidate{node: node, rev: rev, due: now.Add(t.grace), retry: minRetry, hadCN: l.ciliumNodeExists(node)}
}

// forget drops key (deleted, or no longer a node key it understands).
func (t *tracker) forget(key string) { delete(t.keys, key) }

// retain drops every key for which keep is false (after a new listing).
func (t *tracker) retain(keep func(key string) bool) {
	for k := range t.keys {
		if !keep(k) {
			delete(t.keys, k)
		}
	}
}

// ciliumNodesChanged makes every key whose CiliumNode was seen and is
// gone due now. A key whose CiliumNode never was seen keeps its schedule:
// a new node's CiliumNode may not exist yet.
func (t *tracker) ciliumNodesChanged(l lookups, now time.Time) {
	for _, c := range t.keys {
		switch exists := l.ciliumNodeExists(c.node); {
		case exists:
			c.hadCN = true
		case c.hadCN:
			c.hadCN, c.due, c.retry = false, now, minRetry
		}
	}
}

// check decides about key at now, and reschedules it.
func (t *tracker) check(key string, l lookups, now time.Time) verdict {
	c, ok := t.keys[key]
	if !ok || c.due.IsZero() || now.Before(c.due) {
		return notDue
	}
	if l.ciliumNodeExists(c.node) {
		c.due, c.retry, c.hadCN = time.Time{}, minRetry, true
		return keep
	}
	if l.agentRunning(c.node) {
		t.backoff(c, now)
		return agentRunning
	}
	return remove
}

// failed reschedules key after a failed deletion.
func (t *tracker) failed(key string, now time.Time) {
	if c, ok := t.keys[key]; ok {
		t.backoff(c, now)
	}
}

func (t *tracker) backoff(c *candidate, now time.Time) {
	c.due = now.Add(c.retry)
	c.retry = min(2*c.retry, maxRetry)
}

// next is the earliest due time (zero if none).
func (t *tracker) next() time.Time {
	var n time.Time
	for _, c := range t.keys {
		if !c.due.IsZero() && (n.IsZero() || c.due.Before(n)) {
			n = c.due
		}
	}
	return n
}

// dueKeys lists the keys due at now.
func (t *tracker) dueKeys(now time.Time) []string {
	var out []string
	for k, c := range t.keys {
		if !c.due.IsZero() && !now.Before(c.due) {
			out = append(out, k)
		}
	}
	return out
}
