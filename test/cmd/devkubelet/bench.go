package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	"github.com/cellium/cellium/api/client/clientset/versioned"
	"github.com/cellium/cellium/api/client/informers/externalversions"
	"github.com/cellium/cellium/test/devkubelet"
	"github.com/cellium/cellium/test/devkubelet/devnode"
	"github.com/cellium/cellium/test/harness"
)

// benchOptions are the flags of bench.
type benchOptions struct {
	pods      int
	parallel  int
	workers   int
	binDir    string
	agentArgs []string
	timeout   time.Duration
	keep      bool
	verbose   bool
	// sequential is how many pods the sequential phases run, one at a
	// time; 0 skips them, negative means pods.
	sequential int
	// reference runs the reference plugins (ptp + host-local) too.
	reference bool
}

func newBenchCmd() *cobra.Command {
	var o benchOptions
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Create and delete N pods through the real CNI path and report latencies, pods/s, CPU, agent RSS and API writes per pod, beside the reference ptp + host-local plugins",
		Long: "bench starts a private cluster (etcd, kube-apiserver with an audit log of writes), cellium-operator,\n" +
			"cellium-agent and a devkubelet in a temporary directory, creates N pods on the node, waits until\n" +
			"they run and their CiliumEndpoints are ready, deletes them, waits until everything is gone, and\n" +
			"prints what it measured. Then it runs --sequential pods one at a time, and the same two runs through\n" +
			"the reference plugins ptp + host-local on a second devkubelet node (its plugins run in a network\n" +
			"namespace of its own, on " + refSubnet + "), and prints cellium and the reference side by side.\n" +
			"Needs root. `make bench-endpoints N=100` runs it.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := needRoot("devkubelet bench"); err != nil {
				return err
			}
			if o.pods < 1 {
				return errors.New("-n must be at least 1")
			}
			if o.parallel <= 0 {
				o.parallel = o.pods
			}
			if o.sequential < 0 {
				o.sequential = o.pods
			}
			return runBench(cmd.Context(), cmd.OutOrStdout(), cmd.ErrOrStderr(), o)
		},
	}
	fs := cmd.Flags()
	fs.IntVarP(&o.pods, "pods", "n", 100, "number of pods")
	fs.IntVar(&o.parallel, "parallel", 50, "pods created (and deleted) at once by the bench; 0: all")
	fs.IntVar(&o.workers, "workers", devkubelet.DefaultWorkers, "devkubelet workers (pods set up at once)")
	fs.StringVar(&o.binDir, "bin-dir", "", "directory with cellium-agent, cellium-operator and cellium-cni (make build); empty: go build them")
	fs.StringSliceVar(&o.agentArgs, "agent-arg", nil, "extra cellium-agent flag (repeatable), e.g. --agent-arg=--k8s-client-qps=50")
	fs.DurationVar(&o.timeout, "timeout", 10*time.Minute, "give up after this long")
	fs.BoolVar(&o.keep, "keep", false, "keep the work directory (logs, audit log) afterwards")
	fs.BoolVar(&o.verbose, "v", false, "log progress of the cluster and the kubelet")
	fs.IntVar(&o.sequential, "sequential", -1, "pods of the sequential runs (one pod at a time, cellium and reference); 0 skips them; default -n")
	fs.BoolVar(&o.reference, "reference", true, "also run the reference plugins ptp + host-local (tools/cniplugins) through a devkubelet of their own node and print both side by side")
	return cmd
}

// auditPolicy logs every write (metadata only) and nothing else.
const auditPolicy = `apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
- level: Metadata
  verbs: ["create", "update", "patch", "delete", "deletecollection"]
- level: None
`

// benchNamespace holds the bench's pods.
const benchNamespace = "bench"

// benchLabels is how many distinct app labels (hence identities) the
// pods get.
const benchLabels = 4

// agentUserAgent is the user agent cellium-agent's requests carry.
const agentUserAgent = "cellium-agent"

