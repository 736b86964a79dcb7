package soak

import (
	"fmt"
	"io"
	"sync"
	"time"
)

// Timeline is a ring of the last timestamped actions and observations of
// a soak, printed when an invariant is violated so that the violation
// can be traced back to what led to it. It is safe for concurrent use.
type Timeline struct {
	start time.Time
	now   func() time.Time

	mu      sync.Mutex
	entries []Entry // ring buffer of cap entries
	next    int     // index of the next write
	total   int     // entries ever added
}

// Entry is one line of a [Timeline].
type Entry struct {
	// At is the time since the soak started.
	At time.Duration
	// Kind says what happened ("create", "agent-kill", "check", ...).
	Kind string
	// What is a human-readable description.
	What string
}

func (e Entry) String() string {
	return fmt.Sprintf("%9s  %-15s %s", e.At.Truncate(time.Millisecond), e.Kind, e.What)
}

// NewTimeline returns a timeline that keeps the last size entries, with
// times relative to start. now is the clock (time.Now when nil).
func NewTimeline(size int, start time.Time, now func() time.Time) *Timeline {
	if size <= 0 {
		size = 1
	}
	if now == nil {
		now = time.Now
	}
	return &Timeline{start: start, now: now, entries: make([]Entry, 0, size)}
}

// Restart makes later entries' times relative to start.
func (t *Timeline) Restart(start time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.start = start
}

// Elapsed is the time since the start.
func (t *Timeline) Elapsed() time.Duration {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.now().Sub(t.start)
}

// Addf records an entry of the given kind.
func (t *Timeline) Addf(kind, format string, args ...any) {
	what := fmt.Sprintf(format, args...)
	t.mu.Lock()
	defer t.mu.Unlock()
	e := Entry{At: t.now().Sub(t.start), Kind: kind, What: what}
	if len(t.entries) < cap(t.entries) {
		t.entries = append(t.entries, e)
	} else {
		t.entries[t.next] = e
	}
	t.next = (t.next + 1) % cap(t.entries)
	t.total++
}

// Entries returns the kept entries, oldest first, and how many older
// ones were dropped.
func (t *Timeline) Entries() (kept []Entry, dropped int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]Entry, 0, len(t.entries))
	if len(t.entries) < cap(t.entries) {
		out = append(out, t.entries...)
	} else {
		out = append(out, t.entries[t.next:]...)
		out = append(out, t.entries[:t.next]...)
	}
	return out, t.total - len(out)
}

// WriteTo prints the kept entries, one a line, oldest first.
func (t *Timeline) WriteTo(w io.Writer) (int64, error) {
	kept, dropped := t.Entries()
	var n int64
	if dropped > 0 {
		c, err := fmt.Fprintf(w, "(%d older entries dropped)\n", dropped)
		n += int64(c)
		if err != nil {
			return n, err
		}
	}
	for _, e := range kept {
		c, err := fmt.Fprintln(w, e.String())
		n += int64(c)
		if err != nil {
			return n, err
		}
	}
	return n, nil
}
