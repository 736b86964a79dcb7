package soak

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/containernetworking/plugins/pkg/testutils"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"

	"github.com/cellium/cellium/test/devkubelet"
)

// apiTimeout bounds one API request of the soak.
const apiTimeout = 15 * time.Second

// maxRetired bounds the torn-down sandboxes kept for duplicate DELs.
const maxRetired = 16

// stepAction is one kind of step with its weight.
type stepAction struct {
	name   string
	weight int
	// ok says whether the action can run now.
	ok func() bool
	do func(ctx context.Context)
}

func wakeHandler(wake func()) cache.ResourceEventHandler {
	return cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { wake() },
		UpdateFunc: func(any, any) { wake() },
		DeleteFunc: func(any) { wake() },
	}
}

// step picks one action at random (by weight, among those that can run
// now) and does it.
func (s *Soak) step(ctx context.Context) {
	apiUp := !s.apiDown
	agentUp := s.node.Agent() != nil && s.agentStarting == nil
	some := func() bool { _, ok := s.peekAlive(); return apiUp && ok }
	actions := []stepAction{
		{"create", 6, func() bool { return apiUp && len(s.alive) < s.cfg.MaxPods }, func(ctx context.Context) {
			for range 1 + s.rng.IntN(3) {
				if len(s.alive) < s.cfg.MaxPods {
					s.createPod(ctx, "")
				}
			}
		}},
		{"delete", 2, some, func(ctx context.Context) {
			name, _ := s.randomAlive()
			s.deletePod(ctx, name, nil, "delete")
		}},
		{"force-delete", 2, some, func(ctx context.Context) {
			name, _ := s.randomAlive()
			zero := int64(0)
			s.deletePod(ctx, name, &zero, "force-delete")
		}},
		{"recreate", 2, some, func(ctx context.Context) {
			name, _ := s.randomAlive()
			zero := int64(0)
			if s.deletePod(ctx, name, &zero, "recreate") {
				s.createPod(ctx, name)
			}
		}},
		{"relabel", 4, some, s.relabel},
		{"dup-del", 2, func() bool { return agentUp && len(s.retired) > 0 }, s.dupDel},
		{"del-storm", 2, func() bool { return apiUp && agentUp && s.hasReadySandbox() }, s.delStorm},
		{"del-race", 2, func() bool { return apiUp && agentUp && s.hasReadySandbox() }, s.delRace},
		{"add-retry", 2, func() bool { return agentUp && s.hasReadySandbox() }, s.addRetry},
		{"add-other-netns", 1, func() bool { return agentUp && s.hasReadySandbox() }, s.addOtherNetns},
	}
	var can []stepAction
	total := 0
	for _, a := range actions {
		if !s.cfg.Skip[a.name] && a.ok() {
			can = append(can, a)
			total += a.weight
		}
	}
	if total == 0 {
		return
	}
	n := s.rng.IntN(total)
	for _, a := range can {
		if n < a.weight {
			a.do(ctx)
			return
		}
		n -= a.weight
	}
}

// peekAlive says whether randomAlive has a pod to choose, without
// drawing from the random source.
func (s *Soak) peekAlive() (string, bool) {
	for n := range s.alive {
		if pinnedLabels[n] == nil || !s.cfg.Datapath {
			return n, true
		}
	}
	return "", false
}

// randomAlive returns a pod the soak keeps, chosen at random; with the
// datapath on, never one of the pinned pair.
func (s *Soak) randomAlive() (string, bool) {
	var names []string
	for _, n := range slices.Sorted(maps.Keys(s.alive)) {
		if pinnedLabels[n] == nil || !s.cfg.Datapath {
			names = append(names, n)
		}
	}
	if len(names) == 0 {
		return "", false
	}
	return names[s.rng.IntN(len(names))], true
}

// createPod creates a pod on the node; an empty name picks a new one.
func (s *Soak) createPod(ctx context.Context, name string) {
	if name == "" {
		s.seq++
		name = fmt.Sprintf("p-%d", s.seq)
	}
	s.createPodWith(ctx, name, maps.Clone(labelSets[s.rng.IntN(len(labelSets))]))
}