func runBench(ctx context.Context, stdout, stderr io.Writer, o benchOptions) (err error) {
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	logw := io.Discard
	if o.verbose {
		logw = stderr
	}
	log := slog.New(slog.NewTextHandler(logw, nil))
	progress := func(format string, args ...any) { fmt.Fprintf(stderr, "bench: "+format+"\n", args...) }

	work, err := os.MkdirTemp("", "cellium-bench-")
	if err != nil {
		return err
	}
	defer func() {
		if o.keep || err != nil {
			progress("work directory kept: %s", work)
			return
		}
		_ = os.RemoveAll(work)
	}()

	bins, err := benchBinaries(ctx, o.binDir, work, progress)
	if err != nil {
		return err
	}
	policy := filepath.Join(work, "audit-policy.yaml")
	if err := os.WriteFile(policy, []byte(auditPolicy), 0o644); err != nil {
		return err
	}
	auditLog := filepath.Join(work, "audit.log")
	progress("starting etcd and kube-apiserver")
	c, err := harness.Start(ctx, harness.Options{
		Dir:    filepath.Join(work, "cluster"),
		Logger: log,
		APIServerArgs: []string{
			"--audit-policy-file=" + policy,
			"--audit-log-path=" + auditLog,
			"--audit-log-format=json",
			"--audit-log-maxsize=0",
		},
	})
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, c.Stop()) }()

	mask := min(24, 32-int(math.Ceil(math.Log2(float64(o.pods+16)))))
	progress("starting cellium-operator")
	// The daemons run with their ServiceAccounts' tokens, as installed.
	opKubeconfig, err := c.OperatorKubeconfig(ctx)
	if err != nil {
		return err
	}
	agentKubeconfig, err := c.AgentKubeconfig(ctx)
	if err != nil {
		return err
	}
	op, err := devnode.StartOperator(ctx, devnode.OperatorConfig{
		Binary:                  bins.Operator,
		Kubeconfig:              opKubeconfig,
		Dir:                     work,
		ClusterPoolIPv4CIDR:     "10.200.0.0/16",
		ClusterPoolIPv4MaskSize: mask,
	})
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, op.Stop(15*time.Second)) }()

	node, err := devnode.NewNode(agentKubeconfig, c.Clientset(), bins, devnode.NodeOptions{
		Name:      "bench-node",
		Dir:       filepath.Join(work, "node"),
		AgentArgs: o.agentArgs,
		Workers:   o.workers,
		Logger:    log,
	})
	if err != nil {
		return err
	}
	defer func() {
		cctx, ccancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer ccancel()
		err = errors.Join(err, node.Cleanup(cctx))
	}()
	progress("starting cellium-agent and the devkubelet")
	if err := node.StartKubelet(); err != nil { // registers the Node the agent waits for
		return err
	}
	if err := node.StartAgent(ctx); err != nil {
		return err
	}
	cs := c.Clientset()
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: benchNamespace}}, metav1.CreateOptions{}); err != nil {
		return err
	}
	if err := c.EnsureServiceAccount(ctx, benchNamespace); err != nil {
		return err
	}
	cilium, err := versioned.NewForConfig(c.RESTConfig())
	if err != nil {
		return err
	}
	ceps := watchCEPs(cilium)
	stopWatch := ceps.start()
	defer stopWatch()

	// A fast client of our own: the bench must not be what limits.
	rc := c.RESTConfig()
	rc.QPS, rc.Burst, rc.UserAgent = 1000, 2000, "cellium-bench"
	bcs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return err
	}
	loadBefore := loadAvg()
	agentPid := node.Agent().Pid()
	rssBefore, _ := procStatusKB(agentPid, "VmRSS")

	names := make([]string, o.pods)
	for i := range names {
		names[i] = fmt.Sprintf("bench-%04d", i)
	}
	created := newTimes()
	progress("creating %d pods (%d at once)", o.pods, o.parallel)
	cpu := cpuMeter{pids: map[string]int{devnode.Agent: agentPid, devnode.Operator: op.Pid()}}
	for _, pr := range c.Processes() {
		cpu.pids[pr.Name()] = pr.Pid()
	}
	cpuBefore := cpu.sample()
	createStart := time.Now()
	if err := parallel(ctx, names, o.parallel, func(ctx context.Context, i int, name string) error {
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: benchNamespace,
				Labels: map[string]string{"app": "bench-" + strconv.Itoa(i%benchLabels)}},
			Spec: corev1.PodSpec{
				NodeName:   node.Name,
				Containers: []corev1.Container{{Name: "app", Image: "registry.k8s.io/pause:3.10"}},
			},
		}
		created.set(name, time.Now())
		_, err := bcs.CoreV1().Pods(benchNamespace).Create(ctx, pod, metav1.CreateOptions{})
		return err
	}); err != nil {
		return fmt.Errorf("create pods: %w", err)
	}
	k := node.Kubelet()
	if err := waitUntil(ctx, func() error {
		running := 0
		for _, t := range k.Timings() {
			if t.Namespace == benchNamespace && !t.Running.IsZero() {
				running++
			}
		}
		if running < o.pods {
			return fmt.Errorf("%d of %d pods running", running, o.pods)
		}
		if n := ceps.readyCount(); n < o.pods {
			return fmt.Errorf("%d of %d CiliumEndpoints ready", n, o.pods)
		}
		return nil
	}); err != nil {
		return fmt.Errorf("pods did not come up: %w", err)
	}
	allReady := time.Now()
	rssAfter, _ := procStatusKB(agentPid, "VmRSS")
	timings := k.Timings()
	var lastRunning time.Time
	for _, t := range timings {
		if t.Running.After(lastRunning) {
			lastRunning = t.Running
		}
	}

	progress("deleting %d pods", o.pods)
	deleteStart := time.Now()
	if err := parallel(ctx, names, o.parallel, func(ctx context.Context, _ int, name string) error {
		return bcs.CoreV1().Pods(benchNamespace).Delete(ctx, name, metav1.DeleteOptions{})
	}); err != nil {
		return fmt.Errorf("delete pods: %w", err)
	}
	if err := waitUntil(ctx, func() error {
		if n := len(k.Sandboxes()); n > 0 {
			return fmt.Errorf("%d sandboxes left", n)
		}
		if n := ceps.count(); n > 0 {
			return fmt.Errorf("%d CiliumEndpoints left", n)
		}
		pods, err := bcs.CoreV1().Pods(benchNamespace).List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		if len(pods.Items) > 0 {
			return fmt.Errorf("%d pods left", len(pods.Items))
		}
		return nil
	}); err != nil {
		return fmt.Errorf("pods were not deleted: %w", err)
	}
	allGone := time.Now()
	cpuUsed := cpu.sample().minus(cpuBefore)
	rssPeak, _ := procStatusKB(agentPid, "VmHWM")
	timings = k.Timings()
	var lastGone time.Time
	for _, t := range timings {
		if t.Gone.After(lastGone) {
			lastGone = t.Gone
		}
	}

	writes, err := countWrites(auditLog, agentUserAgent, createStart, allGone)
	if err != nil {
		return err
	}

	r := report{
		pods: o.pods, node: node.Name, cpus: runtime.NumCPU(),
		createSpan: lastRunning.Sub(createStart), readySpan: allReady.Sub(createStart),
		deleteSpan: lastGone.Sub(deleteStart),
		rssBefore:  rssBefore, rssAfter: rssAfter, rssPeak: rssPeak,
		writes: writes,
		load:   [2]string{loadBefore, loadAvg()},
		cpu:    cpuUsed,
	}
	for _, t := range timings {
		if t.Namespace != benchNamespace {
			continue
		}
		r.add = append(r.add, t.Add)
		r.del = append(r.del, t.Del)
		r.addErrors += t.AddErrors
		if c, ok := created.get(t.Name); ok && !t.Running.IsZero() {
			r.running = append(r.running, t.Running.Sub(c))
		}
	}
	for name, at := range ceps.readyTimes() {
		if c, ok := created.get(name); ok {
			r.cepReady = append(r.cepReady, at.Sub(c))
		}
	}

	cmp := comparison{load: [2]string{loadBefore, ""}}
	cmp.results = append(cmp.results, phaseResult{party: partyCellium, mode: modeAtOnce, pods: o.pods, parallel: o.parallel,
		add: r.add, del: r.del, addErrors: r.addErrors, createSpan: r.createSpan, deleteSpan: r.deleteSpan, cpu: cpuUsed})
	if o.sequential > 0 {
		res, err := runPhase(ctx, phaseSpec{party: partyCellium, mode: modeSequential, prefix: "seq", pods: o.sequential,
			parallel: 1, node: node.Name, kubelet: k, cs: bcs, cpu: cpu,
			gone: func() error {
				if n := ceps.count(); n > 0 {
					return fmt.Errorf("%d CiliumEndpoints left", n)
				}
				return nil
			}}, progress)
		if err != nil {
			return err
		}
		cmp.results = append(cmp.results, res)
	}
	if o.reference {
		progress("starting the reference node (ptp + host-local)")
		ref, version, rerr := startRefNode(ctx, work, bcs, o.workers, log)
		if rerr != nil {
			return rerr
		}
		// err is runBench's result.
		defer func() { err = errors.Join(err, ref.cleanup(context.Background())) }()
		cmp.refVersion = version
		specs := []phaseSpec{{party: partyReference, mode: modeAtOnce, prefix: "ref", pods: o.pods, parallel: o.parallel}}
		if o.sequential > 0 {
			specs = append(specs, phaseSpec{party: partyReference, mode: modeSequential, prefix: "refseq", pods: o.sequential, parallel: 1})
		}
		for _, sp := range specs {
			sp.node, sp.kubelet, sp.cs, sp.cpu = refNodeName, ref.kubelet, bcs, cpu
			res, perr := runPhase(ctx, sp, progress)
			if perr != nil {
				return perr
			}
			cmp.results = append(cmp.results, res)
		}
	}
	cmp.load[1] = loadAvg()

	r.print(stdout)
	cmp.print(stdout)
	return nil
}

