package e2enetpol

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"
)

// DefaultSpecTimeout bounds one spec: a Netpol spec creates up to three
// namespaces of agnhost pods and probes every pair (each probe an exec of
// `/agnhost connect` through the API server), a few times over. On the
// real node a spec that passes takes 5-50 s; one whose probes cannot
// connect at all retries for ~13 minutes before it fails. Most
// conformance specs take seconds; the DNS ones wait up to 10 minutes
// for their probers' results, session affinity retries for 2.
const DefaultSpecTimeout = 5 * time.Minute

// interruptGrace is how long e2e.test gets, after the runner's SIGINT at a
// spec's timeout, to clean up (delete the spec's namespaces) and write its
// report before SIGKILL.
const interruptGrace = 2 * time.Minute

// Config is a run of the suite.
type Config struct {
	// E2ETest is the suite's binary (harness.EnsureE2EBinaries).
	E2ETest string
	// Kubeconfig reaches the cluster as an administrator.
	Kubeconfig string
	// Filter selects the specs.
	Filter Filter
	// SpecTimeout bounds each spec; 0 means DefaultSpecTimeout.
	SpecTimeout time.Duration
	// Dir receives the reports (one JSON report per spec, <n>.json) and
	// the suite's output (<n>.log); it is created if needed.
	Dir string
	// ExtraArgs are appended to e2e.test's arguments.
	ExtraArgs []string
	// Progress receives a line per spec as the run goes; nil discards it.
	Progress io.Writer
	// Placement, when set, names the nodes each spec's pods ran on
	// (Result.Nodes).
	Placement *Placement
}

// args are e2e.test's arguments that run the specs focus selects (a dry
// run if dryRun) and write their report to report.
func (c Config) args(focus, report string, dryRun bool, timeout time.Duration) []string {
	args := []string{
		"--provider=local",
		"--kubeconfig=" + c.Kubeconfig,
		"--ginkgo.focus=" + focus,
		"--ginkgo.json-report=" + report,
		"--ginkgo.no-color",
		// Ginkgo times the spec out itself (and cleans up) before the
		// runner kills it.
		"--ginkgo.timeout=" + timeout.String(),
		// The suite checks nothing about kube-system's pods; a node with
		// the agent as a host process has none.
		"--minStartupPods=0",
	}
	if dryRun {
		args = append(args, "--ginkgo.dry-run")
	} else {
		args = append(args, "--ginkgo.v", "--ginkgo.poll-progress-after=3m")
	}
	return append(args, c.ExtraArgs...)
}

// ListSpecs returns the plan of a run: the suite's specs (from a dry run
// of e2e.test, which needs no cluster) that c.Filter selects.
//
// Errors: the filter is invalid; e2e.test fails or writes no report.
func ListSpecs(ctx context.Context, c Config) (Plan, error) {
	f, err := c.Filter.compile()
	if err != nil {
		return Plan{}, err
	}
	if err := os.MkdirAll(c.Dir, 0o755); err != nil {
		return Plan{}, fmt.Errorf("list specs: %w", err)
	}
	report := filepath.Join(c.Dir, "dry-run.json")
	log := filepath.Join(c.Dir, "dry-run.log")
	if err := c.runSuite(ctx, c.args(c.Filter.suite().Focus, report, true, time.Hour), log, 5*time.Minute); err != nil {
		return Plan{}, fmt.Errorf("list specs: %w", err)
	}
	r, err := readReport(report)
	if err != nil {
		return Plan{}, fmt.Errorf("list specs: %w (see %s)", err, log)
	}
	return f.plan(r), nil
}

