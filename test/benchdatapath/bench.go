// Package benchdatapath measures cellium's eBPF datapath between two pods
// on one node (`make bench-datapath`): TCP throughput (iperf3) and TCP
// request/response rate (sockperf ping-pong) over (a) bare routed veths
// and (b) the same veths with cellium's programs attached with tcx and a
// realistic policy loaded, printed as ratios b/a; the time from a policy
// update to the first packet it drops (and, undone, to the first packet
// through again) in a running stream, with the policy map written
// directly and through the agent's own cells (agent.go); and the map
// reconcilers' throughput into pinned maps (reconcilers.go); the
// cross-node (crossnode.go), control-plane (controlplane.go) and Hubble
// (hubble.go) rows run separately. The report (report.go) checks the
// figures against the aims.
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
	"path/filepath"
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
	// Updates is the number of policy updates timed writing the policy
	// map directly; AgentUpdates through the agent's cells.
	Updates, AgentUpdates int
	// StreamInterval is the gap between the stream's datagrams, which
	// bounds the latency's resolution.
	StreamInterval time.Duration
	// IPCachePrefixes and PolicyEntries size the loaded maps.
	IPCachePrefixes int
	PolicyEntries   int
	// ReconcilerPolicyEntries, ReconcilerPrefixes and ReconcilerRounds
	// size the map reconcilers' measurement.
	ReconcilerPolicyEntries, ReconcilerPrefixes, ReconcilerRounds int
	// Pin runs the clients on CPU 0 and the servers on CPU 1 (taskset)
	// when the machine has two CPUs or more, the same for every variant.
	Pin bool
}

// variant is one way of connecting the pods.
type variant struct {
	name               string
	programs, redirect bool
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
	res.Duration, res.Rounds, res.LoadBefore = cfg.Duration, cfg.Rounds, loadAvg()
	tmp, err := os.MkdirTemp("", "cellium-benchdp-")
	if err != nil {
		return res, err
	}
	defer os.RemoveAll(tmp)
	t, err := newTopology(ctx, tmp)
	if t.node != nil {
		res.made = append(res.made, t.node.Path())
	}
	for _, p := range []*pod{t.a, t.b} {
		if p != nil {
			res.made = append(res.made, p.ns.Path())
		}
	}
	res.made = append(res.made, t.dir)
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
	fmt.Fprintf(w, "load average %s; the machine may be shared: rounds interleave the variants and the aims use medians of per-round ratios\n", res.LoadBefore)
	if t.clientCPU >= 0 {
		fmt.Fprintf(w, "clients pinned to CPU %d, servers to CPU %d\n", t.clientCPU, t.serverCPU)
	}
	fmt.Fprintf(w, "pods %s (identity %d) -> %s (identity %d); ipcache %d prefixes; policy: enforcing egress on a, ingress on b, %d entries each\n",
		t.a.ip, t.a.id, t.b.ip, t.b.id, cfg.IPCachePrefixes+2, cfg.PolicyEntries+4)

	variants := []variant{{name: "bare"}, {name: "stack", programs: true}, {name: "redirect", programs: true, redirect: true}}
	res.Variants = make([]Variant, len(variants))
	for i, v := range variants {
		res.Variants[i].Name = v.name
	}
	for round := range cfg.Rounds {
		// Every other round runs the variants in reverse order, so that
		// a load drifting during a round, or whatever the variant run
		// first in a round meets, biases no variant.
		order := []int{0, 1, 2}
		if round%2 == 1 {
			order = []int{2, 1, 0}
		}
		for _, i := range order {
			v := variants[i]
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
			WriteRound(w, round+1, v.name, bps, rr, tx1-tx0)
			res.Variants[i].Bps = append(res.Variants[i].Bps, bps)
			res.Variants[i].RR = append(res.Variants[i].RR, rr)
			if v.programs {
				if err := t.detach(); err != nil {
					return res, err
				}
			}
		}
	}

	if err := t.attach(true); err != nil {
		return res, err
	}
	// A deny for every identity on the stream's port: it beats the allow
	// of a's identity (drop reason 181).
	fmt.Fprintf(w, "policy updates written to the policy map directly (%d)...\n", cfg.Updates)
	enf := &mapsEnforcer{pm: t.b.policy, key: policy.NewKey(0, policy.Ingress, policy.ProtoUDP, streamPort, 16)}
	res.MapLatency.Enforcer = enf.name()
	res.MapLatency.latencies, err = t.enforcementLatency(ctx, enf, cfg.Updates, cfg.StreamInterval)
	if err != nil {
		return res, fmt.Errorf("policy update latency (policy map): %w", err)
	}

	// The agent's cells take over the maps: its policy replaces the
	// bench's.
	fmt.Fprintf(w, "policy updates through the agent's cells (%d)...\n", cfg.AgentUpdates)
	ag, err := newAgent(t.dir, os.Stderr)
	if err != nil {
		return res, err
	}
	t.add(ag.stop)
	if err := ag.adopt(ctx, t); err != nil {
		return res, err
	}
	aenf := &agentEnforcer{a: ag, src: t.a, dst: t.b}
	res.AgentLatency.Enforcer = aenf.name()
	res.AgentLatency.latencies, err = t.enforcementLatency(ctx, aenf, cfg.AgentUpdates, cfg.StreamInterval)
	if err != nil {
		return res, fmt.Errorf("policy update latency (agent): %w", err)
	}

	fmt.Fprintf(w, "map reconcilers (%d rounds)...\n", cfg.ReconcilerRounds)
	res.Reconcilers, err = measureReconcilers(ctx, filepath.Join(t.dir, "reconcilers"), cfg.ReconcilerPolicyEntries,
		cfg.ReconcilerPrefixes, cfg.ReconcilerRounds, os.Stderr)
	if err != nil {
		return res, err
	}
	res.LoadAfter = loadAvg()
	res.Write(w)
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
func medianRatio(b, a []float64) float64 { return median(ratios(b, a)) }

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