// benchBinaries finds the binaries in binDir or builds them into work.
func benchBinaries(ctx context.Context, binDir, work string, progress func(string, ...any)) (devnode.Binaries, error) {
	need := []string{devnode.Agent, devnode.Operator, devnode.CNIPlugin}
	if binDir != "" {
		return devnode.FindBinaries(binDir, need...)
	}
	progress("building %s", strings.Join(need, ", "))
	return devnode.BuildBinaries(ctx, filepath.Join(work, "bin"), need...)
}

// parallel runs fn for each item, at most n at once, and returns the
// first error.
func parallel(ctx context.Context, items []string, n int, fn func(context.Context, int, string) error) error {
	sem := make(chan struct{}, n)
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	for i, it := range items {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			wg.Wait()
			return ctx.Err()
		}
		wg.Go(func() {
			defer func() { <-sem }()
			if err := fn(ctx, i, it); err != nil {
				mu.Lock()
				errs = append(errs, fmt.Errorf("%s: %w", it, err))
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if len(errs) > 0 {
		return errs[0]
	}
	return nil
}

// waitUntil polls check every 20ms until it succeeds or ctx ends.
func waitUntil(ctx context.Context, check func() error) error {
	for {
		err := check()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w: %v", ctx.Err(), err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// times is a concurrent map of pod name to time.
type times struct {
	mu sync.Mutex
	m  map[string]time.Time
}

func newTimes() *times { return &times{m: map[string]time.Time{}} }

func (t *times) set(name string, at time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.m[name] = at
}

// setFirst keeps the first time only.
func (t *times) setFirst(name string, at time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, ok := t.m[name]; !ok {
		t.m[name] = at
	}
}

func (t *times) get(name string) (time.Time, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	at, ok := t.m[name]
	return at, ok
}

// cepWatch records when each CiliumEndpoint of the bench namespace was
// first seen ready, and how many exist.
type cepWatch struct {
	factory externalversions.SharedInformerFactory
	ready   *times

	mu      sync.Mutex
	present map[string]bool
}

func watchCEPs(cilium versioned.Interface) *cepWatch {
	return &cepWatch{
		factory: externalversions.NewSharedInformerFactoryWithOptions(cilium, 0, externalversions.WithNamespace(benchNamespace)),
		ready:   newTimes(),
		present: map[string]bool{},
	}
}

func (w *cepWatch) observe(obj any) {
	cep, ok := obj.(*ciliumv2.CiliumEndpoint)
	if !ok {
		return
	}
	now := time.Now()
	w.mu.Lock()
	w.present[cep.Name] = true
	w.mu.Unlock()
	if cep.Status.State == ciliumv2.EndpointStateReady {
		w.ready.setFirst(cep.Name, now)
	}
}

func (w *cepWatch) start() (stop func()) {
	inf := w.factory.Cilium().V2().CiliumEndpoints().Informer()
	_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    w.observe,
		UpdateFunc: func(_, obj any) { w.observe(obj) },
		DeleteFunc: func(obj any) {
			if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = d.Obj
			}
			if cep, ok := obj.(*ciliumv2.CiliumEndpoint); ok {
				w.mu.Lock()
				delete(w.present, cep.Name)
				w.mu.Unlock()
			}
		},
	})
	done := make(chan struct{})
	w.factory.Start(done)
	w.factory.WaitForCacheSync(done)
	return func() {
		close(done)
		w.factory.Shutdown()
	}
}

func (w *cepWatch) readyCount() int {
	w.ready.mu.Lock()
	defer w.ready.mu.Unlock()
	return len(w.ready.m)
}

func (w *cepWatch) readyTimes() map[string]time.Time {
	w.ready.mu.Lock()
	defer w.ready.mu.Unlock()
	out := make(map[string]time.Time, len(w.ready.m))
	for k, v := range w.ready.m {
		out[k] = v
	}
	return out
}

func (w *cepWatch) count() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.present)
}

