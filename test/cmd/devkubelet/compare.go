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
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/cellium/cellium/test/devkubelet"
	"github.com/cellium/cellium/test/devkubelet/devnode"
	"github.com/cellium/cellium/test/harness"
)

// The bench runs the same pods through cellium-cni and through the
// reference plugins of containernetworking/plugins (ptp with host-local
// IPAM), each through a devkubelet of its own node, at the same
// concurrency, and prints the two side by side.

// Modes of a phase.
const (
	modeAtOnce     = "at once"
	modeSequential = "sequential"
)

// Parties of a comparison.
const (
	partyCellium   = "cellium"
	partyReference = "reference"
)

// refNodeName is the node the reference plugins serve.
const refNodeName = "bench-ref"

// refSubnet is the reference plugins' pod range: its own, apart from
// cellium's cluster pool, so that the two never overlap.
const refSubnet = "10.201.0.0/16"

// Aims of issue 6, against the reference in the same run.
const (
	aimAddP99Ratio = 1.5
	aimCPURatio    = 1.0
)

// phaseSpec is one batch of pods through one plugin.
type phaseSpec struct {
	party, mode string
	prefix      string
	pods        int
	// parallel is how many pods are created (and deleted) at once; 1 is
	// sequential: each pod is Running (gone) before the next is created
	// (deleted).
	parallel int
	node     string
	kubelet  *devkubelet.Kubelet
	cs       kubernetes.Interface
	cpu      cpuMeter
	// gone, when set, is an extra condition for "everything deleted".
	gone func() error
}

// phaseResult is what a phase measured.
type phaseResult struct {
	party, mode string
	pods        int
	parallel    int
	add, del    []time.Duration
	addErrors   int
	// createSpan is first create to last Running; deleteSpan first delete
	// to last sandbox gone.
	createSpan, deleteSpan time.Duration
	// cpu is the CPU time each party used from the first create to the
	// last deletion; cpu[devnode.CNIPlugin] is the plugins' (the
	// devkubelet's reaped children).
	cpu cpuTimes
}

// label names the phase's mode: "50 at once" or "sequential".
func (r phaseResult) label() string {
	if r.mode == modeAtOnce {
		return fmt.Sprintf("%d at once", r.parallel)
	}
	return r.mode
}

// pluginCPUPerPod is the plugins' CPU time per pod (one ADD and one DEL).
func (r phaseResult) pluginCPUPerPod() time.Duration {
	return r.cpu[devnode.CNIPlugin] / time.Duration(max(r.pods, 1))
}

// agentCPUPerPod is cellium-agent's CPU time per pod; 0 for the
// reference, which has no agent.
func (r phaseResult) agentCPUPerPod() time.Duration {
	if r.party != partyCellium {
		return 0
	}
	return r.cpu[devnode.Agent] / time.Duration(max(r.pods, 1))
}

