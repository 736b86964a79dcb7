// Command scale runs the scale simulation (test/scale): one real
// cellium-agent and cellium-operator among the objects of a large
// simulated cluster, against a real kube-apiserver and etcd, in
// CiliumEndpoint mode, CiliumEndpointSlice mode, kvstore mode or several, and prints the
// figures as one markdown table. `make scale` runs it;
// Documentation/operations/scale.md explains it.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/cellium/cellium/test/scale"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "scale:", err)
		os.Exit(1)
	}
}

func run() error {
	def := scale.CIConfig(scale.ModeCEP)
	var (
		cfg  = def
		mode = flag.String("mode", "both", "cep, ces (the operator at the Helm chart's --ces-rate-limits steps), kvstore (Cilium's kvstore mode: identities, node keys and ipcache keys in etcd, CEPs and CiliumNodes too), both (cep and ces), all, or a comma-separated list")
		out  = flag.String("out", "", "also write the table to this file")
		to   = flag.Duration("timeout", 2*time.Hour, "bound on the whole run")
	)
	flag.IntVar(&cfg.Nodes, "nodes", def.Nodes, "other nodes (CiliumNodes)")
	flag.IntVar(&cfg.Pods, "pods", def.Pods, "pods on the other nodes: the agent's remote endpoints")
	flag.IntVar(&cfg.Services, "services", def.Services, "Services, each with one EndpointSlice of 3 pods")
	flag.IntVar(&cfg.Policies, "policies", def.Policies, "NetworkPolicies")
	flag.IntVar(&cfg.Identities, "identities", def.Identities, "CiliumIdentities (the pods share them)")
	flag.Float64Var(&cfg.Churn, "churn", def.Churn, "remote endpoint changes per second during the churn phase (a pod replacement is 2)")
	flag.DurationVar(&cfg.ChurnDuration, "churn-duration", def.ChurnDuration, "length of the churn phase")
	flag.IntVar(&cfg.Samples, "samples", def.Samples, "new pods whose CEP-to-ipcache latency is measured")
	flag.IntVar(&cfg.PolicyChanges, "policy-changes", def.PolicyChanges, "timed changes of the measured policy")
	flag.IntVar(&cfg.Concurrency, "concurrency", def.Concurrency, "admin client requests in flight while creating objects")
	flag.StringVar(&cfg.BinDir, "bin-dir", "", "directory with cellium-agent and cellium-operator (default: build them)")
	heapProfile := flag.String("heap-profile", "", "save the agent's heap profile (go tool pprof) here once every remote object is in; with -mode both, the mode is added to the name (heap-cep.pprof, heap-ces.pprof)")
	flag.BoolVar(&cfg.KeepDir, "keep", false, "keep the cluster's work directory (logs)")
	flag.Func("agent-arg", "a flag for cellium-agent (repeatable), e.g. -agent-arg=--k8s-client-qps=50", func(v string) error {
		cfg.AgentArgs = append(cfg.AgentArgs, v)
		return nil
	})
	flag.Func("operator-arg", "a flag for cellium-operator (repeatable), e.g. -operator-arg=--ces-rate-limits=[{\"nodes\":0,\"limit\":10,\"burst\":20}] (the flag's default instead of the chart's steps)", func(v string) error {
		cfg.OperatorArgs = append(cfg.OperatorArgs, v)
		return nil
	})
	flag.Parse()

	var modes []scale.Mode
	for m := range strings.SplitSeq(*mode, ",") {
		switch m {
		case "both":
			modes = append(modes, scale.ModeCEP, scale.ModeCES)
		case "all":
			modes = append(modes, scale.Modes...)
		case string(scale.ModeCEP), string(scale.ModeCES), string(scale.ModeKVStore):
			modes = append(modes, scale.Mode(m))
		default:
			return fmt.Errorf("-mode %q: want cep, ces, kvstore, both, all or a comma-separated list", *mode)
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, *to)
	defer cancel()
	cfg.Log = slog.New(slog.NewTextHandler(os.Stderr, nil))
	var results []*scale.Result
	var errs []error
	for _, m := range modes {
		c := cfg
		c.Mode = m
		if *heapProfile != "" {
			c.HeapProfile = *heapProfile
			if len(modes) > 1 {
				ext := filepath.Ext(*heapProfile)
				c.HeapProfile = strings.TrimSuffix(*heapProfile, ext) + "-" + string(m) + ext
			}
		}
		cfg.Log.Info("simulation", "setup", c.Setup())
		r, err := scale.Run(ctx, c)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s mode: %w", m, err))
			continue
		}
		results = append(results, r)
	}
	if len(results) > 0 {
		table := scale.Table(results...)
		fmt.Print(table)
		if *out != "" {
			if err := os.WriteFile(*out, []byte(table), 0o644); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}