// procStatusKB reads a "kB" field of /proc/PID/status (VmRSS, VmHWM).
func procStatusKB(pid int, field string) (int64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		k, v, ok := strings.Cut(s.Text(), ":")
		if !ok || k != field {
			continue
		}
		return strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
	}
	return 0, fmt.Errorf("no %s in /proc/%d/status", field, pid)
}

// loadAvg returns the 1-minute load average, or "?".
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if f := strings.Fields(string(b)); err == nil && len(f) > 0 {
		return f[0]
	}
	return "?"
}

// cpuTimes is CPU time (user and system) by party.
type cpuTimes map[string]time.Duration

func (c cpuTimes) minus(before cpuTimes) cpuTimes {
	out := cpuTimes{}
	for k, v := range c {
		out[k] = v - before[k]
	}
	return out
}

// cpuMeter samples the CPU time of the cluster's processes, of this
// process (the devkubelet and the bench's clients) and of its reaped
// children (the CNI plugin runs).
type cpuMeter struct{ pids map[string]int }

// clockTick is USER_HZ, the unit of /proc/PID/stat times on Linux.
const clockTick = 10 * time.Millisecond

func (m cpuMeter) sample() cpuTimes {
	out := cpuTimes{}
	for name, pid := range m.pids {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		// pid (comm) state ppid ... utime(14) stime(15): fields after ')'.
		s := string(b)
		f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		if len(f) < 13 {
			continue
		}
		ut, _ := strconv.ParseInt(f[11], 10, 64)
		st, _ := strconv.ParseInt(f[12], 10, 64)
		out[name] = time.Duration(ut+st) * clockTick
	}
	var self, children syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &self) == nil {
		out["devkubelet+bench"] = rusageTime(self)
	}
	if syscall.Getrusage(syscall.RUSAGE_CHILDREN, &children) == nil {
		out[devnode.CNIPlugin] = rusageTime(children)
	}
	return out
}