// runPhase creates p.pods pods on p.node, waits until they all run,
// deletes them and waits until everything is gone.
func runPhase(ctx context.Context, p phaseSpec, progress func(string, ...any)) (phaseResult, error) {
	names := make([]string, p.pods)
	want := make(map[string]bool, p.pods)
	for i := range names {
		names[i] = fmt.Sprintf("%s-%04d", p.prefix, i)
		want[names[i]] = true
	}
	timings := func() map[string]devkubelet.PodTiming {
		out := map[string]devkubelet.PodTiming{}
		for _, t := range p.kubelet.Timings() {
			if t.Namespace == benchNamespace && want[t.Name] {
				out[t.Name] = t
			}
		}
		return out
	}
	sequential := p.parallel == 1
	progress("%s: %d pods %s", p.party, p.pods, p.mode)

	cpuBefore := p.cpu.sample()
	createStart := time.Now()
	if err := parallel(ctx, names, p.parallel, func(ctx context.Context, i int, name string) error {
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: benchNamespace,
				Labels: map[string]string{"app": "bench-" + strconv.Itoa(i%benchLabels)}},
			Spec: corev1.PodSpec{
				NodeName:   p.node,
				Containers: []corev1.Container{{Name: "app", Image: "registry.k8s.io/pause:3.10"}},
			},
		}
		if _, err := p.cs.CoreV1().Pods(benchNamespace).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			return err
		}
		if !sequential {
			return nil
		}
		return pollUntil(ctx, 2*time.Millisecond, func() error {
			if t, ok := timings()[name]; !ok || t.Running.IsZero() {
				return errors.New("not running yet")
			}
			return nil
		})
	}); err != nil {
		return phaseResult{}, fmt.Errorf("%s: create pods: %w", p.party, err)
	}
	if err := pollUntil(ctx, 20*time.Millisecond, func() error {
		running := 0
		for _, t := range timings() {
			if !t.Running.IsZero() {
				running++
			}
		}
		if running < p.pods {
			return fmt.Errorf("%d of %d pods running", running, p.pods)
		}
		return nil
	}); err != nil {
		return phaseResult{}, fmt.Errorf("%s: pods did not come up: %w", p.party, err)
	}

	deleteStart := time.Now()
	if err := parallel(ctx, names, p.parallel, func(ctx context.Context, _ int, name string) error {
		if err := p.cs.CoreV1().Pods(benchNamespace).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			return err
		}
		if !sequential {
			return nil
		}
		return pollUntil(ctx, 2*time.Millisecond, func() error {
			if t := timings()[name]; t.Gone.IsZero() {
				return errors.New("sandbox not gone yet")
			}
			return nil
		})
	}); err != nil {
		return phaseResult{}, fmt.Errorf("%s: delete pods: %w", p.party, err)
	}
	if err := pollUntil(ctx, 20*time.Millisecond, func() error {
		for _, t := range timings() {
			if t.Gone.IsZero() {
				return fmt.Errorf("sandbox of %s left", t.Name)
			}
		}
		pods, err := p.cs.CoreV1().Pods(benchNamespace).List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		for _, pod := range pods.Items {
			if want[pod.Name] {
				return fmt.Errorf("pod %s left", pod.Name)
			}
		}
		if p.gone != nil {
			return p.gone()
		}
		return nil
	}); err != nil {
		return phaseResult{}, fmt.Errorf("%s: pods were not deleted: %w", p.party, err)
	}
	cpu := p.cpu.sample().minus(cpuBefore)

	r := phaseResult{party: p.party, mode: p.mode, pods: p.pods, parallel: p.parallel, cpu: cpu}
	var lastRunning, lastGone time.Time
	for _, t := range timings() {
		r.add = append(r.add, t.Add)
		r.del = append(r.del, t.Del)
		r.addErrors += t.AddErrors
		if t.Running.After(lastRunning) {
			lastRunning = t.Running
		}
		if t.Gone.After(lastGone) {
			lastGone = t.Gone
		}
	}
	r.createSpan = lastRunning.Sub(createStart)
	r.deleteSpan = lastGone.Sub(deleteStart)
	return r, nil
}

// pollUntil calls check every interval until it succeeds or ctx ends.
func pollUntil(ctx context.Context, interval time.Duration, check func() error) error {
	for {
		err := check()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w: %v", ctx.Err(), err)
		case <-time.After(interval):
		}
	}
}

// refNode is the reference plugins' node: its own network namespace (the
// plugins' host side: veths, routes, ip_forward go there, not into the
// machine's namespace), its conflist and a devkubelet.
type refNode struct {
	netns   string
	kubelet *devkubelet.Kubelet
	stop    func() error
	state   string
}

// refConfList is the reference network: ptp with host-local IPAM on
// refSubnet, no masquerading (no iptables rules).
func refConfList(ipamDir string) ([]byte, error) {
	return json.MarshalIndent(map[string]any{
		"cniVersion": "1.0.0",
		"name":       "bench-reference",
		"plugins": []map[string]any{{
			"type":   "ptp",
			"ipMasq": false,
			"mtu":    1500,
			"ipam": map[string]any{
				"type":    "host-local",
				"ranges":  [][]map[string]string{{{"subnet": refSubnet}}},
				"dataDir": ipamDir,
			},
		}},
	}, "", "  ")
}

// startRefNode builds (or finds) the reference plugins and starts the
// reference node's devkubelet. It returns the plugins' version.
func startRefNode(ctx context.Context, work string, cs kubernetes.Interface, workers int, log *slog.Logger) (*refNode, string, error) {
	binDir, version, err := harness.EnsureReferenceCNIPlugins(ctx, log)
	if err != nil {
		return nil, "", fmt.Errorf("reference CNI plugins: %w", err)
	}
	dir := filepath.Join(work, "ref")
	confDir := filepath.Join(dir, "net.d")
	for _, d := range []string{confDir, filepath.Join(dir, "kubelet")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, "", err
		}
	}
	list, err := refConfList(filepath.Join(dir, "ipam"))
	if err != nil {
		return nil, "", err
	}
	if err := os.WriteFile(filepath.Join(confDir, "10-reference.conflist"), list, 0o644); err != nil {
		return nil, "", err
	}
	netns, err := devkubelet.CreateNodeNetns("cellium-bench-ref-" + strconv.Itoa(os.Getpid()))
	if err != nil {
		return nil, "", err
	}
	n := &refNode{netns: netns, state: filepath.Join(dir, "kubelet")}
	k, err := devkubelet.New(devkubelet.Config{
		NodeName:    refNodeName,
		NodeIP:      devnode.NodeIP(refNodeName),
		CNIConfDir:  confDir,
		CNIBinDirs:  []string{binDir},
		StateDir:    n.state,
		Workers:     workers,
		Logger:      log,
		PluginNetns: netns,
	}, cs)
	if err != nil {
		return nil, "", errors.Join(err, devkubelet.RemoveNodeNetns(netns))
	}
	kctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- k.Run(kctx) }()
	n.kubelet = k
	n.stop = func() error {
		cancel()
		return <-done
	}
	return n, version, nil
}