// createPodWith creates pod name with labels on the node.
func (s *Soak) createPodWith(ctx context.Context, name string, labels map[string]string) {
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: s.cfg.Namespace, Labels: labels},
		Spec: corev1.PodSpec{
			NodeName:   s.node.Name,
			Containers: []corev1.Container{{Name: "app", Image: "registry.k8s.io/pause:3.10"}},
		},
	}
	cctx, cancel := context.WithTimeout(ctx, apiTimeout)
	defer cancel()
	created, err := s.cs.CoreV1().Pods(s.cfg.Namespace).Create(cctx, pod, metav1.CreateOptions{})
	if err != nil {
		s.tl.Addf("create", "pod %s: %v", name, err)
		return
	}
	s.alive[name] = podState{uid: string(created.UID), labels: labels}
	s.count("pods-created", 1)
	s.tl.Addf("create", "pod %s (UID %s) labels %v", name, shortID(string(created.UID)), labels)
}

// deletePod deletes a pod the soak keeps (grace nil: the default,
// confirmed by the kubelet; 0: at once) and remembers its sandbox for
// duplicate DELs. It reports whether the API server took the deletion;
// if not, it is retried until it does.
func (s *Soak) deletePod(ctx context.Context, name string, grace *int64, why string) bool {
	st, ok := s.alive[name]
	if !ok {
		return false
	}
	if sb, ok := s.sandboxOf(name); ok {
		s.retire(sb)
	}
	delete(s.alive, name)
	s.pending[name] = st.uid
	s.count("pods-deleted", 1)
	switch why {
	case "delete":
		s.count("graceful-deletes", 1)
	case "force-delete":
		s.count("force-deletes", 1)
	case "recreate":
		s.count("recreates", 1)
	}
	return s.tryDelete(ctx, name, st.uid, grace)
}

// tryDelete deletes the pod of that UID; done once it is gone or
// deleting.
func (s *Soak) tryDelete(ctx context.Context, name, uid string, grace *int64) bool {
	cctx, cancel := context.WithTimeout(ctx, apiTimeout)
	defer cancel()
	u := types.UID(uid)
	err := s.cs.CoreV1().Pods(s.cfg.Namespace).Delete(cctx, name, metav1.DeleteOptions{
		GracePeriodSeconds: grace, Preconditions: &metav1.Preconditions{UID: &u},
	})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		s.tl.Addf("delete", "pod %s (UID %s): %v (retried)", name, shortID(uid), err)
		return false
	}
	delete(s.pending, name)
	g := "default grace"
	if grace != nil {
		g = fmt.Sprintf("grace %ds", *grace)
	}
	s.tl.Addf("delete", "pod %s (UID %s), %s", name, shortID(uid), g)
	return true
}

func (s *Soak) relabel(ctx context.Context) {
	name, _ := s.randomAlive()
	st := s.alive[name]
	labels := maps.Clone(labelSets[s.rng.IntN(len(labelSets))])
	patch, _ := json.Marshal([]map[string]any{
		{"op": "add", "path": "/metadata/labels", "value": labels},
		{"op": "test", "path": "/metadata/uid", "value": st.uid},
	})
	cctx, cancel := context.WithTimeout(ctx, apiTimeout)
	defer cancel()
	_, err := s.cs.CoreV1().Pods(s.cfg.Namespace).Patch(cctx, name, types.JSONPatchType, patch, metav1.PatchOptions{})
	if err != nil {
		s.tl.Addf("relabel", "pod %s: %v", name, err)
		return
	}
	st.labels = labels
	s.alive[name] = st
	s.count("relabels", 1)
	s.tl.Addf("relabel", "pod %s -> %v", name, labels)
}

// sandboxes reads the kubelet's sandbox records.
func (s *Soak) sandboxes() []devkubelet.Sandbox {
	sbs, err := devkubelet.LoadSandboxes(s.node.KubeletStateDir())
	if err != nil {
		s.tl.Addf("sandboxes", "read the kubelet's records: %v", err)
		return nil
	}
	return sbs
}

