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
		Short: "Run Kubernetes' NetworkPolicy e2e specs (Netpol) against a cellium cluster",
		Long: "e2enetpol builds Kubernetes' e2e.test and agnhost from tools/k8s (cached like the other\n" +
			"binaries), packs agnhost as the image the suite expects, and runs the \"[sig-network] Netpol\"\n" +
			"specs one e2e.test process each, then prints passed/failed/skipped.",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(newBuildCmd(), newListCmd(), newRunCmd())
	return root
}

func logger(w io.Writer) *slog.Logger { return harness.TextLogger(w) }

// filterFlags are the flags that select specs.
type filterFlags struct {
	focus, skip string
	forceSCTP   bool
}

func (f *filterFlags) register(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.focus, "focus", "", "run only the Netpol specs whose name also matches this regular expression (e.g. \"default-deny-ingress\")")
	cmd.Flags().StringVar(&f.skip, "skip", "", "leave out the specs whose name matches this regular expression")
	cmd.Flags().BoolVar(&f.forceSCTP, "sctp", false, "run the SCTP specs even if this kernel cannot open an SCTP socket")
}

func (f filterFlags) filter() e2enetpol.Filter {
	ok, reason := e2enetpol.KernelSCTP()
	return e2enetpol.Filter{Focus: f.focus, Skip: f.skip, SCTP: ok || f.forceSCTP, NoSCTPReason: reason}
}

// e2eBinaries builds (or finds) e2e.test and agnhost, and packs the
// agnhost image into dir.
func e2eBinaries(ctx context.Context, log *slog.Logger, dir string) (harness.E2EBinaries, string, string, error) {
	start := time.Now()
	bins, err := harness.EnsureE2EBinaries(ctx, log)
	if err != nil {
		return harness.E2EBinaries{}, "", "", err
	}
	log.Info("e2e binaries ready", "e2e.test", bins.E2ETest, "agnhost", bins.Agnhost, "took", time.Since(start).Round(time.Second))
	archive, name, err := e2enetpol.AgnhostImage(ctx, dir, bins)
	if err != nil {
		return harness.E2EBinaries{}, "", "", err
	}
	return bins, archive, name, nil
}

func newBuildCmd() *cobra.Command {
	var dir string
	cmd := &cobra.Command{
		Use:   "build",
		Short: "Build e2e.test (~12 minutes cold) and agnhost (~2) into the cache, and pack the agnhost image",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			bins, archive, name, err := e2eBinaries(cmd.Context(), logger(cmd.ErrOrStderr()), dir)
			if err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), bins.E2ETest)
			fmt.Fprintln(cmd.OutOrStdout(), bins.Agnhost)
			fmt.Fprintf(cmd.OutOrStdout(), "%s (%s)\n", archive, name)
			return nil
		},
	}
	cmd.Flags().StringVar(&dir, "dir", ".cellium-dev/e2e-netpol", "directory for the agnhost image archive")
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
			bins, err := harness.EnsureE2EBinaries(cmd.Context(), logger(cmd.ErrOrStderr()))
			if err != nil {
				return err
			}
			p, err := e2enetpol.ListSpecs(cmd.Context(), e2enetpol.Config{E2ETest: bins.E2ETest, Filter: f.filter(), Dir: dir})
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
			fmt.Fprintf(out, "%d to run, %d to skip\n", len(p.Run), len(p.Skipped))
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
		socket, ctr      string
		specTimeout      time.Duration
		realnode         bool
		keep             bool
		extraArgs        []string
		failOnSpecFailed bool
	)
	cmd := &cobra.Command{
		Use:   "run",
		Short: "Run the Netpol specs against a cluster and print passed/failed/skipped",
		Long: "run builds what is missing, lists the specs (dry run), imports the agnhost image into the node's\n" +
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
			dir, err := filepath.Abs(dir)
			if err != nil {
				return err
			}
			bins, archive, image, err := e2eBinaries(ctx, log, filepath.Join(dir, "images"))
			if err != nil {
				return err
			}
			cfg := e2enetpol.Config{
				E2ETest:     bins.E2ETest,
				Kubeconfig:  kubeconfig,
				Filter:      f.filter(),
				SpecTimeout: specTimeout,
				Dir:         filepath.Join(dir, "reports"),
				ExtraArgs:   extraArgs,
				Progress:    out,
			}
			plan, err := e2enetpol.ListSpecs(ctx, cfg)
			if err != nil {
				return err
			}
			fmt.Fprintf(out, "%d Netpol specs selected: %d to run, %d skipped\n", len(plan.Run)+len(plan.Skipped), len(plan.Run), len(plan.Skipped))
			if len(plan.Run) == 0 {
				return errors.New("no spec to run: check --focus and --skip (e2enetpol list shows the specs)")
			}

			if realnode {
				rn, err := startRealNode(ctx, log, filepath.Join(dir, "cluster"), archive)
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
				if socket == "" {
					socket = makeUpSocket(cfg.Kubeconfig)
				}
				if socket != "" {
					if ctr == "" {
						nb, _, err := harness.CachedNodeBinaries()
						if err != nil {
							return err
						}
						ctr = nb.Ctr
					}
					if err := e2enetpol.ImportImages(ctx, ctr, socket, archive); err != nil {
						return err
					}
					log.Info("imported the agnhost image", "image", image, "containerd", socket)
				} else {
					log.Warn("no --containerd-socket: the node must have the agnhost image already", "image", image)
				}
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
	cmd.Flags().StringVar(&dir, "dir", ".cellium-dev/e2e-netpol", "directory for the image archive, the reports and logs (and with --realnode, the cluster)")
	cmd.Flags().StringVar(&socket, "containerd-socket", "", "import the agnhost image into the containerd at this socket first (the node's; default: make up's node, when --kubeconfig is make up's)")
	cmd.Flags().StringVar(&ctr, "ctr", "", "ctr binary for --containerd-socket (default: the cached one)")
	cmd.Flags().DurationVar(&specTimeout, "spec-timeout", e2enetpol.DefaultSpecTimeout, "time limit of each spec")
	cmd.Flags().BoolVar(&realnode, "realnode", false, "start a cluster of its own with a real node for the run (root), and stop it after")
	cmd.Flags().BoolVar(&keep, "keep", false, "with --realnode: keep the cluster's logs (the cluster is stopped either way)")
	cmd.Flags().StringSliceVar(&extraArgs, "e2e-arg", nil, "extra e2e.test flag, e.g. --e2e-arg=--ginkgo.vv (repeatable)")
	cmd.Flags().BoolVar(&failOnSpecFailed, "fail", true, "exit with an error if a spec failed")
	return cmd
}
