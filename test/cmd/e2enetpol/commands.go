package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"

	"github.com/cellium/cellium/test/e2enetpol"
	"github.com/cellium/cellium/test/harness"
)

// defaultKubeconfig is the admin kubeconfig `make up` writes
// (devcluster up --dir .cellium-dev).
const defaultKubeconfig = ".cellium-dev/kubeconfig"

func newRootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:   "e2enetpol",
		Short: "Run Kubernetes' NetworkPolicy (Netpol) or sig-network Conformance e2e specs against a cellium cluster",
		Long: "e2enetpol builds Kubernetes' e2e.test and agnhost from tools/k8s (cached like the other\n" +
			"binaries), packs agnhost (and for --suite conformance the other images, with this machine's\n" +
			"sh, nc, curl, dig...) as the images the suite expects, and runs the \"[sig-network] Netpol\"\n" +
			"specs (--suite netpol) or the \"[sig-network] ... [Conformance]\" specs (--suite conformance)\n" +
			"one e2e.test process each, then prints passed/failed/skipped.",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(newBuildCmd(), newListCmd(), newRunCmd())
	return root
}

func logger(w io.Writer) *slog.Logger { return harness.TextLogger(w) }

// filterFlags are the flags that select specs.
type filterFlags struct {
	suite       string
	focus, skip string
	forceSCTP   bool
	forceDNS    bool
}

func (f *filterFlags) register(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.suite, "suite", e2enetpol.Netpol.Name, "the specs: netpol (\"[sig-network] Netpol\"), conformance (\"[sig-network] ... [Conformance]\") or services (the Services, NodePort, affinity and hostPort specs outside Conformance)")
	cmd.Flags().StringVar(&f.focus, "focus", "", "run only the suite's specs whose name also matches this regular expression (e.g. \"default-deny-ingress\")")
	cmd.Flags().StringVar(&f.skip, "skip", "", "leave out the specs whose name matches this regular expression")
	cmd.Flags().BoolVar(&f.forceSCTP, "sctp", false, "run the SCTP specs even if this kernel cannot open an SCTP socket")
	cmd.Flags().BoolVar(&f.forceDNS, "dns", false, "run the specs that need the cluster's DNS even if it has no kube-dns Service, or kubelets without its clusterDNS or the cluster.local domain")
}

func (f filterFlags) filter() (e2enetpol.Filter, error) {
	suite, err := e2enetpol.SuiteNamed(f.suite)
	if err != nil {
		return e2enetpol.Filter{}, err
	}
	ok, reason := e2enetpol.KernelSCTP()
	return e2enetpol.Filter{Suite: suite, Focus: f.focus, Skip: f.skip, Rules: e2enetpol.SCTPRule(ok || f.forceSCTP, reason)}, nil
}

// defaultDir is where a suite's run keeps its images, reports and logs
// unless --dir says otherwise: .cellium-dev/e2e-<suite>.
func defaultDir(suite string) string { return ".cellium-dev/e2e-" + suite }

// e2eBinaries builds (or finds) e2e.test and agnhost, and packs the
// suite's images into dir.
func e2eBinaries(ctx context.Context, log *slog.Logger, suite e2enetpol.Suite, dir string) (harness.E2EBinaries, []e2enetpol.PackedImage, error) {
	start := time.Now()
	bins, err := harness.EnsureE2EBinaries(ctx, log)
	if err != nil {
		return harness.E2EBinaries{}, nil, err
	}
	log.Info("e2e binaries ready", "e2e.test", bins.E2ETest, "agnhost", bins.Agnhost, "took", time.Since(start).Round(time.Second))
	imgs, err := e2enetpol.Images(ctx, suite, dir, bins)
	if err != nil {
		return harness.E2EBinaries{}, nil, err
	}
	return bins, imgs, nil
}

// archives are the images' archive paths.
func archives(imgs []e2enetpol.PackedImage) []string {
	var out []string
	for _, i := range imgs {
		out = append(out, i.Archive)
	}
	return out
}

// names are the images' names.
func names(imgs []e2enetpol.PackedImage) []string {
	var out []string
	for _, i := range imgs {
		out = append(out, i.Name)
	}
	return out
}

