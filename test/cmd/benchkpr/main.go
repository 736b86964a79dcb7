// Command benchkpr runs the kube-proxy replacement's cluster-level
// benchmark (`make bench-kpr`, root): a two-node real cluster once with
// kube-proxy (nftables) and once with cellium's replacement, side by side:
// per-packet cost, connect latency and Service change latency at 1, 1,000
// and 10,000 Services, memory and map sizes. See test/benchkpr. With
// "probe" as its first argument it is one of the benchmark's probes,
// started inside a pod's or a node's namespaces.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"

	"github.com/cellium/cellium/test/benchkpr"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if len(os.Args) > 1 && os.Args[1] == "probe" {
		if err := benchkpr.Probe(ctx, os.Args[2:], os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, "benchkpr probe:", err)
			os.Exit(1)
		}
		return
	}
	var cfg benchkpr.Config
	modes := flag.String("modes", "kube-proxy,kpr", "modes to run, in order: kube-proxy (nftables, socket LB off) and kpr (cellium's replacement, no kube-proxy)")
	sizes := flag.String("sizes", "1,1000,10000", "numbers of Services present for connect latency, Service changes and memory, ascending")
	flag.IntVar(&cfg.BackendsPerService, "backends", 10, "backends of each bulk Service (never contacted)")
	flag.IntVar(&cfg.Changes, "changes", 30, "Service changes (a backend added or removed) timed per size")
	flag.IntVar(&cfg.Connects, "connects", 2000, "connects timed per size")
	flag.IntVar(&cfg.RoundTrips, "round-trips", 10000, "1-byte round trips per request/response measurement")
	flag.IntVar(&cfg.IperfSeconds, "iperf-seconds", 3, "length of each iperf3 run")
	flag.IntVar(&cfg.Rounds, "rounds", 3, "measurements of each per-packet path (medians)")
	flag.IntVar(&cfg.LBMapMax, "lb-map-max", 262144, "--bpf-lb-map-max of the replacement's agents (bpf.lbMapMax)")
	flag.StringVar(&cfg.BinDir, "bin-dir", "", "make build's bin/ (cellium's image is packed from it); empty builds it")
	flag.Parse()
	cfg.Modes = strings.Split(*modes, ",")
	for _, s := range strings.Split(*sizes, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil {
			fmt.Fprintf(os.Stderr, "benchkpr: -sizes %q: %v\n", *sizes, err)
			os.Exit(2)
		}
		cfg.Sizes = append(cfg.Sizes, n)
	}
	cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, nil))
	if _, err := benchkpr.Run(ctx, cfg, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "benchkpr:", err)
		os.Exit(1)
	}
}
