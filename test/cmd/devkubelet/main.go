// Command devkubelet is a minimal kubelet for cellium development: it
// registers one node, gives each pod bound to it a network namespace
// attached through the CNI plugin (libcni, as a container runtime does)
// and reports the pod Running with its IP. It runs no containers.
//
//	devkubelet run --kubeconfig K --node-name N --node-ip 127.0.0.2 \
//	    --cni-conf-dir D --cni-bin-dir D --state-dir D [--cleanup]
//	devkubelet cleanup --state-dir D [--kubeconfig K ...]
//	devkubelet bench -n 100
//
// `run` needs root (network namespaces). See test/devkubelet for what it
// does and Documentation/getting-started.md for how make up uses it.
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/cellium/cellium/test/devkubelet"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := newRootCmd().ExecuteContext(ctx)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "devkubelet:", err)
		os.Exit(1)
	}
}

func newRootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:           "devkubelet",
		Short:         "A minimal kubelet that gives pods network namespaces through CNI (for cellium development)",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(newRunCmd(), newCleanupCmd(), newBenchCmd())
	return root
}

// kubeletFlags are the flags of run and cleanup.
type kubeletFlags struct {
	kubeconfig string
	nodeIP     string
	cfg        devkubelet.Config
	debug      bool
}

func (f *kubeletFlags) register(cmd *cobra.Command) {
	fs := cmd.Flags()
	fs.StringVar(&f.kubeconfig, "kubeconfig", os.Getenv("KUBECONFIG"), "kubeconfig of the cluster")
	fs.StringVar(&f.cfg.NodeName, "node-name", "", "name of the node to register")
	fs.StringVar(&f.nodeIP, "node-ip", "127.0.0.2", "InternalIP to report for the node (only reported, never routed to: a 127.0.0.0/8 address is fine)")
	fs.StringVar(&f.cfg.CNIConfDir, "cni-conf-dir", "/etc/cni/net.d", "CNI network configuration directory (the first .conflist in lexical order is used)")
	fs.StringSliceVar(&f.cfg.CNIBinDirs, "cni-bin-dir", []string{"/opt/cni/bin"}, "directories searched for CNI plugins (repeatable)")
	fs.StringVar(&f.cfg.StateDir, "state-dir", "/var/lib/devkubelet", "directory of the sandbox records and libcni's cache")
	fs.StringVar(&f.cfg.NetnsDir, "netns-dir", devkubelet.DefaultNetnsDir, "where pod network namespaces are pinned")
	fs.IntVar(&f.cfg.Workers, "workers", devkubelet.DefaultWorkers, "pods set up or torn down at once")
	fs.BoolVar(&f.debug, "debug", false, "log every pod step")
}

// kubelet builds the kubelet from the flags.
func (f *kubeletFlags) kubelet(cmd *cobra.Command) (*devkubelet.Kubelet, error) {
	if f.kubeconfig == "" {
		return nil, errors.New("no --kubeconfig (and KUBECONFIG is not set)")
	}
	ip, err := netip.ParseAddr(f.nodeIP)
	if err != nil {
		return nil, fmt.Errorf("--node-ip %q: %w", f.nodeIP, err)
	}
	f.cfg.NodeIP = ip
	rc, err := clientcmd.BuildConfigFromFlags("", f.kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("--kubeconfig %s: %w", f.kubeconfig, err)
	}
	rc.UserAgent = "devkubelet"
	rc.QPS, rc.Burst = 200, 400 // a bench creates pods fast
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, err
	}
	level := slog.LevelInfo
	if f.debug {
		level = slog.LevelDebug
	}
	f.cfg.Logger = slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), &slog.HandlerOptions{Level: level}))
	return devkubelet.New(f.cfg, cs)
}

// needRoot fails with advice unless running as root.
func needRoot(what string) error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("%s needs root: it creates network namespaces and runs CNI plugins that create veths; run it as root (sudo)", what)
	}
	return nil
}

func newRunCmd() *cobra.Command {
	var (
		f       kubeletFlags
		cleanup bool
	)
	cmd := &cobra.Command{
		Use:   "run",
		Short: "Register the node and run its pods until SIGTERM/SIGINT",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := needRoot("devkubelet run"); err != nil {
				return err
			}
			if f.cfg.NodeName == "" {
				return errors.New("--node-name is required")
			}
			k, err := f.kubelet(cmd)
			if err != nil {
				return err
			}
			runErr := k.Run(cmd.Context())
			if !cleanup {
				return runErr
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			return errors.Join(runErr, k.Cleanup(ctx))
		},
	}
	f.register(cmd)
	cmd.Flags().BoolVar(&cleanup, "cleanup", false, "on stop, tear down every sandbox (CNI DEL, network namespace) and delete the Node")
	return cmd
}

func newCleanupCmd() *cobra.Command {
	var f kubeletFlags
	cmd := &cobra.Command{
		Use:   "cleanup",
		Short: "Tear down the sandboxes recorded in --state-dir (CNI DEL while the agent answers, then force) and delete the Node",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := needRoot("devkubelet cleanup"); err != nil {
				return err
			}
			var errs []error
			if f.kubeconfig != "" && f.cfg.NodeName != "" {
				k, err := f.kubelet(cmd)
				if err != nil {
					return err
				}
				ctx, cancel := context.WithTimeout(cmd.Context(), 30*time.Second)
				errs = append(errs, k.Cleanup(ctx))
				cancel()
			}
			removed, err := devkubelet.RemoveLeftovers(f.cfg.StateDir)
			for _, r := range removed {
				fmt.Fprintln(cmd.OutOrStdout(), "removed", r)
			}
			return errors.Join(append(errs, err)...)
		},
	}
	f.register(cmd)
	return cmd
}