// sandboxOf returns the ready sandbox of a kept pod (same UID).
func (s *Soak) sandboxOf(name string) (devkubelet.Sandbox, bool) {
	st, ok := s.alive[name]
	if !ok {
		return devkubelet.Sandbox{}, false
	}
	for _, sb := range s.sandboxes() {
		if sb.Name == name && string(sb.UID) == st.uid && sb.State == devkubelet.SandboxReady {
			return sb, true
		}
	}
	return devkubelet.Sandbox{}, false
}

// readySandboxes are the ready sandboxes of kept pods, by pod name order.
func (s *Soak) readySandboxes() []devkubelet.Sandbox {
	var out []devkubelet.Sandbox
	for _, sb := range s.sandboxes() {
		if s.cfg.Datapath && pinnedLabels[sb.Name] != nil {
			continue // the pinned pair is left alone
		}
		if st, ok := s.alive[sb.Name]; ok && string(sb.UID) == st.uid && sb.State == devkubelet.SandboxReady && sb.IP != "" {
			out = append(out, sb)
		}
	}
	slices.SortFunc(out, func(a, b devkubelet.Sandbox) int {
		if a.Name < b.Name {
			return -1
		}
		if a.Name > b.Name {
			return 1
		}
		return 0
	})
	return out
}

func (s *Soak) hasReadySandbox() bool { return len(s.readySandboxes()) > 0 }

func (s *Soak) randomReadySandbox() (devkubelet.Sandbox, bool) {
	sbs := s.readySandboxes()
	if len(sbs) == 0 {
		return devkubelet.Sandbox{}, false
	}
	return sbs[s.rng.IntN(len(sbs))], true
}

func (s *Soak) retire(sb devkubelet.Sandbox) {
	s.retired = append(s.retired, sb)
	if len(s.retired) > maxRetired {
		s.retired = s.retired[len(s.retired)-maxRetired:]
	}
}

// runCNIs runs the plugin k times at once; it touches no soak state, so
// it may run beside other actions.
func runCNIs(ctx context.Context, binDir string, k int, call cniCall) ([]cniOutcome, []error) {
	out := make([]cniOutcome, k)
	errs := make([]error, k)
	var wg sync.WaitGroup
	for i := range k {
		wg.Go(func() { out[i], errs[i] = runCNI(ctx, binDir, call) })
	}
	wg.Wait()
	return out, errs
}

// cni runs the plugin k times at once and returns the outcomes; a run
// that breaks the CNI protocol is a violation.
func (s *Soak) cni(ctx context.Context, k int, call cniCall) []cniOutcome {
	out, errs := runCNIs(ctx, s.node.CNIBinDir(), k, call)
	s.account(call, k, errs)
	return out
}

// account counts plugin runs and flags protocol errors.
func (s *Soak) account(call cniCall, k int, errs []error) {
	if call.command == "DEL" {
		s.count("del-calls", k)
	}
	for _, err := range errs {
		if err != nil {
			s.violate("cni-protocol", "cellium-cni "+call.command, "%v", err)
		}
	}
}

// checkDELs flags DELs that failed for another reason than "try again
// later" (the agent went away meanwhile): a DEL must succeed when what it
// should remove is already gone.
func (s *Soak) checkDELs(sb devkubelet.Sandbox, outs []cniOutcome, what string) {
	for _, o := range outs {
		if o.code != 0 && o.code != 11 {
			s.violate("del-failed", "container "+shortID(sb.ID), "%s of pod %s failed: %s", what, sb.Name, o)
		}
	}
}

func outcomes(outs []cniOutcome) []string {
	var s []string
	for _, o := range outs {
		s = append(s, o.String())
	}
	return s
}

// dupDel repeats the DEL of a sandbox the kubelet tore down (or is
// tearing down), once or twice at once.
func (s *Soak) dupDel(ctx context.Context) {
	sb := s.retired[s.rng.IntN(len(s.retired))]
	k := 1 + s.rng.IntN(2)
	outs := s.cni(ctx, k, cniCall{command: "DEL", sb: sb})
	s.count("dup-del", 1)
	s.tl.Addf("dup-del", "%d× DEL of old sandbox %s of pod %s: %v", k, shortID(sb.ID), sb.Name, outcomes(outs))
	s.checkDELs(sb, outs, "a repeated DEL")
}

