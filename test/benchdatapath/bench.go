// Package benchdatapath measures cellium's eBPF datapath between two pods
// on one node (`make bench-datapath`): TCP throughput (iperf3) and TCP
// request/response rate (sockperf ping-pong) over (a) bare routed veths
// and (b) the same veths with cellium's programs attached with tcx and a
// realistic policy loaded, printed as ratios b/a; and the time from a
// policy update to the first packet it drops in a running stream.
//
// Everything lives in network namespaces the bench makes (a node
// namespace and one per pod, the bench's range blackholed in the node
// first) and a private bpffs; all of it is removed at the end, also on
// error or interrupt. It needs root, iperf3, sockperf and nsenter.
package benchdatapath

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"slices"
	"time"

	"github.com/cellium/cellium/statedb/policy"
)

// Config sets the bench's sizes.
type Config struct {
	// Duration of each iperf3 and sockperf run (whole seconds).
	Duration time.Duration
	// Rounds of (bare, cellium) pairs; the medians are compared.
	Rounds int
	// Updates is the number of policy updates timed.
	Updates int
	// StreamInterval is the gap between the stream's datagrams, which
	// bounds the latency's resolution.
	StreamInterval time.Duration
	// IPCachePrefixes and PolicyEntries size the loaded maps.
	IPCachePrefixes int
	PolicyEntries   int
	// Pin runs the clients on CPU 0 and the servers on CPU 1 (taskset)
	// when the machine has two CPUs or more, the same for every variant.
	Pin bool
}

// variant is one way of connecting the pods, with its figures.
type variant struct {
	name               string
	programs, redirect bool
	bps, rr            []float64
}

// Result holds the medians measured: bare veths, programs with packets
// through the stack, programs with the same-node redirect.
type Result struct {
	BareBps, StackBps, RedirectBps float64
	BareRR, StackRR, RedirectRR    float64
	// Latencies are the policy update times; Enforcer says how the
	// policy was updated.
	Latencies latencies
	Enforcer  string
}

