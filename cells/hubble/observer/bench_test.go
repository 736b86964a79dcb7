package observer_test

import (
	"runtime"
	"testing"
	"time"

	flowpb "github.com/cilium/cilium/api/v1/flow"

	"github.com/cellium/cellium/cells/hubble/observer"
)

// BenchmarkRingWrite is the cost of keeping one flow: the flow producer's
// goroutine pays it for every flow.
func BenchmarkRingWrite(b *testing.B) {
	r, err := observer.NewRing(observer.DefaultConfig.HubbleEventBufferCapacity)
	if err != nil {
		b.Fatal(err)
	}
	f := demoFlow(0, time.Now())
	b.ReportAllocs()
	for b.Loop() {
		r.Write(f)
	}
}

// BenchmarkRingWriteDistinct is BenchmarkRingWrite with a different flow
// in each write, as in the agent (a slot never holds the flow written).
func BenchmarkRingWriteDistinct(b *testing.B) {
	r, err := observer.NewRing(observer.DefaultConfig.HubbleEventBufferCapacity)
	if err != nil {
		b.Fatal(err)
	}
	// 5000 flows: no slot of the 4096 gets the flow it held.
	flows := make([]*flowpb.Flow, 5000)
	for i := range flows {
		flows[i] = demoFlow(i, time.Now())
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		r.Write(flows[i])
		if i++; i == len(flows) {
			i = 0
		}
	}
}

// BenchmarkRingWriteWithFollower writes while a reader follows the ring,
// as when hubble observe --follow runs.
func BenchmarkRingWriteWithFollower(b *testing.B) {
	r, _ := observer.NewRing(observer.DefaultConfig.HubbleEventBufferCapacity)
	f := demoFlow(0, time.Now())
	stop := make(chan struct{})
	done := make(chan struct{})
	rd := r.NewReader(0)
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
			}
			rd.Next()
		}
	}()
	b.ReportAllocs()
	for b.Loop() {
		r.Write(f)
	}
	close(stop)
	<-done
}

// BenchmarkRingMemory reports the heap a full ring at the default
// capacity keeps: ring-B is the ring itself (slots and entries, the
// flows not counted), full-B adds the 4095 demo flows it holds.
func BenchmarkRingMemory(b *testing.B) {
	capacity := observer.DefaultConfig.HubbleEventBufferCapacity
	now := time.Now()
	heap := func() uint64 {
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return ms.HeapAlloc
	}
	var ringBytes, fullBytes float64
	for b.Loop() {
		base := heap()
		flows := make([]*flowpb.Flow, capacity)
		for i := range flows {
			flows[i] = demoFlow(i, now)
		}
		withFlows := heap()
		r, _ := observer.NewRing(capacity)
		for _, f := range flows {
			r.Write(f)
		}
		withRing := heap()
		ringBytes = float64(withRing) - float64(withFlows)
		fullBytes = float64(withRing) - float64(base)
		runtime.KeepAlive(r)
		runtime.KeepAlive(flows)
	}
	b.ReportMetric(ringBytes, "ring-B")
	b.ReportMetric(fullBytes, "full-B")
	b.ReportMetric(0, "ns/op")
}