func newBuildCmd() *cobra.Command {
	var dir, suiteName string
	cmd := &cobra.Command{
		Use:   "build",
		Short: "Build e2e.test (~12 minutes cold) and agnhost (~2) into the cache, and pack the suite's images",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			suite, err := e2enetpol.SuiteNamed(suiteName)
			if err != nil {
				return err
			}
			if dir == "" {
				dir = filepath.Join(defaultDir(suite.Name), "images")
			}
			bins, imgs, err := e2eBinaries(cmd.Context(), logger(cmd.ErrOrStderr()), suite, dir)
			if err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), bins.E2ETest)
			fmt.Fprintln(cmd.OutOrStdout(), bins.Agnhost)
			for _, i := range imgs {
				fmt.Fprintf(cmd.OutOrStdout(), "%s (%s)\n", i.Archive, i.Name)
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&suiteName, "suite", e2enetpol.Netpol.Name, "whose images to pack: netpol (agnhost), conformance or services (agnhost with sh, nc, curl, dig...; glibc-dns-testing; nginx)")
	cmd.Flags().StringVar(&dir, "dir", "", "directory for the image archives (default .cellium-dev/e2e-<suite>/images)")
	return cmd
}

func newListCmd() *cobra.Command {
	var (
		f   filterFlags
		dir string
	)
	cmd := &cobra.Command{
		Use:   "list",
		Short: "Print the specs a run would run and those it would skip (a dry run of e2e.test: no cluster needed)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			filter, err := f.filter()
			if err != nil {
				return err
			}
			bins, err := harness.EnsureE2EBinaries(cmd.Context(), logger(cmd.ErrOrStderr()))
			if err != nil {
				return err
			}
			p, err := e2enetpol.ListSpecs(cmd.Context(), e2enetpol.Config{E2ETest: bins.E2ETest, Filter: filter, Dir: dir})
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			for _, s := range p.Run {
				fmt.Fprintf(out, "run   %s\n", s.Name)
			}
			for _, s := range p.Skipped {
				fmt.Fprintf(out, "skip  %s\n      (%s)\n", s.Name, s.Reason)
			}
			fmt.Fprintf(out, "%d to run, %d to skip (and those a run detects the cluster cannot serve, e.g. the DNS specs without kube-dns)\n", len(p.Run), len(p.Skipped))
			return nil
		},
	}
	f.register(cmd)
	cmd.Flags().StringVar(&dir, "dir", filepath.Join(os.TempDir(), "e2enetpol-list"), "directory for the dry run's report")
	return cmd
}

