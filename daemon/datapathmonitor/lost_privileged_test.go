package datapathmonitor

import (
	"path/filepath"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/cellium/cellium/datapath/maps"
	"github.com/cellium/cellium/test/privileged"
)

type lostCount struct{ n atomic.Uint64 }

func (l *lostCount) PublishLost(n uint64) { l.n.Add(n) }

// pollLost reports the growth of cellium_events_lost, summed over CPUs,
// and not what the map held when it started (an earlier agent's losses).
func TestPrivilegedPollLost(t *testing.T) {
	privileged.Require(t)
	dir := filepath.Join(t.TempDir(), "cellium")
	if err := maps.EnsureBPFFS(dir); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(dir, 0); err != nil {
			t.Errorf("unmount %s: %v", dir, err)
		}
	})
	m, err := maps.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	cpus, err := ebpf.PossibleCPU()
	if err != nil {
		t.Fatal(err)
	}
	set := func(perCPU uint64) {
		v := make([]uint64, cpus)
		for i := range v {
			v[i] = perCPU
		}
		if err := m.EventsLost.Map().Put(uint32(0), v); err != nil {
			t.Fatal(err)
		}
	}
	set(5) // before: not reported
	var got lostCount
	done, stopped := make(chan struct{}), make(chan struct{})
	go func() { defer close(stopped); pollLost(m.EventsLost, &got, done) }()
	defer func() { close(done); <-stopped }()
	// Let pollLost read its baseline first.
	time.Sleep(LostPollInterval / 2)
	runtime.Gosched()
	set(8)
	want := uint64(3 * cpus)
	deadline := time.Now().Add(10 * time.Second)
	for got.n.Load() < want && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(2 * LostPollInterval) // nothing more comes
	if got.n.Load() != want {
		t.Fatalf("reported %d lost, want %d (3 on each of %d CPUs)", got.n.Load(), want, cpus)
	}
}
