package benchdatapath

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cilium/ebpf/ringbuf"
	"github.com/containernetworking/plugins/pkg/ns"
	"golang.org/x/sys/unix"

	"github.com/cellium/cellium/datapath/maps"
	"github.com/cellium/cellium/statedb/policy"
)

// An enforcer changes the policy between the bench's pods: deny makes pod
// b's ingress deny pod a on the stream's port, allow undoes it. The
// latencies measured are from the start of deny to the first packet
// dropped and from the start of allow to the first packet through again.
//
// mapsEnforcer writes the policy map directly (datapath/maps): the
// datapath's share alone. agentEnforcer (agent.go) writes a
// CiliumNetworkPolicy into the agent's CNP table, as the CNP reflector
// does on a watch event; the agent's policy engine, deriver and policy
// map reconciler do the rest.
type enforcer interface {
	name() string
	deny(ctx context.Context) error
	allow(ctx context.Context) error
}

// mapsEnforcer adds and removes a deny entry in b's policy map; key must
// not be one of the entries the policy holds.
type mapsEnforcer struct {
	pm  *maps.PolicyMap
	key policy.Key
}

func (e *mapsEnforcer) name() string { return "policy map update (datapath/maps), no agent" }

func (e *mapsEnforcer) deny(context.Context) error {
	return e.pm.Update(policy.Entry{Key: e.key, Deny: true})
}

func (e *mapsEnforcer) allow(context.Context) error { return e.pm.Delete(e.key) }

// rx is one datagram pod b received: when (CLOCK_MONOTONIC, read when
// the receiver got it) and the sequence number the sender gave it.
type rx struct {
	at  uint64
	seq uint64
}

// stream sends UDP datagrams from pod a to pod b every interval, each
// with a sequence number, and reports each one b receives.
type stream struct {
	send, recv net.PacketConn
	received   chan rx
	// next is the last sequence number given; a datagram numbered above
	// the value read at some instant was sent after it.
	next    atomic.Uint64
	started time.Time
	wg      sync.WaitGroup
	stop    chan struct{}
}

func (t *topology) startStream(interval time.Duration) (*stream, error) {
	s := &stream{received: make(chan rx, 4096), stop: make(chan struct{}), started: time.Now()}
	dst := netip.AddrPortFrom(t.b.ip, streamPort)
	if err := t.b.ns.Do(func(ns.NetNS) error {
		var err error
		s.recv, err = net.ListenPacket("udp4", dst.String())
		return err
	}); err != nil {
		return nil, fmt.Errorf("listen in pod b: %w", err)
	}
	if err := t.a.ns.Do(func(ns.NetNS) error {
		var err error
		s.send, err = net.ListenPacket("udp4", netip.AddrPortFrom(t.a.ip, 0).String())
		return err
	}); err != nil {
		s.recv.Close()
		return nil, fmt.Errorf("socket in pod a: %w", err)
	}
	to := net.UDPAddrFromAddrPort(dst)
	s.wg.Add(2)
	go func() {
		defer s.wg.Done()
		msg := []byte("01234567cellium-benchdp")
		for {
			select {
			case <-s.stop:
				return
			default:
			}
			sent := time.Now()
			binary.BigEndian.PutUint64(msg, s.next.Add(1))
			_, _ = s.send.WriteTo(msg, to)
			// Sleeps shorter than a millisecond are not kept on many
			// kernels: below that the sender yields until the next
			// datagram is due (a busy CPU for the short test).
			if interval >= time.Millisecond {
				time.Sleep(interval)
				continue
			}
			for time.Since(sent) < interval {
				runtime.Gosched()
			}
		}
	}()
	go func() {
		defer s.wg.Done()
		buf := make([]byte, 64)
		for {
			n, _, err := s.recv.ReadFrom(buf)
			if err != nil {
				return
			}
			if n < 8 {
				continue
			}
			select {
			case s.received <- rx{at: monotonicNow(), seq: binary.BigEndian.Uint64(buf)}:
			default:
			}
		}
	}()
	return s, nil
}

// gap is the mean time between two datagrams sent so far.
func (s *stream) gap() time.Duration {
	n := s.next.Load()
	if n == 0 {
		return 0
	}
	return time.Since(s.started) / time.Duration(n)
}

func (s *stream) close() {
	close(s.stop)
	s.send.Close()
	s.recv.Close()
	s.wg.Wait()
}

// mark is the sequence number of the last datagram given one: the
// datagrams numbered above it are sent after the call.
func (s *stream) mark() uint64 { return s.next.Load() }

// receivedAfter waits for the first datagram b receives that was sent
// after mark (see sentAfter) and returns when it was received.
func (s *stream) receivedAfter(ctx context.Context, mark uint64, timeout time.Duration) (uint64, error) {
	deadline := time.After(timeout)
	for {
		select {
		case r := <-s.received:
			if sentAfter(r, mark) {
				return r.at, nil
			}
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-deadline:
			return 0, fmt.Errorf("no datagram of the stream reached pod b within %v", timeout)
		}
	}
}

