package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/cellium/cellium/test/devkubelet/devnode"
	"github.com/cellium/cellium/test/harness"
	"github.com/cellium/cellium/test/realnode"
)

// stateFile records what up started; its presence marks a directory as
// devcluster's.
const stateFile = "devcluster.json"

// state is the content of stateFile.
type state struct {
	// Processes are the names of the processes up started, in start order;
	// each has <name>.pid and <name>.log in the directory.
	Processes  []string  `json:"processes"`
	APIServer  string    `json:"apiserver,omitempty"`
	Kubeconfig string    `json:"kubeconfig,omitempty"`
	Started    time.Time `json:"started"`
	// Node is the kind of node (nodeReal, nodeDev; empty: dev).
	Node string `json:"node,omitempty"`
}

// stopTimeout is how long each process gets after SIGTERM before SIGKILL.
const stopTimeout = 10 * time.Second

func newRootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:   "devcluster",
		Short: "Run a local Kubernetes control plane (etcd, kube-apiserver) for cellium development",
		Long: "devcluster starts etcd and kube-apiserver (and optionally kube-controller-manager) on 127.0.0.1\n" +
			"as background processes, with all state in one directory. The binaries are built from\n" +
			"tools/etcd and tools/k8s on first use and cached (see test/harness).",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(newUpCmd(), newDownCmd(), newStatusCmd(), newBuildCmd(), newBuildNodeCmd(), newBuildKubectlCmd(), newBuildHubbleCmd())
	return root
}

func addDirFlag(cmd *cobra.Command, dir *string) {
	cmd.Flags().StringVar(dir, "dir", ".cellium-dev", "directory holding the cluster's state (certificates, etcd data, logs, pid files, kubeconfig)")
}

func logger(w io.Writer) *slog.Logger { return harness.TextLogger(w) }

func newUpCmd() *cobra.Command {
	var (
		dir     string
		opts    harness.Options
		node    nodeOptions
		timeout time.Duration
	)
	cmd := &cobra.Command{
		Use:   "up",
		Short: "Start the cluster (control plane, cellium-operator, cellium-agent, devkubelet, demo pods) in the background",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			opts.StartTimeout = timeout
			node.timeout = timeout
			if node.kind != nodeReal && node.kind != nodeDev {
				return fmt.Errorf("--node=%s: want %s or %s", node.kind, nodeReal, nodeDev)
			}
			if node.nodes != 1 && (node.kind != nodeReal || node.controlPlaneOnly) {
				return fmt.Errorf("--nodes=%d: several nodes are for --node %s only", node.nodes, nodeReal)
			}
			if err := realnode.CheckNodeCount(node.nodes); err != nil {
				return fmt.Errorf("--nodes: %w", err)
			}
			if node.kind == nodeReal && !node.controlPlaneOnly {
				abs, err := filepath.Abs(dir)
				if err != nil {
					return err
				}
				return upReal(cmd.Context(), cmd.OutOrStdout(), cmd.ErrOrStderr(), abs, timeout, node)
			}
			return up(cmd.Context(), cmd.OutOrStdout(), cmd.ErrOrStderr(), dir, opts, node)
		},
	}
	addDirFlag(cmd, &dir)
	cmd.Flags().BoolVar(&opts.ControllerManager, "controller-manager", false, "also run kube-controller-manager (garbage collection, namespace cleanup, default service accounts)")
	cmd.Flags().IntVar(&opts.APIServerPort, "apiserver-port", 0, "secure port of kube-apiserver on 127.0.0.1 (0: a free port)")
	cmd.Flags().DurationVar(&timeout, "timeout", 2*time.Minute, "how long to wait for each component to become ready (building binaries not included)")
	cmd.Flags().StringSliceVar(&opts.APIServerArgs, "apiserver-arg", nil, "extra kube-apiserver flag, e.g. --apiserver-arg=--v=2 (repeatable)")
	cmd.Flags().StringSliceVar(&opts.ControllerManagerArgs, "controller-manager-arg", nil, "extra kube-controller-manager flag (repeatable)")
	node.register(cmd)
	return cmd
}

