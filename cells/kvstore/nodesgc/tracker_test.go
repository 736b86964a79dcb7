package nodesgc

import (
	"slices"
	"testing"
	"time"
)

// fakeLookups answers from sets of node names.
type fakeLookups struct {
	ciliumNodes, agents map[string]bool
}

func (f fakeLookups) ciliumNodeExists(n string) bool { return f.ciliumNodes[n] }
func (f fakeLookups) agentRunning(n string) bool     { return f.agents[n] }

func TestTrackerGraceThenRemove(t *testing.T) {
	t0 := time.Unix(1000, 0)
	tr := newTracker(time.Minute)
	l := fakeLookups{ciliumNodes: map[string]bool{"kept": true}}
	tr.put("k/gone", "gone", 5, l, t0)
	tr.put("k/kept", "kept", 6, l, t0)

	if v := tr.check("k/gone", l, t0.Add(59*time.Second)); v != notDue {
		t.Fatalf("within the grace period: %v, want notDue", v)
	}
	if got := tr.dueKeys(t0.Add(59 * time.Second)); len(got) != 0 {
		t.Fatalf("due within the grace period: %v", got)
	}
	if n := tr.next(); !n.Equal(t0.Add(time.Minute)) {
		t.Fatalf("next = %v, want %v", n, t0.Add(time.Minute))
	}
	at := t0.Add(time.Minute)
	due := tr.dueKeys(at)
	slices.Sort(due)
	if !slices.Equal(due, []string{"k/gone", "k/kept"}) {
		t.Fatalf("due after the grace period: %v", due)
	}
	if v := tr.check("k/gone", l, at); v != remove {
		t.Errorf("no CiliumNode, no agent: %v, want remove", v)
	}
	if v := tr.check("k/kept", l, at); v != keep {
		t.Errorf("with its CiliumNode: %v, want keep", v)
	}
	// A kept key waits for its CiliumNode to go: not due, however late.
	if v := tr.check("k/kept", l, at.Add(time.Hour)); v != notDue {
		t.Errorf("kept key checked again without a CiliumNode change: %v", v)
	}
	tr.ciliumNodesChanged(l, at.Add(time.Hour)) // still there
	if got := tr.dueKeys(at.Add(2 * time.Hour)); slices.Contains(got, "k/kept") {
		t.Errorf("kept key due while its CiliumNode exists: %v", got)
	}
	delete(l.ciliumNodes, "kept")
	tr.ciliumNodesChanged(l, at.Add(2*time.Hour))
	if v := tr.check("k/kept", l, at.Add(2*time.Hour)); v != remove {
		t.Errorf("CiliumNode deleted: %v, want remove at once", v)
	}
}

// A CiliumNode seen and then deleted makes its key due at once, even
// within the grace period; a CiliumNodes change does not hurry a key whose
// CiliumNode never was seen (a joining node's may be on its way).
func TestTrackerCiliumNodeDeletedInGrace(t *testing.T) {
	t0 := time.Unix(1000, 0)
	tr := newTracker(time.Minute)
	l := fakeLookups{ciliumNodes: map[string]bool{"had": true}}
	tr.put("k/had", "had", 1, l, t0)
	tr.put("k/new", "new", 2, l, t0)
	tr.put("k/later", "later", 3, l, t0)
	l.ciliumNodes["later"] = true
	tr.ciliumNodesChanged(l, t0.Add(time.Second)) // later's appears
	delete(l.ciliumNodes, "had")
	delete(l.ciliumNodes, "later")
	at := t0.Add(2 * time.Second)
	tr.ciliumNodesChanged(l, at)
	got := tr.dueKeys(at)
	slices.Sort(got)
	if !slices.Equal(got, []string{"k/had", "k/later"}) {
		t.Errorf("due after their CiliumNodes went: %v, want k/had and k/later (not k/new)", got)
	}
	if v := tr.check("k/new", l, at); v != notDue {
		t.Errorf("k/new within its grace period: %v", v)
	}
}

func TestTrackerRewriteRestartsGrace(t *testing.T) {
	t0 := time.Unix(1000, 0)
	tr := newTracker(time.Minute)
	l := fakeLookups{}
	tr.put("k/n", "n", 5, l, t0)
	tr.put("k/n", "n", 5, l, t0.Add(50*time.Second)) // listed again, same revision
	if v := tr.check("k/n", l, t0.Add(time.Minute)); v != remove {
		t.Fatalf("same revision listed again moved the schedule: %v", v)
	}
	tr.put("k/n", "n", 7, l, t0.Add(time.Minute)) // written again
	if v := tr.check("k/n", l, t0.Add(90*time.Second)); v != notDue {
		t.Fatalf("rewritten key checked before a new grace period: %v", v)
	}
	tr.forget("k/n")
	if v := tr.check("k/n", l, t0.Add(time.Hour)); v != notDue || len(tr.keys) != 0 {
		t.Fatalf("forgotten key: %v, %d keys", v, len(tr.keys))
	}
}

func TestTrackerAgentRunningBacksOff(t *testing.T) {
	t0 := time.Unix(1000, 0)
	tr := newTracker(0)
	l := fakeLookups{agents: map[string]bool{"n": true}}
	tr.put("k/n", "n", 5, l, t0)
	now := t0
	var waits []time.Duration
	for range 10 {
		if v := tr.check("k/n", l, now); v != agentRunning {
			t.Fatalf("agent running: %v", v)
		}
		next := tr.next()
		waits = append(waits, next.Sub(now))
		now = next
	}
	want := []time.Duration{1, 2, 4, 8, 16, 32, 64, 120, 120, 120}
	for i := range want {
		want[i] *= time.Second
	}
	if !slices.Equal(waits, want) {
		t.Errorf("backoff %v, want %v", waits, want)
	}
	delete(l.agents, "n")
	if v := tr.check("k/n", l, now); v != remove {
		t.Errorf("agent gone: %v, want remove", v)
	}
	tr.failed("k/n", now)
	if next := tr.next(); next.Sub(now) != 2*time.Minute {
		t.Errorf("after a failed delete: retry in %v", next.Sub(now))
	}
}

func TestTrackerRetain(t *testing.T) {
	tr := newTracker(time.Minute)
	now := time.Unix(1000, 0)
	l := fakeLookups{}
	tr.put("a", "a", 1, l, now)
	tr.put("b", "b", 1, l, now)
	tr.retain(func(k string) bool { return k == "b" })
	if _, ok := tr.keys["a"]; ok || len(tr.keys) != 1 {
		t.Errorf("after retain: %v", tr.keys)
	}
}

func TestConfigValidate(t *testing.T) {
	if err := DefaultConfig.Validate(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	for _, c := range []Config{
		{ClusterName: "", CiliumPodLabels: "a=b"},
		{ClusterName: "a/b", CiliumPodLabels: "a=b"},
		{ClusterName: "c", CiliumPodLabels: "a=(b"},
	} {
		if err := c.Validate(); err == nil {
			t.Errorf("%+v: no error", c)
		}
	}
}
