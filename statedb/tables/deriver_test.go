package tables_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/cilium/statedb"

	"github.com/cellium/cellium/statedb/tables"
)

type recorder struct {
	mu  sync.Mutex
	log []string
}

func (r *recorder) OK(msg string) { r.add("ok " + msg) }
func (r *recorder) Degraded(msg string, err error) {
	r.add("degraded " + msg + ": " + err.Error())
}
func (r *recorder) add(s string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.log = append(r.log, s)
}
func (r *recorder) get() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.log...)
}

// RunDeriver steps again each time one of the channels the step watches
// closes, reports each step's outcome and returns when ctx ends.
func TestRunDeriver(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	wake := make(chan chan struct{}, 3)
	steps := make(chan int, 3)
	h := &recorder{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		n := 0
		tables.RunDeriver(ctx, h, "derive", func(ws *statedb.WatchSet) (string, error) {
			n++
			ch := make(chan struct{})
			ws.Add(ch, nil)
			wake <- ch
			steps <- n
			if n == 2 {
				return "", errors.New("boom")
			}
			return "fine", nil
		})
	}()
	for want := 1; want <= 3; want++ {
		select {
		case n := <-steps:
			if n != want {
				t.Fatalf("step %d, want %d", n, want)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("step %d never ran", want)
		}
		close(<-wake)
	}
	// The fourth step ran on the third close; stop.
	<-steps
	<-wake
	cancel()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("RunDeriver did not return when its context ended")
	}
	got := h.get()
	want := []string{"ok fine", "degraded derive: boom", "ok fine", "ok fine"}
	if len(got) != len(want) {
		t.Fatalf("health %q, want %q", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("health %q, want %q", got, want)
		}
	}
}
