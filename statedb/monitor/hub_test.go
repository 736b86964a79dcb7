package monitor

import (
	"net/netip"
	"sync"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func drop(ep uint16) Event {
	return Event{Type: TypeDrop, Reason: 133, ReasonName: "Policy denied", Direction: DirectionIngress,
		EndpointID: ep, SrcIdentity: 5678, DstIdentity: 1234,
		SrcIP: netip.MustParseAddr("10.0.0.2"), DstIP: netip.MustParseAddr("10.0.0.3"),
		SrcPort: 43210, DstPort: 80, Protocol: 6, Ifindex: 7, Length: 74}
}

// recv reads n events from s, failing when the channel closes first.
func recv(t *testing.T, s *Subscription, n int) []Event {
	t.Helper()
	var out []Event
	for len(out) < n {
		ev, ok := <-s.Events()
		if !ok {
			t.Fatalf("channel closed after %d of %d events", len(out), n)
		}
		out = append(out, ev)
	}
	return out
}

func TestFanOutAndFilters(t *testing.T) {
	h := NewHub()
	all := h.Subscribe(Filter{}, 0)
	drops := h.Subscribe(Filter{Types: []Type{TypeDrop}}, 0)
	ep7 := h.Subscribe(Filter{EndpointIDs: []uint16{7}}, 0)
	verdicts7 := h.Subscribe(Filter{Types: []Type{TypePolicyVerdict, TypeTrace}, EndpointIDs: []uint16{7, 8}}, 0)
	defer func() {
		for _, s := range []*Subscription{all, drops, ep7, verdicts7} {
			s.Close()
		}
	}()

	pv := drop(7)
	pv.Type, pv.Verdict = TypePolicyVerdict, VerdictDeny
	tr := drop(9)
	tr.Type, tr.Reason, tr.ReasonName = TypeTrace, 5, "from-endpoint"
	for _, ev := range []Event{drop(7), pv, tr, drop(9)} {
		h.Publish(ev)
	}
	// The last event each subscriber must see is a drop of endpoint 9 or
	// 7; a marker published after proves nothing else is pending.
	marker := drop(7)
	marker.Length = 9999
	h.Publish(marker)

	check := func(name string, s *Subscription, want ...Event) {
		t.Helper()
		got := recv(t, s, len(want))
		for i := range want {
			if got[i] != want[i] {
				t.Errorf("%s: event %d = %+v, want %+v", name, i, got[i], want[i])
			}
		}
		if s.Lost() != 0 {
			t.Errorf("%s: lost %d", name, s.Lost())
		}
	}
	check("all", all, drop(7), pv, tr, drop(9), marker)
	check("drops", drops, drop(7), drop(9), marker)
	check("endpoint 7", ep7, drop(7), pv, marker)
	// verdicts7 does not select the marker (a drop): publish a trace of
	// endpoint 7 as its marker.
	tr7 := tr
	tr7.EndpointID = 7
	h.Publish(tr7)
	check("verdicts and traces of 7", verdicts7, pv, tr7)

	if st := h.Stats(); st.Published != 6 || st.Subscribers != 4 || st.Lost != 0 {
		t.Errorf("Stats = %+v, want 6 published, 4 subscribers, none lost", st)
	}
}

// TestSlowSubscriber: a subscriber that does not read loses what does not
// fit, counted, while the publisher goes on and a subscriber with room
// gets every event. (Were Publish to block on the full buffer, the test
// would hang.)
func TestSlowSubscriber(t *testing.T) {
	const n = 1000
	h := NewHub()
	slow := h.Subscribe(Filter{}, 4)
	defer slow.Close()
	roomy := h.Subscribe(Filter{}, n)
	defer roomy.Close()

	for i := range n {
		ev := drop(1)
		ev.Length = uint32(i)
		h.Publish(ev)
	}
	if slow.Lost() != n-4 {
		t.Errorf("slow subscriber lost %d, want %d", slow.Lost(), n-4)
	}
	// The slow subscriber holds the first four events, in order.
	for i, ev := range recv(t, slow, 4) {
		if ev.Length != uint32(i) {
			t.Errorf("slow subscriber's event %d has length %d, want %d", i, ev.Length, i)
		}
	}
	for i, ev := range recv(t, roomy, n) {
		if ev.Length != uint32(i) {
			t.Fatalf("roomy subscriber's event %d has length %d, want %d", i, ev.Length, i)
		}
	}
	if roomy.Lost() != 0 {
		t.Errorf("roomy subscriber lost %d", roomy.Lost())
	}
	if st := h.Stats(); st.Lost != n-4 || st.Published != n {
		t.Errorf("Stats = %+v; want Published %d and Lost %d", st, n, n-4)
	}
}

// TestConcurrentReaders: subscribers reading in goroutines while several
// publishers publish get every event of every publisher (their buffers
// are large enough), and end when they unsubscribe.
func TestConcurrentReaders(t *testing.T) {
	const publishers, each = 4, 500
	h := NewHub()
	var wg sync.WaitGroup
	counts := make([]int, 3)
	subs := make([]*Subscription, len(counts))
	for i := range subs {
		subs[i] = h.Subscribe(Filter{}, publishers*each)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range subs[i].Events() {
				counts[i]++
			}
		}()
	}
	var pub sync.WaitGroup
	for p := range publishers {
		pub.Add(1)
		go func() {
			defer pub.Done()
			for range each {
				h.Publish(drop(uint16(p + 1)))
			}
		}()
	}
	pub.Wait()
	for _, s := range subs {
		s.Close()
	}
	wg.Wait()
	for i, c := range counts {
		if c != publishers*each {
			t.Errorf("subscriber %d got %d events, want %d", i, c, publishers*each)
		}
	}
}

