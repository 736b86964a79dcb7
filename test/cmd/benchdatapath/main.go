// Command benchdatapath runs the datapath bench (`make bench-datapath`,
// root): throughput and request/response rate between two pods with and
// without cellium's programs, the policy-update-to-enforced latency
// (policy map written directly, and through the agent's cells), and the
// map reconcilers' throughput, checked against the aims. See
// test/benchdatapath.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/cellium/cellium/test/benchdatapath"
)

func main() {
	cfg := benchdatapath.Config{}
	flag.DurationVar(&cfg.Duration, "duration", 3*time.Second, "length of each iperf3 and sockperf run (whole seconds)")
	flag.IntVar(&cfg.Rounds, "rounds", 6, "rounds of (bare, stack, redirect) measurements, every other one in reverse order; medians of per-round ratios are compared")
	flag.IntVar(&cfg.Updates, "updates", 200, "policy updates timed writing the policy map directly")
	flag.IntVar(&cfg.AgentUpdates, "agent-updates", 200, "policy updates timed through the agent's cells (a CNP written and removed)")
	flag.IntVar(&cfg.ReconcilerPolicyEntries, "reconciler-policy-entries", 10000, "policy entries replaced per round of the policy map reconciler's measurement")
	flag.IntVar(&cfg.ReconcilerPrefixes, "reconciler-prefixes", 50000, "prefixes written per round of the ipcache reconciler's measurement")
	flag.IntVar(&cfg.ReconcilerRounds, "reconciler-rounds", 5, "rounds of each map reconciler measurement (median)")
	flag.DurationVar(&cfg.StreamInterval, "stream-interval", 100*time.Microsecond, "gap between the stream's datagrams during the latency test (below 1ms the sender spins)")
	flag.IntVar(&cfg.IPCachePrefixes, "ipcache-prefixes", 4000, "prefixes loaded into the ipcache besides the pods")
	flag.IntVar(&cfg.PolicyEntries, "policy-entries", 500, "policy entries per pod besides the peer's allows")
	flag.BoolVar(&cfg.Pin, "pin", false, "run the clients on CPU 0 and the servers on CPU 1 (taskset), the same for every variant")
	crossNode := flag.Bool("cross-node", true, "also measure pod to pod across two nodes: cellium native and tunnel vs bare routes and the kernel's VXLAN")
	crossOnly := flag.Bool("cross-node-only", false, "measure only the cross-node rows")
	crossRounds := flag.Int("cross-node-rounds", 2, "rounds of the cross-node variants")
	flag.Parse()
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "benchdatapath: needs root (network namespaces, BPF); run it as root")
		os.Exit(1)
	}
	// A closed stdout (`| head`) must not kill the bench before it has
	// removed its namespaces: writes fail instead, and Run still cleans up.
	signal.Ignore(syscall.SIGPIPE)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	var err error
	if !*crossOnly {
		_, err = benchdatapath.Run(ctx, cfg, os.Stdout)
	}
	if err == nil && (*crossNode || *crossOnly) {
		xcfg := cfg
		xcfg.Rounds = *crossRounds
		_, err = benchdatapath.RunCrossNode(ctx, xcfg, os.Stdout)
	}
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "benchdatapath:", err)
		os.Exit(1)
	}
}