// Run runs the plan's specs one e2e.test process each, in order, so that a
// spec that hangs is timed out alone, and returns their outcomes with the
// plan's skipped specs. A spec whose process ends without a report (killed
// after its timeout, crashed) failed, its log file says why.
//
// Errors: only ctx ending (the outcomes so far are returned with it).
func Run(ctx context.Context, c Config, p Plan) (Summary, error) {
	if c.SpecTimeout <= 0 {
		c.SpecTimeout = DefaultSpecTimeout
	}
	progress := c.Progress
	if progress == nil {
		progress = io.Discard
	}
	began := time.Now()
	sum := Summary{Suite: c.Filter.suite().Title}
	for i, spec := range p.Run {
		if err := ctx.Err(); err != nil {
			sum.RunTime = time.Since(began)
			return sum, fmt.Errorf("run interrupted after %d of %d specs: %w", i, len(p.Run), context.Cause(ctx))
		}
		fmt.Fprintf(progress, "[%d/%d] %s\n", i+1, len(p.Run), spec.Name)
		start := time.Now()
		r := c.runSpec(ctx, i+1, spec)
		r.Nodes = c.Placement.Nodes(start, time.Now())
		fmt.Fprintf(progress, "        %s in %s%s\n", r.Outcome, r.RunTime.Round(time.Second), onNodes(r.Nodes))
		if r.Outcome == Failed {
			fmt.Fprintf(progress, "        %s\n", firstLine(r.Reason))
		}
		sum.Results = append(sum.Results, r)
	}
	sum.Results = append(sum.Results, p.Skipped...)
	sum.RunTime = time.Since(began)
	return sum, nil
}

// runSpec runs one spec and reads its outcome from its report.
func (c Config) runSpec(ctx context.Context, n int, spec Spec) Result {
	report := filepath.Join(c.Dir, strconv.Itoa(n)+".json")
	log := filepath.Join(c.Dir, strconv.Itoa(n)+".log")
	_ = os.Remove(report)
	start := time.Now()
	runErr := c.runSuite(ctx, c.args(spec.Focus, report, false, c.SpecTimeout), log, c.SpecTimeout+interruptGrace)
	took := time.Since(start)
	r, err := readReport(report)
	if err == nil {
		err = trimReport(report)
	}
	if err != nil {
		reason := fmt.Sprintf("no report from e2e.test: %v", err)
		if runErr != nil {
			reason = fmt.Sprintf("e2e.test: %v, no report", runErr)
		}
		return Result{Name: spec.Name, Outcome: Failed, Reason: reason + " (see " + log + ")", RunTime: took}
	}
	for _, s := range r.SpecReports {
		if s.LeafNodeType == "It" && s.name() == spec.Name {
			res := resultOf(s)
			if res.Outcome == Failed {
				res.Reason += " (log: " + log + ")"
			}
			return res
		}
	}
	// The spec did not run: the suite failed before it (its setup
	// checks the nodes and kube-system's pods).
	reason := "the suite did not run the spec"
	for _, s := range r.SpecReports {
		if s.LeafNodeType != "It" && s.State != statePassed && s.Failure.Message != "" {
			reason = fmt.Sprintf("%s %s: %s", s.LeafNodeType, s.State, s.Failure.Message)
			break
		}
	}
	for _, why := range r.SpecialSuiteFailureReasons {
		reason += "; " + why
	}
	return Result{Name: spec.Name, Outcome: Failed, Reason: reason + " (log: " + log + ")", RunTime: took}
}

// runSuite runs e2e.test with args, its output into log. After timeout it
// is interrupted (SIGINT: Ginkgo cleans up and reports) and, a grace
// period later, killed.
func (c Config) runSuite(ctx context.Context, args []string, log string, timeout time.Duration) error {
	out, err := os.Create(log)
	if err != nil {
		return fmt.Errorf("run e2e.test: %w", err)
	}
	defer out.Close()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, c.E2ETest, args...)
	cmd.Stdout, cmd.Stderr = out, out
	cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) }
	cmd.WaitDelay = interruptGrace
	// The runner's own process group gets a terminal's ^C; e2e.test gets
	// it from the runner, once.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	fmt.Fprintf(out, "# %s %q\n", c.E2ETest, args)
	if err := cmd.Run(); err != nil {
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return fmt.Errorf("e2e.test timed out after %s: %w", timeout, err)
		}
		return fmt.Errorf("e2e.test: %w", err)
	}
	return nil
}