func rusageTime(r syscall.Rusage) time.Duration {
	return time.Duration(r.Utime.Nano() + r.Stime.Nano())
}

// auditEvent is the part of an audit log line the bench reads.
type auditEvent struct {
	Stage     string `json:"stage"`
	Verb      string `json:"verb"`
	UserAgent string `json:"userAgent"`
	ObjectRef *struct {
		Resource    string `json:"resource"`
		Subresource string `json:"subresource"`
	} `json:"objectRef"`
	ResponseStatus *struct {
		Code int `json:"code"`
	} `json:"responseStatus"`
	RequestReceivedTimestamp time.Time `json:"requestReceivedTimestamp"`
}

// writeCounts are API writes grouped by "verb resource[/subresource]".
type writeCounts struct {
	total, failed int
	by            map[string]int
}

// countWrites counts the write requests in an audit log whose user agent
// starts with userAgent and that were received in [from, to].
func countWrites(path, userAgent string, from, to time.Time) (writeCounts, error) {
	wc := writeCounts{by: map[string]int{}}
	f, err := os.Open(path)
	if err != nil {
		return wc, fmt.Errorf("audit log: %w", err)
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	s.Buffer(make([]byte, 0, 1<<20), 16<<20)
	for s.Scan() {
		var ev auditEvent
		if err := json.Unmarshal(s.Bytes(), &ev); err != nil {
			continue
		}
		if ev.Stage != "ResponseComplete" || !strings.HasPrefix(ev.UserAgent, userAgent) {
			continue
		}
		if ev.RequestReceivedTimestamp.Before(from) || ev.RequestReceivedTimestamp.After(to) {
			continue
		}
		switch ev.Verb {
		case "create", "update", "patch", "delete", "deletecollection":
		default:
			continue
		}
		what := ev.Verb
		if ev.ObjectRef != nil {
			what += " " + ev.ObjectRef.Resource
			if ev.ObjectRef.Subresource != "" {
				what += "/" + ev.ObjectRef.Subresource
			}
		}
		wc.total++
		wc.by[what]++
		if ev.ResponseStatus != nil && ev.ResponseStatus.Code >= 300 {
			wc.failed++
		}
	}
	return wc, s.Err()
}

// report is what bench prints.
type report struct {
	pods      int
	node      string
	cpus      int
	add, del  []time.Duration
	running   []time.Duration
	cepReady  []time.Duration
	addErrors int

	createSpan, readySpan, deleteSpan time.Duration
	rssBefore, rssAfter, rssPeak      int64
	writes                            writeCounts
	// load is the 1-minute load average before and after (the machine
	// may be shared).
	load [2]string
	// cpu is the CPU time each party used from the first create to the
	// last deletion.
	cpu cpuTimes
}

// Aims of issue 3 on a 2-core machine.
const (
	aimAddP99    = 100 * time.Millisecond
	aimPodsPerS  = 50.0
	mib          = 1024.0
	percentileNA = "-"
)

func (r report) print(w io.Writer) {
	fmt.Fprintf(w, "bench-endpoints: %d pods on node %s, %d CPUs, load average %s before, %s after\n\n",
		r.pods, r.node, r.cpus, r.load[0], r.load[1])
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "\tp50\tp95\tp99\tmax\t")
	row := func(name string, ds []time.Duration, what string) {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t  %s\n", name, ms(devkubelet.Percentile(ds, 50)), ms(devkubelet.Percentile(ds, 95)),
			ms(devkubelet.Percentile(ds, 99)), ms(devkubelet.Percentile(ds, 100)), what)
	}
	row("CNI ADD", r.add, "kubelet: plugin exec, IP, veth, endpoint ready")
	row("CNI DEL", r.del, "kubelet: plugin exec, endpoint and veth removed")
	row("pod Running", r.running, "pod created -> status Running written")
	row("CEP ready", r.cepReady, "pod created -> CiliumEndpoint state ready")
	_ = tw.Flush()
	fmt.Fprintln(w)
	fmt.Fprintf(w, "create: %d pods Running in %s = %.1f pods/s (all CEPs ready after %s)\n",
		r.pods, r.createSpan.Round(time.Millisecond), rate(r.pods, r.createSpan), r.readySpan.Round(time.Millisecond))
	fmt.Fprintf(w, "delete: %d sandboxes gone in %s = %.1f pods/s\n", r.pods, r.deleteSpan.Round(time.Millisecond), rate(r.pods, r.deleteSpan))
	if r.addErrors > 0 {
		fmt.Fprintf(w, "failed CNI ADDs (retried): %d\n", r.addErrors)
	}
	fmt.Fprintf(w, "agent RSS: %.1f MiB idle, %.1f MiB with %d pods, peak %.1f MiB\n",
		float64(r.rssBefore)/mib, float64(r.rssAfter)/mib, r.pods, float64(r.rssPeak)/mib)
	if len(r.cpu) > 0 {
		var parts []string
		var total time.Duration
		for _, d := range r.cpu {
			total += d
		}
		names := slices.Sorted(maps.Keys(r.cpu))
		slices.SortStableFunc(names, func(a, b string) int { return int(r.cpu[b] - r.cpu[a]) })
		for _, name := range names {
			parts = append(parts, fmt.Sprintf("%s %s", name, ms(r.cpu[name]/time.Duration(r.pods))))
		}
		fmt.Fprintf(w, "CPU per pod (create and delete): %s total: %s\n", ms(total/time.Duration(r.pods)), strings.Join(parts, ", "))
	}
	fmt.Fprintf(w, "API writes by %s: %d = %.2f per pod (%d failed)\n", agentUserAgent, r.writes.total,
		float64(r.writes.total)/float64(r.pods), r.writes.failed)
	keys := make([]string, 0, len(r.writes.by))
	for k := range r.writes.by {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b string) int { return r.writes.by[b] - r.writes.by[a] })
	for _, k := range keys {
		fmt.Fprintf(w, "  %-40s %5d  %.2f/pod\n", k, r.writes.by[k], float64(r.writes.by[k])/float64(r.pods))
	}
	fmt.Fprintln(w)
	verdict := func(ok bool) string {
		if ok {
			return "met"
		}
		return "MISSED"
	}
	p99 := devkubelet.Percentile(r.add, 99)
	fmt.Fprintf(w, "aim p99 ADD < %s: %s (%s); aim >= %.0f pods/s: %s (%.1f)\n",
		aimAddP99, verdict(p99 < aimAddP99), ms(p99), aimPodsPerS, verdict(rate(r.pods, r.createSpan) >= aimPodsPerS), rate(r.pods, r.createSpan))
}

func ms(d time.Duration) string {
	if d == 0 {
		return percentileNA
	}
	return fmt.Sprintf("%.1fms", float64(d)/float64(time.Millisecond))
}

func rate(n int, d time.Duration) float64 {
	if d <= 0 {
		return 0
	}
	return float64(n) / d.Seconds()
}
