package observer

import (
	"context"
	"strings"
	"sync"
	"testing"

	flowpb "github.com/cilium/cilium/api/v1/flow"
)

func TestCheckCapacity(t *testing.T) {
	for _, n := range []int{1, 3, 7, 2047, 4095, 65535} {
		if err := CheckCapacity(n); err != nil {
			t.Errorf("CheckCapacity(%d) = %v, want nil", n, err)
		}
	}
	for _, n := range []int{0, -1, 2, 4096, 1000, 65536, 1 << 20} {
		if err := CheckCapacity(n); err == nil {
			t.Errorf("CheckCapacity(%d) = nil, want an error", n)
		}
	}
}

func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		c    Config
		want string // empty: valid
	}{
		{DefaultConfig, ""},
		{Config{HubbleEventBufferCapacity: 4096}, "--hubble-event-buffer-capacity=4096: the capacity must be one less than an integer power of two"},
		{Config{HubbleEventBufferCapacity: 131071}, "too large"},
		{Config{HubbleEventBufferCapacity: 4095, HubbleListenAddress: ":4244"}, "needs TLS: give --hubble-tls-cert-file and --hubble-tls-key-file"},
		{Config{HubbleEventBufferCapacity: 4095, HubbleListenAddress: ":4244", HubbleDisableTLS: true}, ""},
		{Config{HubbleEventBufferCapacity: 4095, HubbleListenAddress: "4244", HubbleDisableTLS: true}, `invalid --hubble-listen-address="4244"`},
		{Config{HubbleEventBufferCapacity: 4095, HubbleTLSCertFile: "c.pem"}, "go together"},
		{Config{HubbleEventBufferCapacity: 4095, HubbleListenAddress: ":4244", HubbleTLSCertFile: "c.pem", HubbleTLSKeyFile: "k.pem"}, ""},
	} {
		err := tc.c.Validate()
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%+v: %v", tc.c, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%+v: got %v, want an error containing %q", tc.c, err, tc.want)
		}
	}
}

func flowN(i int) *flowpb.Flow {
	return &flowpb.Flow{Uuid: string(rune('a' + i%26)), DropReason: uint32(i)}
}

func TestRingKeepsTheLastCapEvents(t *testing.T) {
	r, err := NewRing(7)
	if err != nil {
		t.Fatal(err)
	}
	if r.Cap() != 7 || r.Len() != 0 {
		t.Fatalf("empty ring: cap %d len %d", r.Cap(), r.Len())
	}
	for i := range 20 {
		r.Write(flowN(i))
	}
	if r.Len() != 7 || r.SeenFlows() != 20 {
		t.Fatalf("len %d seen %d, want 7 and 20", r.Len(), r.SeenFlows())
	}
	rd := r.NewReader(0) // clamped to the oldest: 13
	var got []uint32
	for {
		e, lost, ok := rd.Next()
		if !ok {
			break
		}
		if lost != 0 {
			t.Errorf("a new reader lost %d", lost)
		}
		got = append(got, e.flow.DropReason)
	}
	if len(got) != 7 || got[0] != 13 || got[6] != 19 {
		t.Fatalf("read %v, want 13..19", got)
	}
}

func TestRingReaderLappedReportsLost(t *testing.T) {
	r, _ := NewRing(15)
	rd := r.NewReader(0)
	for i := range 100 {
		r.Write(flowN(i))
	}
	e, lost, ok := rd.Next()
	if !ok || lost != 85 || e.flow.DropReason != 85 {
		t.Fatalf("lapped reader: event %v lost %d ok %v, want flow 85 after losing 85", e, lost, ok)
	}
}

// A follower reading while the writer writes sees every event in order
// or is told how many it missed; the writer never waits for it.
func TestRingConcurrentFollower(t *testing.T) {
	r, _ := NewRing(1023)
	const total = 200000
	rd := r.NewReader(r.Written())
	var wg sync.WaitGroup
	var read, lostSum uint64
	wg.Go(func() {
		next := uint64(0)
		for read+lostSum < total {
			e, lost, err := rd.NextWait(context.Background())
			if err != nil {
				t.Error(err)
				return
			}
			lostSum += lost
			if e.seq != next+lost {
				t.Errorf("event %d after %d (lost %d)", e.seq, next, lost)
				return
			}
			next = e.seq + 1
			read++
		}
	})
	for i := range total {
		r.Write(flowN(i))
	}
	wg.Wait()
	if read+lostSum != total {
		t.Fatalf("read %d + lost %d != %d", read, lostSum, total)
	}
	t.Logf("follower read %d, lost %d of %d", read, lostSum, total)
}

// Readers that read slots while the writer overwrites them (a ring of 7
// lapped again and again) only ever get the event written with the
// sequence number they were given, flow or lost event: the slots are
// filled in place, and a reader must never see half of a write.
func TestRingReadersNeverSeeTornSlots(t *testing.T) {
	r, _ := NewRing(7)
	const total = 300000
	flows := make([]*flowpb.Flow, 64)
	lost := make([]*flowpb.LostEvent, 64)
	for i := range flows {
		flows[i], lost[i] = flowN(i), &flowpb.LostEvent{NumEventsLost: uint64(i)}
	}
	// Every third event is a lost event: seq%3 == 2.
	write := func(seq int) {
		if seq%3 == 2 {
			r.WriteLost(lost[seq%64])
		} else {
			r.Write(flows[seq%64])
		}
	}
	var wg sync.WaitGroup
	var checked [3]uint64
	for k := range 3 {
		wg.Go(func() {
			for r.Written() < total {
				seq := r.Written() - 1 - uint64(k)
				if seq >= total {
					continue
				}
				e, ok, _ := r.at(seq)
				if !ok {
					continue
				}
				checked[k]++
				wantLost := seq%3 == 2
				if e.seq != seq || (wantLost && (e.flow != nil || e.lost != lost[seq%64])) ||
					(!wantLost && (e.lost != nil || e.flow != flows[seq%64])) {
					t.Errorf("seq %d: got event seq %d flow %v lost %v", seq, e.seq, e.flow, e.lost)
					return
				}
			}
		})
	}
	for i := range total {
		write(i)
	}
	wg.Wait()
	t.Logf("readers checked %v events while %d were written", checked, total)
}

func TestRingNextWaitEndsWithContext(t *testing.T) {
	r, _ := NewRing(3)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, _, err := r.NewReader(0).NextWait(ctx); err == nil {
		t.Fatal("NextWait on an empty ring with a cancelled context returned no error")
	}
}