// Run builds the topology, measures, prints to w and removes everything.
func Run(ctx context.Context, cfg Config, w io.Writer) (res Result, err error) {
	if cfg.Duration < time.Second {
		return res, errors.New("duration must be at least 1s (iperf3 and sockperf run whole seconds)")
	}
	bins := []string{"iperf3", "sockperf", "nsenter", "ss"}
	if cfg.Pin {
		bins = append(bins, "taskset")
	}
	for _, bin := range bins {
		if err := lookPath(bin); err != nil {
			return res, err
		}
	}
	tmp, err := os.MkdirTemp("", "cellium-benchdp-")
	if err != nil {
		return res, err
	}
	defer os.RemoveAll(tmp)
	t, err := newTopology(ctx, tmp)
	defer func() {
		if cerr := t.close(); cerr != nil {
			err = errors.Join(err, fmt.Errorf("clean up: %w", cerr))
		}
	}()
	if err != nil {
		return res, err
	}
	if cfg.Pin && runtime.NumCPU() >= 2 {
		t.clientCPU, t.serverCPU = 0, 1
	}
	if err := t.loadPolicy(cfg.IPCachePrefixes, cfg.PolicyEntries); err != nil {
		return res, err
	}
	for _, p := range []*pod{t.a, t.b} {
		if err := t.load(p); err != nil {
			return res, err
		}
	}
	if t.clientCPU >= 0 {
		fmt.Fprintf(w, "clients pinned to CPU %d, servers to CPU %d\n", t.clientCPU, t.serverCPU)
	}
	fmt.Fprintf(w, "pods %s (identity %d) -> %s (identity %d); ipcache %d prefixes; policy: enforcing egress on a, ingress on b, %d entries each\n",
		t.a.ip, t.a.id, t.b.ip, t.b.id, cfg.IPCachePrefixes+2, cfg.PolicyEntries+4)

	variants := []variant{{name: "bare"}, {name: "stack", programs: true}, {name: "redirect", programs: true, redirect: true}}
	for round := range cfg.Rounds {
		for i := range variants {
			v := &variants[i]
			if v.programs {
				if err := t.attach(v.redirect); err != nil {
					return res, err
				}
			}
			tx0, err := t.txPackets(t.b)
			if err != nil {
				return res, err
			}
			bps, err := t.iperf3(ctx, cfg.Duration)
			if err != nil {
				return res, fmt.Errorf("round %d %s: %w", round+1, v.name, err)
			}
			rr, err := t.sockperf(ctx, cfg.Duration)
			if err != nil {
				return res, fmt.Errorf("round %d %s: %w", round+1, v.name, err)
			}
			tx1, err := t.txPackets(t.b)
			if err != nil {
				return res, err
			}
			fmt.Fprintf(w, "round %d %-8s throughput %8.2f Gbit/s   request/response %9.0f /s   packets to b through the stack %d\n",
				round+1, v.name, bps/1e9, rr, tx1-tx0)
			v.bps, v.rr = append(v.bps, bps), append(v.rr, rr)
			if v.programs {
				if err := t.detach(); err != nil {
					return res, err
				}
			}
		}
	}
	bare, stack, redir := variants[0], variants[1], variants[2]
	res.BareBps, res.StackBps, res.RedirectBps = median(bare.bps), median(stack.bps), median(redir.bps)
	res.BareRR, res.StackRR, res.RedirectRR = median(bare.rr), median(stack.rr), median(redir.rr)

	if err := t.attach(true); err != nil {
		return res, err
	}
	// A deny for every identity on the stream's port: it beats the allow
	// of a's identity (drop reason 181).
	enf := &mapsEnforcer{pm: t.b.policy, key: policy.NewKey(0, policy.Ingress, policy.ProtoUDP, streamPort, 16)}
	res.Enforcer = enf.name()
	res.Latencies, err = t.enforcementLatency(ctx, enf, cfg.Updates, cfg.StreamInterval)
	if err != nil {
		return res, fmt.Errorf("policy update latency: %w", err)
	}

	fmt.Fprintf(w, "\nmedians of %d rounds of %s each; a = bare routed veths, b = cellium programs + policy\n", cfg.Rounds, cfg.Duration)
	fmt.Fprintf(w, "(b stack: packets between the pods through the host stack; b redirect: bpf_redirect_peer after both policies)\n")
	fmt.Fprintf(w, "  TCP throughput (iperf3)          a %7.2f Gbit/s  b stack %7.2f (%.3fx)  b redirect %7.2f (%.3fx)  aim >= 0.95x\n",
		res.BareBps/1e9, res.StackBps/1e9, res.StackBps/res.BareBps, res.RedirectBps/1e9, res.RedirectBps/res.BareBps)
	fmt.Fprintf(w, "  TCP_RR (sockperf ping-pong, 64B) a %7.0f /s      b stack %7.0f (%.3fx)  b redirect %7.0f (%.3fx)  aim >= 1.0x\n",
		res.BareRR, res.StackRR, res.StackRR/res.BareRR, res.RedirectRR, res.RedirectRR/res.BareRR)
	fmt.Fprintf(w, "  median of the per-round ratios (a and b measured back to back; steadier under a changing load):\n")
	fmt.Fprintf(w, "    throughput b stack %.3fx  b redirect %.3fx    request/response b stack %.3fx  b redirect %.3fx\n",
		medianRatio(stack.bps, bare.bps), medianRatio(redir.bps, bare.bps), medianRatio(stack.rr, bare.rr), medianRatio(redir.rr, bare.rr))
	fmt.Fprintf(w, "  policy update (%s), %d updates:\n", res.Enforcer, len(res.Latencies.FirstDrop))
	for _, l := range []struct {
		what string
		d    []time.Duration
	}{{"update applied (call returned)", res.Latencies.Applied}, {"update -> first packet dropped", res.Latencies.FirstDrop}} {
		lat := slices.Clone(l.d)
		slices.Sort(lat)
		fmt.Fprintf(w, "    %-32s p50 %9v  p99 %9v  max %9v\n", l.what, percentile(lat, 50), percentile(lat, 99), lat[len(lat)-1])
	}
	fmt.Fprintf(w, "    (the UDP stream sent a datagram every %v on average: the first drop waits for the next one; aim p99 <= 50ms)\n",
		res.Latencies.StreamGap.Round(time.Microsecond))
	return res, nil
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	return s[len(s)/2]
}

// medianRatio is the median of b[i]/a[i].
func medianRatio(b, a []float64) float64 {
	r := make([]float64, 0, len(a))
	for i := range min(len(a), len(b)) {
		if a[i] > 0 {
			r = append(r, b[i]/a[i])
		}
	}
	return median(r)
}

// percentile of sorted, nearest rank.
func percentile(sorted []time.Duration, p int) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := (len(sorted)*p + 99) / 100
	if i < 1 {
		i = 1
	}
	return sorted[i-1]
}
