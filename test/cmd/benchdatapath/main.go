// Command benchdatapath runs the datapath bench (`make bench-datapath`,
// root): throughput and request/response rate between two pods with and
// without cellium's programs, the policy-update-to-enforced latency
// (policy map written directly, and through the agent's cells), and the
// map reconcilers' throughput, the cross-node rows, and the control
// plane across real agents (node join, policy change on every node),
// and, with -hubble or -hubble-only (`make bench-hubble-datapath`),
// Hubble on a real agent (drop -> hubble observe --follow latency, a drop
// flood), checked against the aims. See test/benchdatapath.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/cellium/cellium/test/benchdatapath"
)

func main() {
	// The Hubble rows start this binary again in a pod's namespace as
	// their flooder.
	if ok, err := benchdatapath.FloodMain(); ok {
		if err != nil {
			fmt.Fprintln(os.Stderr, "benchdatapath flooder:", err)
			os.Exit(1)
		}
		return
	}
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
	cp := benchdatapath.ControlPlaneConfig{}
	controlPlane := flag.Bool("control-plane", true, "also time node joins and policy changes across real agents (API server, operator, one agent per node namespace)")
	cpOnly := flag.Bool("control-plane-only", false, "measure only the control-plane rows")
	flag.IntVar(&cp.Nodes, "control-plane-nodes", 2, "agents of the control-plane rows, each in a network namespace of its own")
	flag.IntVar(&cp.Joins, "control-plane-joins", 20, "node joins timed per routing mode")
	flag.IntVar(&cp.PolicyChanges, "control-plane-policy-changes", 20, "CNP changes timed per routing mode")
	cpModes := flag.String("control-plane-modes", "tunnel,native", "routing modes of the control-plane rows, comma-separated")
	flag.StringVar(&cp.BinDir, "bin-dir", "", "cellium-agent, cellium-operator and cellium-cni to run (make build's bin/); empty builds them")
	hb := benchdatapath.HubbleConfig{}
	hubble := flag.Bool("hubble", false, "also measure Hubble on a real agent: drop -> hubble observe --follow latency, a drop flood (memory, responsiveness, LostEvents)")
	hbOnly := flag.Bool("hubble-only", false, "measure only the Hubble rows")
	flag.IntVar(&hb.Samples, "hubble-samples", 200, "dropped datagrams timed to their hubble observe --follow line")
	flag.DurationVar(&hb.SampleTimeout, "hubble-sample-timeout", 2*time.Second, "how long a sample waits for its line before it counts as missed")
	flag.DurationVar(&hb.Flood, "hubble-flood", 10*time.Second, "how long the client pod floods the denied port (0: no flood)")
	flag.DurationVar(&hb.StatusEvery, "hubble-status-every", 100*time.Millisecond, "gap between the ServerStatus / GetFlows --last 1 probes during the flood")
	flag.StringVar(&hb.Hubble, "hubble-cli", "", "the upstream hubble CLI; empty takes the cached one (make hubble-binaries)")
	flag.Parse()
	hb.BinDir = cp.BinDir
	cp.Modes = strings.Split(*cpModes, ",")
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "benchdatapath: needs root (network namespaces, BPF); run it as root")
		os.Exit(1)
	}
	// A closed stdout (`| head`) must not kill the bench before it has
	// removed its namespaces: writes fail instead, and Run still cleans up.
	signal.Ignore(syscall.SIGPIPE)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	var err error
	only := *crossOnly || *cpOnly || *hbOnly
	if !only {
		_, err = benchdatapath.Run(ctx, cfg, os.Stdout)
	}
	if err == nil && (*crossNode && !only || *crossOnly) {
		xcfg := cfg
		xcfg.Rounds = *crossRounds
		_, err = benchdatapath.RunCrossNode(ctx, xcfg, os.Stdout)
	}
	if err == nil && (*controlPlane && !only || *cpOnly) {
		_, err = benchdatapath.RunControlPlane(ctx, cp, os.Stdout)
	}
	if err == nil && (*hubble && !only || *hbOnly) {
		_, err = benchdatapath.RunHubble(ctx, hb, os.Stdout)
	}
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "benchdatapath:", err)
		os.Exit(1)
	}
}