func up(ctx context.Context, stdout, stderr io.Writer, dir string, opts harness.Options, node nodeOptions) error {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	if err := checkRoot(os.Geteuid(), node.controlPlaneOnly); err != nil {
		return err
	}
	log := logger(stderr)
	// Binaries first: building them may take long, and fail, before the
	// directory is touched.
	if opts.Binaries, err = harness.EnsureBinaries(ctx, log); err != nil {
		return err
	}
	if !node.controlPlaneOnly {
		if node.bins, err = celliumBinaries(ctx, node.binDir, log); err != nil {
			return err
		}
	}
	if err := prepareDir(dir, stderr); err != nil {
		return err
	}
	st := state{Started: time.Now().UTC()}
	if err := writeState(dir, st); err != nil {
		return err
	}

	if !node.controlPlaneOnly && node.hostRouting {
		// The agent turns on forwarding; down turns it back.
		if err := saveHostSysctls(dir, "/proc/sys"); err != nil {
			return err
		}
	}

	opts.Dir = dir
	opts.Detach = true
	opts.Logger = log
	c, err := harness.Start(ctx, opts)
	if err != nil {
		return fmt.Errorf("%w\n(logs are in %s; `devcluster down --dir %s` cleans up)", err, dir, dir)
	}
	for _, p := range c.Processes() {
		st.Processes = append(st.Processes, p.Name())
	}
	st.APIServer, st.Kubeconfig = c.APIServerURL(), c.Kubeconfig()
	if err := writeState(dir, st); err != nil {
		return err
	}
	hint := fmt.Sprintf("\n(logs are in %s; `devcluster down --dir %s` cleans up)", relativeToWD(dir), relativeToWD(dir))

	// Programs that run on top of the control plane, in start order; down
	// stops them first.
	if !node.controlPlaneOnly {
		// The operator and the agent run with the credentials of their
		// ServiceAccounts, bound to the chart's roles.
		if node.agentKubeconfig, err = c.AgentKubeconfig(ctx); err != nil {
			return fmt.Errorf("%w%s", err, hint)
		}
		if node.operatorKubeconfig, err = c.OperatorKubeconfig(ctx); err != nil {
			return fmt.Errorf("%w%s", err, hint)
		}
		for _, a := range addons(dir, c, node) {
			p, err := a.process()
			if err != nil {
				return err
			}
			log.Info("starting " + p.Name)
			r, err := p.Start()
			if err != nil {
				return errors.Join(err, writeState(dir, st))
			}
			st.Processes = append(st.Processes, r.Name())
			if err := writeState(dir, st); err != nil {
				return err
			}
			wctx, cancel := context.WithTimeout(ctx, node.timeout)
			err = a.wait(wctx, r)
			cancel()
			if err != nil {
				return fmt.Errorf("%w%s", err, hint)
			}
		}
	}

	kubeconfig := relativeToWD(c.Kubeconfig())
	fmt.Fprintf(stdout, "cluster is up: kube-apiserver %s (%s)\n", c.APIServerURL(), strings.Join(st.Processes, ", "))
	fmt.Fprintf(stdout, "kubeconfig: %s\n\n", kubeconfig)
	fmt.Fprintf(stdout, "  kubectl --kubeconfig %s get ns\n", kubeconfig)
	fmt.Fprintf(stdout, "  export KUBECONFIG=%s\n\n", c.Kubeconfig())
	if !node.controlPlaneOnly {
		if err := demo(ctx, stdout, dir, c, node); err != nil {
			return fmt.Errorf("%w%s", err, hint)
		}
	}
	fmt.Fprintf(stdout, "logs: %s/*.log; stop with: devcluster down --dir %s\n", relativeToWD(dir), relativeToWD(dir))
	return nil
}

// e2eDirs are the folders the e2e commands keep in make's --dir
// (make e2e-binaries packs the e2e images there before any make up).
var e2eDirs = []string{"e2e-netpol", "e2e-conformance"}

// onlyE2EDirs reports whether entries are at most e2eDirs: a directory
// that holds no cluster.
func onlyE2EDirs(entries []os.DirEntry) bool {
	for _, e := range entries {
		if !e.IsDir() || !slices.Contains(e2eDirs, e.Name()) {
			return false
		}
	}
	return true
}

// prepareDir makes sure dir can take a new cluster: it does not exist, is
// empty, or holds the state of a devcluster that is not running any more
// (which is removed).
func prepareDir(dir string, log io.Writer) error {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) || err == nil && onlyE2EDirs(entries) {
		return os.MkdirAll(dir, 0o755)
	}
	if err != nil {
		return err
	}
	if _, err := os.Stat(filepath.Join(dir, stateFile)); err != nil {
		return fmt.Errorf("%s is not empty and holds no devcluster state (%s): choose another --dir", dir, stateFile)
	}
	procs, err := processes(dir)
	if err != nil {
		return err
	}
	for _, name := range procs {
		pid, running, err := harness.ReadPidFile(filepath.Join(dir, name+".pid"))
		if err != nil {
			return err
		}
		if running {
			return fmt.Errorf("a cluster is already running in %s (%s, pid %d): use it, or stop it first with `devcluster down --dir %s`",
				dir, name, pid, relativeToWD(dir))
		}
	}
	fmt.Fprintf(log, "removing the state of a stopped cluster in %s\n", dir)
	if err := downReal(context.Background(), log, dir); err != nil {
		return err
	}
	if err := removeNodeLeftovers(dir, log); err != nil {
		return err
	}
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	return os.MkdirAll(dir, 0o755)
}

