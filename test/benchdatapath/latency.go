package benchdatapath

import (
	"context"
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
// latency measured is from the start of deny to the first packet dropped.
//
// mapsEnforcer writes the policy map directly (datapath/maps), which is
// what can be measured without the agent. The agent-driven variant (apply
// a CiliumNetworkPolicy through the apiserver; the policy engine, the
// policy map reconciler and the programs do the rest) is another
// enforcer with the same two methods, added once the loader and the map
// reconcilers run in the agent.
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

// stream sends UDP datagrams from pod a to pod b every interval and
// signals each one b receives.
type stream struct {
	send, recv net.PacketConn
	received   chan struct{}
	sent       atomic.Uint64
	started    time.Time
	wg         sync.WaitGroup
	stop       chan struct{}
}

func (t *topology) startStream(interval time.Duration) (*stream, error) {
	s := &stream{received: make(chan struct{}, 1), stop: make(chan struct{}), started: time.Now()}
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
		msg := []byte("cellium-benchdp")
		for {
			select {
			case <-s.stop:
				return
			default:
			}
			sent := time.Now()
			if _, err := s.send.WriteTo(msg, to); err == nil {
				s.sent.Add(1)
			}
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
			if _, _, err := s.recv.ReadFrom(buf); err != nil {
				return
			}
			select {
			case s.received <- struct{}{}:
			default:
			}
		}
	}()
	return s, nil
}

// gap is the mean time between two datagrams sent so far.
func (s *stream) gap() time.Duration {
	n := s.sent.Load()
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

// waitReceived waits for a datagram b receives after the call.
func (s *stream) waitReceived(ctx context.Context) error {
	select {
	case <-s.received:
	default:
	}
	select {
	case <-s.received:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(5 * time.Second):
		return errors.New("the stream did not reach pod b within 5s")
	}
}

func monotonicNow() uint64 {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return uint64(ts.Nano())
}

// latencies are what enforcementLatency measures per update.
type latencies struct {
	// Applied is from the start of the update to its return: for a
	// map update the programs see the new entry from then on.
	Applied []time.Duration
	// FirstDrop is from the start of the update to the drop event of the
	// first packet dropped (both on CLOCK_MONOTONIC, which
	// bpf_ktime_get_ns reads); it includes the wait for the stream's next
	// packet.
	FirstDrop []time.Duration
	// StreamGap is the stream's mean gap between datagrams.
	StreamGap time.Duration
}

// enforcementLatency runs the stream and applies n policy updates that
// deny it, each undone once the stream passes again.
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

	for range n {
		if err := s.waitReceived(ctx); err != nil {
			return out, err
		}
		t0 := monotonicNow()
		if err := enf.deny(ctx); err != nil {
			return out, fmt.Errorf("deny: %w", err)
		}
		out.Applied = append(out.Applied, time.Duration(monotonicNow()-t0))
		timeout := time.After(5 * time.Second)
	wait:
		for {
			select {
			case k := <-drops:
				if k >= t0 {
					out.FirstDrop = append(out.FirstDrop, time.Duration(k-t0))
					break wait
				}
			case <-timeout:
				return out, errors.New("no drop event within 5s of the update")
			case <-ctx.Done():
				return out, ctx.Err()
			}
		}
		if err := enf.allow(ctx); err != nil {
			return out, fmt.Errorf("allow: %w", err)
		}
	}
	return out, nil
}