// cleanup stops the kubelet, deletes what is left through CNI DEL (and
// the Node), and removes the namespace, with the links and routes in it.
func (n *refNode) cleanup(ctx context.Context) error {
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	errs := []error{n.stop()}
	errs = append(errs, n.kubelet.Cleanup(cctx))
	_, err := devkubelet.RemoveLeftovers(n.state)
	errs = append(errs, err, devkubelet.RemoveNodeNetns(n.netns))
	return errors.Join(errs...)
}

// comparison is what the bench prints side by side.
type comparison struct {
	refVersion string
	load       [2]string
	results    []phaseResult
}

func (c comparison) find(party, mode string) (phaseResult, bool) {
	for _, r := range c.results {
		if r.party == party && r.mode == mode {
			return r, true
		}
	}
	return phaseResult{}, false
}

func (c comparison) print(w io.Writer) {
	fmt.Fprintf(w, "\ncellium-cni vs the reference ptp + host-local %s, each through a devkubelet of its own node,\n", c.refVersion)
	fmt.Fprintf(w, "same pods, same workers; load average %s before, %s after\n\n", c.load[0], c.load[1])
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "\tcellium\treference\tratio\t")
	ratio := func(a, b float64) string {
		if a == 0 || b == 0 {
			return percentileNA
		}
		return fmt.Sprintf("%.2fx", a/b)
	}
	durRow := func(name string, a, b time.Duration) {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t\n", name, ms(a), ms(b), ratio(float64(a), float64(b)))
	}
	for _, mode := range []string{modeAtOnce, modeSequential} {
		cel, ok1 := c.find(partyCellium, mode)
		ref, ok2 := c.find(partyReference, mode)
		if !ok1 || !ok2 {
			continue
		}
		label := cel.label()
		for _, p := range []float64{50, 95, 99} {
			durRow(fmt.Sprintf("ADD p%.0f (%s)", p, label), devkubelet.Percentile(cel.add, p), devkubelet.Percentile(ref.add, p))
		}
		for _, p := range []float64{50, 99} {
			durRow(fmt.Sprintf("DEL p%.0f (%s)", p, label), devkubelet.Percentile(cel.del, p), devkubelet.Percentile(ref.del, p))
		}
		cr, rr := rate(cel.pods, cel.createSpan), rate(ref.pods, ref.createSpan)
		fmt.Fprintf(tw, "pods/s to Running (%s)\t%.1f\t%.1f\t%s\t\n", label, cr, rr, ratio(cr, rr))
		durRow(fmt.Sprintf("plugin CPU per ADD+DEL (%s)", label), cel.pluginCPUPerPod(), ref.pluginCPUPerPod())
		durRow(fmt.Sprintf("plugin+agent CPU per pod (%s)", label), cel.pluginCPUPerPod()+cel.agentCPUPerPod(), ref.pluginCPUPerPod())
		if cel.addErrors+ref.addErrors > 0 {
			fmt.Fprintf(tw, "failed ADDs, retried (%s)\t%d\t%d\t\t\n", label, cel.addErrors, ref.addErrors)
		}
	}
	_ = tw.Flush()

	verdict := func(ok bool) string {
		if ok {
			return "met"
		}
		return "MISSED"
	}
	var aims []string
	for _, mode := range []string{modeAtOnce, modeSequential} {
		cel, ok1 := c.find(partyCellium, mode)
		ref, ok2 := c.find(partyReference, mode)
		if !ok1 || !ok2 {
			continue
		}
		a, b := devkubelet.Percentile(cel.add, 99), devkubelet.Percentile(ref.add, 99)
		aims = append(aims, fmt.Sprintf("ADD p99 <= %.1fx reference (%s): %s (%s)", aimAddP99Ratio, cel.label(),
			verdict(float64(a) <= aimAddP99Ratio*float64(b)), ratio(float64(a), float64(b))))
		pa, pb := cel.pluginCPUPerPod(), ref.pluginCPUPerPod()
		aims = append(aims, fmt.Sprintf("plugin CPU per ADD+DEL <= reference (%s): %s (%s)", cel.label(),
			verdict(float64(pa) <= aimCPURatio*float64(pb)), ratio(float64(pa), float64(pb))))
	}
	if len(aims) > 0 {
		fmt.Fprintf(w, "\naims: %s\n", strings.Join(aims, "\n      "))
	}
}