func newDownCmd() *cobra.Command {
	var dir string
	cmd := &cobra.Command{
		Use:   "down",
		Short: "Stop what up started and remove DIR (does nothing if there is no cluster)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return down(cmd.OutOrStdout(), dir)
		},
	}
	addDirFlag(cmd, &dir)
	return cmd
}

func down(stdout io.Writer, dir string) error {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
		fmt.Fprintf(stdout, "no cluster in %s\n", relativeToWD(dir))
		return nil
	}
	if _, err := os.Stat(filepath.Join(dir, stateFile)); err != nil {
		return fmt.Errorf("%s holds no devcluster state (%s); not touching it", dir, stateFile)
	}
	// The real node first: its pods are released through the agent while
	// the API server still runs. If it cannot be cleaned, dir stays (its
	// state says what is left).
	if err := downReal(context.Background(), stdout, dir); err != nil {
		return fmt.Errorf("stop cluster in %s: %w", dir, err)
	}
	procs, err := processes(dir)
	if err != nil {
		return err
	}
	var errs []error
	for _, name := range stopOrder(procs) {
		pidFile := filepath.Join(dir, name+".pid")
		pid, running, err := harness.ReadPidFile(pidFile)
		if err == nil && running {
			fmt.Fprintf(stdout, "stopping %s (pid %d)\n", name, pid)
		}
		errs = append(errs, err, harness.StopPidFile(pidFile, processStopTimeout(name)))
	}
	// The agent's own bpffs (devcluster up --bpf): unmounting it detaches
	// the programs it pinned.
	errs = append(errs, removeNodeLeftovers(dir, stdout), restoreHostNetwork(dir, stdout),
		devnode.AgentConfig{Dir: dir}.UnmountBPF())
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("stop cluster in %s: %w", dir, err)
	}
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "removed %s\n", relativeToWD(dir))
	return nil
}

func newStatusCmd() *cobra.Command {
	var dir string
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show the cluster's processes and whether kube-apiserver is ready (exit status 1 if not)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return status(cmd.Context(), cmd.OutOrStdout(), dir)
		},
	}
	addDirFlag(cmd, &dir)
	return cmd
}

func status(ctx context.Context, stdout io.Writer, dir string) error {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	st, err := readState(dir)
	if errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("no cluster in %s (start one with `devcluster up --dir %s`)", relativeToWD(dir), relativeToWD(dir))
	}
	if err != nil {
		return err
	}
	procs, err := processes(dir)
	if err != nil {
		return err
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "PROCESS\tPID\tSTATE\tLOG")
	down := 0
	// A real node's processes live in DIR/node.
	paths := make([]string, 0, len(procs))
	for _, name := range procs {
		paths = append(paths, filepath.Join(dir, name))
	}
	if st.Node == nodeReal {
		nodePids, _ := filepath.Glob(filepath.Join(dir, "node", "*.pid"))
		for _, f := range nodePids {
			paths = append(paths, strings.TrimSuffix(f, ".pid"))
		}
	}
	for _, path := range paths {
		name := filepath.Base(path)
		pid, running, err := harness.ReadPidFile(path + ".pid")
		state := "running"
		switch {
		case err != nil:
			state = err.Error()
		case !running:
			state = "not running"
		}
		if err != nil || !running {
			down++
		}
		pidText := "-"
		if pid > 0 {
			pidText = fmt.Sprint(pid)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", name, pidText, state, relativeToWD(path+".log"))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if st.Kubeconfig == "" {
		return errors.New("the cluster never became ready")
	}
	fmt.Fprintf(stdout, "\nkubeconfig: %s\n", relativeToWD(st.Kubeconfig))
	if err := readyz(ctx, st.Kubeconfig); err != nil {
		fmt.Fprintf(stdout, "kube-apiserver %s: not ready: %v\n", st.APIServer, err)
		return errors.New("not ready")
	}
	fmt.Fprintf(stdout, "kube-apiserver %s: ready\n", st.APIServer)
	if down > 0 {
		return fmt.Errorf("%d process(es) not running", down)
	}
	return nil
}