// sentAfter reports whether r was numbered after mark was read.
func sentAfter(r rx, mark uint64) bool { return r.seq > mark }

func monotonicNow() uint64 {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return uint64(ts.Nano())
}

// latencies are what enforcementLatency measures per update.
type latencies struct {
	// Applied is from the start of the deny update to its return: for a
	// map update the programs see the new entry from then on; the agent
	// enforcer returns once the agent reports the map holds the change.
	Applied []time.Duration
	// FirstDrop is from the start of the deny update to the drop event of
	// the first packet dropped (both on CLOCK_MONOTONIC, which
	// bpf_ktime_get_ns reads); it includes the wait for the stream's next
	// packet.
	FirstDrop []time.Duration
	// FirstPass is from the start of the allow update (the deny undone)
	// to the receipt in pod b of the first datagram sent after that
	// start; it includes the wait for the stream's next packet and the
	// receiver's wake-up.
	FirstPass []time.Duration
	// StreamGap is the stream's mean gap between datagrams.
	StreamGap time.Duration
}

// firstDropAfter returns the first drop time (ns, CLOCK_MONOTONIC) at or
// after t0 from drops, skipping earlier ones.
func firstDropAfter(ctx context.Context, drops <-chan uint64, t0 uint64, timeout time.Duration) (uint64, error) {
	deadline := time.After(timeout)
	for {
		select {
		case k, ok := <-drops:
			if !ok {
				return 0, errors.New("the event reader stopped")
			}
			if k >= t0 {
				return k, nil
			}
		case <-deadline:
			return 0, fmt.Errorf("no drop event within %v of the update", timeout)
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
}

// drain empties ch without blocking.
func drain[T any](ch <-chan T) {
	for {
		select {
		case <-ch:
		default:
			return
		}
	}
}

// since is the time from t0 to t (both CLOCK_MONOTONIC ns); 0 when t is
// earlier.
func since(t0, t uint64) time.Duration {
	if t < t0 {
		return 0
	}
	return time.Duration(t - t0)
}

// enforcementLatency runs the stream and applies n policy updates that
// deny it, each undone once its first drop is seen; it times both.
func (t *topology) enforcementLatency(ctx context.Context, enf enforcer, n int, interval time.Duration) (out latencies, err error) {
	r, err := t.maps.NewEventReader()
	if err != nil {
		return out, err
	}
	drops := make(chan uint64, 1024)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer close(drops)
		for {
			rec, err := r.Read()
			if err != nil {
				if !errors.Is(err, ringbuf.ErrClosed) && !errors.Is(err, os.ErrClosed) {
					fmt.Fprintln(os.Stderr, "benchdatapath: read events:", err)
				}
				return
			}
			e, err := maps.DecodeEvent(rec.RawSample)
			if err != nil || e.Type != maps.EventDrop || e.EndpointID != t.b.epID || e.DstPort != streamPort {
				continue
			}
			select {
			case drops <- e.KtimeNs:
			default:
			}
		}
	}()
	defer func() { r.Close(); wg.Wait() }()

	s, err := t.startStream(interval)
	if err != nil {
		return out, err
	}
	defer s.close()
	defer func() { out.StreamGap = s.gap() }()

	const timeout = 5 * time.Second
	if _, err := s.receivedAfter(ctx, s.mark(), timeout); err != nil {
		return out, err
	}
	for range n {
		// Stale receipts and drops would fill the channels and hide the
		// ones timed here.
		drain(drops)
		drain(s.received)
		t0 := monotonicNow()
		if err := enf.deny(ctx); err != nil {
			return out, fmt.Errorf("deny: %w", err)
		}
		out.Applied = append(out.Applied, since(t0, monotonicNow()))
		k, err := firstDropAfter(ctx, drops, t0, timeout)
		if err != nil {
			passed := 0
			for r := range len(s.received) {
				_ = r
				if sentAfter(<-s.received, 0) {
					passed++
				}
			}
			return out, fmt.Errorf("%w (%d datagrams reached pod b meanwhile)", err, passed)
		}
		out.FirstDrop = append(out.FirstDrop, since(t0, k))

		drain(s.received)
		mark := s.mark()
		t1 := monotonicNow()
		if err := enf.allow(ctx); err != nil {
			return out, fmt.Errorf("allow: %w", err)
		}
		at, err := s.receivedAfter(ctx, mark, timeout)
		if err != nil {
			return out, fmt.Errorf("after allow: %w", err)
		}
		out.FirstPass = append(out.FirstPass, since(t1, at))
	}
	return out, nil
}