// delStorm runs 2-4 DELs of a live pod's sandbox at once (a runtime's
// retries), then deletes the pod for good, whose kubelet DELs again.
func (s *Soak) delStorm(ctx context.Context) {
	sb, _ := s.randomReadySandbox()
	k := 2 + s.rng.IntN(3)
	outs := s.cni(ctx, k, cniCall{command: "DEL", sb: sb})
	s.count("del-storm", 1)
	s.tl.Addf("del-storm", "%d× DEL at once of live pod %s (sandbox %s, IP %s): %v", k, sb.Name, shortID(sb.ID), sb.IP, outcomes(outs))
	s.checkDELs(sb, outs, "a concurrent DEL")
	zero := int64(0)
	s.deletePod(ctx, sb.Name, &zero, "del-storm")
}

// delRace deletes a pod at once while 1-3 DELs of its sandbox run: the
// kubelet's own DEL races them.
func (s *Soak) delRace(ctx context.Context) {
	sb, _ := s.randomReadySandbox()
	k := 1 + s.rng.IntN(3)
	call := cniCall{command: "DEL", sb: sb}
	var outs []cniOutcome
	var errs []error
	var wg sync.WaitGroup
	wg.Go(func() { outs, errs = runCNIs(ctx, s.node.CNIBinDir(), k, call) })
	zero := int64(0)
	s.deletePod(ctx, sb.Name, &zero, "del-race")
	wg.Wait()
	s.account(call, k, errs)
	s.count("del-race", 1)
	s.tl.Addf("del-race", "pod %s deleted with %d DELs of sandbox %s at once (IP %s): %v", sb.Name, k, shortID(sb.ID), sb.IP, outcomes(outs))
	s.checkDELs(sb, outs, "a DEL racing the kubelet's")
}

// addRetry runs ADD again for a live pod's sandbox, same container ID,
// netns and interface, as a runtime retrying a timed-out ADD does. The
// answer must be the pod's own address or a refusal; the pod's
// attachment must stay as it is (checked at the next quiescent point).
func (s *Soak) addRetry(ctx context.Context) {
	sb, _ := s.randomReadySandbox()
	outs := s.cni(ctx, 1, cniCall{command: "ADD", sb: sb})
	s.count("add-retry", 1)
	s.tl.Addf("add-retry", "ADD again of live pod %s (sandbox %s, IP %s): %v", sb.Name, shortID(sb.ID), sb.IP, outcomes(outs))
	if o := outs[0]; o.code == 0 && o.ip != sb.IP {
		s.violate("add-retry-ip", "pod "+sb.Name, "a repeated ADD of sandbox %s succeeded with IP %s, the pod has %s", shortID(sb.ID), o.ip, sb.IP)
	}
}

// addOtherNetns runs ADD with a live pod's container ID into another
// network namespace (made here, removed after): the live attachment must
// stay untouched.
func (s *Soak) addOtherNetns(ctx context.Context) {
	sb, _ := s.randomReadySandbox()
	n, err := testutils.NewNS()
	if err != nil {
		s.tl.Addf("add-other-netns", "make a netns: %v", err)
		return
	}
	path := n.Path()
	s.ownNetns[path] = true
	defer func() {
		_ = n.Close()
		if err := testutils.UnmountNS(n); err != nil {
			s.tl.Addf("add-other-netns", "remove netns %s: %v", path, err)
			return
		}
		delete(s.ownNetns, path)
	}()
	outs := s.cni(ctx, 1, cniCall{command: "ADD", sb: sb, netns: path})
	s.count("add-other-netns", 1)
	s.tl.Addf("add-other-netns", "ADD of live pod %s's container %s into another netns %s: %v", sb.Name, shortID(sb.ID), path, outcomes(outs))
}
