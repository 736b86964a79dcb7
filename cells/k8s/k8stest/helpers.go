package k8stest

import (
	"sync"
	"testing"
	"time"

	"github.com/cellium/cellium/cells/hive"
)

// HealthRecorder is a hive.Health that keeps the last report and counts
// them. Its zero value is ready; Scope returns the recorder itself.
type HealthRecorder struct {
	mu      sync.Mutex
	level   hive.Level
	msg     string
	err     error
	reports int
}

var _ hive.Health = (*HealthRecorder)(nil)

func (h *HealthRecorder) set(l hive.Level, msg string, err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.level, h.msg, h.err = l, msg, err
	h.reports++
}

// OK records a healthy report.
func (h *HealthRecorder) OK(msg string) { h.set(hive.LevelOK, msg, nil) }

// Degraded records a failing report.
func (h *HealthRecorder) Degraded(msg string, err error) { h.set(hive.LevelDegraded, msg, err) }

// Stopped records a stop.
func (h *HealthRecorder) Stopped(msg string) { h.set(hive.LevelStopped, msg, nil) }

// Scope returns h: the sub-parts report into the same record.
func (h *HealthRecorder) Scope(string) hive.Health { return h }

// Reports is the number of reports so far: a job that reports after each
// pass shows with it that it made progress.
func (h *HealthRecorder) Reports() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.reports
}

// Last returns the last report; the level is "" before any.
func (h *HealthRecorder) Last() (hive.Level, string, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.level, h.msg, h.err
}

// Eventually polls cond every 10ms until it returns nil, and fails the
// test with what and cond's last error if that takes more than 5 seconds.
func Eventually(t testing.TB, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s: %v", what, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