func readyz(ctx context.Context, kubeconfig string) error {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return err
	}
	cfg.Timeout = 5 * time.Second
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	body, err := cs.CoreV1().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
	if err != nil {
		return err
	}
	if strings.TrimSpace(string(body)) != "ok" {
		return errors.New(string(body))
	}
	return nil
}

func newBuildCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "build",
		Short: "Build the etcd, Kubernetes and helm binaries into the cache if missing (the first time takes 10-15 minutes)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			bins, err := harness.EnsureBinaries(cmd.Context(), logger(cmd.ErrOrStderr()))
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			fmt.Fprintln(out, bins.Etcd)
			fmt.Fprintln(out, bins.KubeAPIServer)
			fmt.Fprintln(out, bins.KubeControllerManager)
			// helm renders and lints the chart (make manifests, the
			// install tests).
			helm, err := harness.EnsureHelm(cmd.Context(), logger(cmd.ErrOrStderr()))
			if err != nil {
				return err
			}
			fmt.Fprintln(out, helm)
			return nil
		},
	}
}

func newBuildNodeCmd() *cobra.Command {
	var only string
	cmd := &cobra.Command{
		Use: "build-node",
		Short: "Build the real node's binaries into the cache if missing: kubelet, kube-scheduler, kube-proxy " +
			"(~10 minutes the first time), containerd, ctr, containerd-shim-runc-v2 and the CNI loopback plugin (~5 minutes), CoreDNS",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var groups []string
			if only != "" {
				groups = []string{only}
			}
			bins, err := harness.EnsureNodeBinaries(cmd.Context(), logger(cmd.ErrOrStderr()), groups...)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if only == "" || only == harness.NodeGroupKubernetes {
				fmt.Fprintln(out, bins.Kubelet)
				fmt.Fprintln(out, bins.KubeScheduler)
				fmt.Fprintln(out, bins.KubeProxy)
			}
			if only == "" || only == harness.NodeGroupContainerd {
				fmt.Fprintln(out, bins.Containerd)
				fmt.Fprintln(out, bins.Ctr)
				fmt.Fprintln(out, bins.ContainerdShim)
				fmt.Fprintln(out, bins.Loopback)
			}
			if only == "" || only == harness.NodeGroupCoreDNS {
				fmt.Fprintln(out, bins.CoreDNS)
			}
			if bins.Runc == "" {
				fmt.Fprintln(cmd.ErrOrStderr(), "runc is not installed: run make deps (Debian: apt-get install runc)")
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&only, "only", "", "build one group only: "+strings.Join(harness.NodeGroups, ", "))
	return cmd
}

func newBuildHubbleCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "build-hubble",
		Short: "Build the upstream hubble CLI and hubble-relay (tools/hubble) into the cache if missing (~10 minutes the first time)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			bins, err := harness.EnsureHubble(cmd.Context(), logger(cmd.ErrOrStderr()))
			if err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), bins.Hubble)
			fmt.Fprintln(cmd.OutOrStdout(), bins.Relay)
			return nil
		},
	}
}

func newBuildKubectlCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "build-kubectl",
		Short: "Build kubectl (the cluster's version, from tools/k8s) into the cache if missing and print its path",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			p, err := harness.EnsureKubectl(cmd.Context(), logger(cmd.ErrOrStderr()))
			if err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), p)
			return nil
		},
	}
}

// processes returns the names of the processes of the cluster in dir, in
// start order: those recorded in the state file, then any other pid files
// (left by an up that failed half-way).
func processes(dir string) ([]string, error) {
	st, err := readState(dir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	names := st.Processes
	pidFiles, err := filepath.Glob(filepath.Join(dir, "*.pid"))
	if err != nil {
		return nil, err
	}
	for _, f := range pidFiles {
		if name := strings.TrimSuffix(filepath.Base(f), ".pid"); !slices.Contains(names, name) {
			names = append(names, name)
		}
	}
	return names, nil
}

func readState(dir string) (state, error) {
	var st state
	data, err := os.ReadFile(filepath.Join(dir, stateFile))
	if err != nil {
		return st, err
	}
	if err := json.Unmarshal(data, &st); err != nil {
		return st, fmt.Errorf("read %s: %w", filepath.Join(dir, stateFile), err)
	}
	return st, nil
}

func writeState(dir string, st state) error {
	data, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, stateFile), append(data, '\n'), 0o644)
}

// relativeToWD shortens path for messages when it is below the working
// directory.
func relativeToWD(path string) string {
	wd, err := os.Getwd()
	if err != nil {
		return path
	}
	rel, err := filepath.Rel(wd, path)
	if err != nil || strings.HasPrefix(rel, "..") {
		return path
	}
	return rel
}