func newRunCmd() *cobra.Command {
	var (
		f                filterFlags
		kubeconfig, dir  string
		socket           []string
		ctr              string
		specTimeout      time.Duration
		realnode         bool
		keep             bool
		extraArgs        []string
		failOnSpecFailed bool
	)
	cmd := &cobra.Command{
		Use:   "run",
		Short: "Run the suite's specs against a cluster and print passed/failed/skipped",
		Long: "run builds what is missing, lists the specs (dry run), imports the images into the node's\n" +
			"containerd (--containerd-socket; found by itself for make up's cluster), and runs each spec in an\n" +
			"e2e.test process of its own.\n" +
			"With --realnode it first starts a cluster of its own the way make up does (control plane with\n" +
			"kube-controller-manager, a real node: containerd, kubelet, kube-scheduler, kube-proxy, and cellium\n" +
			"installed from its chart), imports the image there, and stops it all at the end (root; only one\n" +
			"node with kube-proxy can run on a machine at a time).",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			log := logger(cmd.ErrOrStderr())
			out := cmd.OutOrStdout()
			filter, err := f.filter()
			if err != nil {
				return err
			}
			if dir == "" {
				dir = defaultDir(filter.Suite.Name)
			}
			dir, err := filepath.Abs(dir)
			if err != nil {
				return err
			}
			bins, imgs, err := e2eBinaries(ctx, log, filter.Suite, filepath.Join(dir, "images"))
			if err != nil {
				return err
			}
			cfg := e2enetpol.Config{
				E2ETest:     bins.E2ETest,
				Kubeconfig:  kubeconfig,
				Filter:      filter,
				SpecTimeout: specTimeout,
				Dir:         filepath.Join(dir, "reports"),
				ExtraArgs:   extraArgs,
				Progress:    out,
			}
			plan, err := e2enetpol.ListSpecs(ctx, cfg)
			if err != nil {
				return err
			}
			if len(plan.Run) == 0 {
				return errors.New("no spec to run: check --focus and --skip (e2enetpol list shows the specs)")
			}

			if realnode {
				rn, err := startRealNode(ctx, log, filepath.Join(dir, "cluster"), archives(imgs)...)
				if err != nil {
					return err
				}
				defer func() {
					if err := rn.stop(keep); err != nil {
						log.Error("stop the cluster", "err", err)
					}
				}()
				cfg.Kubeconfig = rn.kubeconfig
			} else {
				if cfg.Kubeconfig, err = filepath.Abs(cfg.Kubeconfig); err != nil {
					return err
				}
				if _, err := os.Stat(cfg.Kubeconfig); err != nil {
					return fmt.Errorf("no cluster: %w (start one with `make up`, pass --kubeconfig, or use --realnode)", err)
				}
				sockets := socket
				if len(sockets) == 0 {
					sockets = makeUpSockets(cfg.Kubeconfig)
				}
				if len(sockets) > 0 {
					if ctr == "" {
						nb, _, err := harness.CachedNodeBinaries()
						if err != nil {
							return err
						}
						ctr = nb.Ctr
					}
					for _, sock := range sockets {
						if err := e2enetpol.ImportImages(ctx, ctr, sock, archives(imgs)...); err != nil {
							return err
						}
						log.Info("imported the e2e images", "images", names(imgs), "containerd", sock)
					}
				} else {
					log.Warn("no --containerd-socket: the nodes must have the e2e images already", "images", names(imgs))
				}
			}
			// What only the running cluster tells: whether it has a DNS
			// server for the specs that resolve names.
			if !f.forceDNS {
				dnsRules, err := e2enetpol.DNSRule(ctx, cfg.Kubeconfig)
				if err != nil {
					return err
				}
				if plan, err = plan.Skip(dnsRules...); err != nil {
					return err
				}
			}
			fmt.Fprintf(out, "%d %s specs selected: %d to run, %d skipped\n", len(plan.Run)+len(plan.Skipped), filter.Suite.Title, len(plan.Run), len(plan.Skipped))

			watchCtx, stopWatch := context.WithCancel(ctx)
			defer stopWatch()
			if cfg.Placement, err = e2enetpol.WatchPlacement(watchCtx, cfg.Kubeconfig); err != nil {
				return err
			}
			sum, runErr := e2enetpol.Run(ctx, cfg, plan)
			fmt.Fprintln(out)
			if err := sum.Write(out); err != nil {
				return err
			}
			fmt.Fprintf(out, "reports and e2e.test logs: %s\n", cfg.Dir)
			if runErr != nil {
				return runErr
			}
			if failOnSpecFailed && sum.Count(e2enetpol.Failed) > 0 {
				return fmt.Errorf("%d specs failed", sum.Count(e2enetpol.Failed))
			}
			return nil
		},
	}
	f.register(cmd)
	cmd.Flags().StringVar(&kubeconfig, "kubeconfig", defaultKubeconfig, "admin kubeconfig of the cluster (make up writes .cellium-dev/kubeconfig)")
	cmd.Flags().StringVar(&dir, "dir", "", "directory for the image archives, the reports and logs (and with --realnode, the cluster); default .cellium-dev/e2e-<suite>")
	cmd.Flags().StringSliceVar(&socket, "containerd-socket", nil, "import the e2e images into the containerd at these sockets first (the nodes'; repeatable; default: every node of make up's cluster, when --kubeconfig is make up's)")
	cmd.Flags().StringVar(&ctr, "ctr", "", "ctr binary for --containerd-socket (default: the cached one)")
	cmd.Flags().DurationVar(&specTimeout, "spec-timeout", e2enetpol.DefaultSpecTimeout, "time limit of each spec")
	cmd.Flags().BoolVar(&realnode, "realnode", false, "start a cluster of its own with a real node for the run (root), and stop it after")
	cmd.Flags().BoolVar(&keep, "keep", false, "with --realnode: keep the cluster's logs (the cluster is stopped either way)")
	cmd.Flags().StringSliceVar(&extraArgs, "e2e-arg", nil, "extra e2e.test flag, e.g. --e2e-arg=--ginkgo.vv (repeatable)")
	cmd.Flags().BoolVar(&failOnSpecFailed, "fail", true, "exit with an error if a spec failed")
	return cmd
}