func TestUnsubscribe(t *testing.T) {
	h := NewHub()
	a := h.Subscribe(Filter{}, 0)
	b := h.Subscribe(Filter{}, 0)
	defer b.Close()
	a.Close()
	a.Close() // twice is harmless
	if _, ok := <-a.Events(); ok {
		t.Fatal("a closed subscription's channel delivered an event")
	}
	h.Publish(drop(1))
	recv(t, b, 1)
	if st := h.Stats(); st.Subscribers != 1 {
		t.Errorf("Stats().Subscribers = %d after one of two closed, want 1", st.Subscribers)
	}
	if a.Lost() != 0 {
		t.Errorf("a closed subscription counted %d lost events", a.Lost())
	}
}

// TestClose: closing the hub ends every subscription after its buffered
// events, later subscriptions are closed at once, and Publish does
// nothing.
func TestClose(t *testing.T) {
	h := NewHub()
	s := h.Subscribe(Filter{}, 0)
	h.Publish(drop(1))
	h.Close()
	h.Close()
	h.Publish(drop(2))
	ev, ok := <-s.Events()
	if !ok || ev.EndpointID != 1 {
		t.Fatalf("first read after Close = %+v, %v; want the buffered event of endpoint 1", ev, ok)
	}
	if _, ok := <-s.Events(); ok {
		t.Fatal("channel still open after the hub's Close")
	}
	s.Close()
	late := h.Subscribe(Filter{}, 0)
	if _, ok := <-late.Events(); ok {
		t.Fatal("subscription to a closed hub delivered an event")
	}
	late.Close()
	if st := h.Stats(); st.Published != 1 || st.Subscribers != 0 {
		t.Errorf("Stats = %+v, want 1 published and no subscriber", st)
	}
}

// TestCloseWhilePublishing: Close and Subscription.Close racing with
// Publish neither panic (send on a closed channel) nor deadlock. Run
// with -race.
func TestCloseWhilePublishing(t *testing.T) {
	h := NewHub()
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
					h.Publish(drop(1))
				}
			}
		}()
	}
	for range 100 {
		s := h.Subscribe(Filter{}, 1)
		<-s.Events() // a publisher reached it
		s.Close()
	}
	h.Close()
	close(stop)
	wg.Wait()
}

func TestParseType(t *testing.T) {
	for _, typ := range Types {
		got, err := ParseType(typ.String())
		if err != nil || got != typ {
			t.Errorf("ParseType(%q) = %v, %v", typ.String(), got, err)
		}
	}
	if _, err := ParseType("capture"); err == nil || err.Error() != `unknown event type "capture": use one of drop, trace, policy-verdict` {
		t.Errorf("ParseType(capture) error = %v", err)
	}
}

// Losses at the source are counted by the hub, apart from the events its
// subscribers lost, and never block.
func TestHubPublishLost(t *testing.T) {
	h := NewHub()
	s := h.Subscribe(Filter{}, 1)
	defer s.Close()
	h.PublishLost(3)
	h.PublishLost(4)
	if h.SourceLost() != 7 || h.Stats().SourceLost != 7 || h.Stats().Lost != 0 || s.Lost() != 0 {
		t.Fatalf("SourceLost %d, stats %+v, subscription lost %d; want 7 at the source only", h.SourceLost(), h.Stats(), s.Lost())
	}
}
