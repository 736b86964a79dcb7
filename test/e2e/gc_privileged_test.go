package e2e

import (
	"fmt"
	"strconv"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// TestPrivilegedOperatorGC: while the node's agent (and kubelet) are down,
// some pods are deleted for good and one finishes (phase Failed). The
// operator, with short GC intervals, deletes their CiliumEndpoints and,
// after the heartbeat timeout, the identity only they used; the live
// pods' CEPs and identity are never touched. When the node comes back,
// nothing of the gone pods is left and the live CEPs are the same objects.
func TestPrivilegedOperatorGC(t *testing.T) {
	e := newEnv(t, envOptions{operatorArgs: []string{
		"--cilium-endpoint-gc-interval=1s",
		"--identity-gc-interval=1s",
		"--identity-heartbeat-timeout=3s",
	}})
	live := []string{"live-0", "live-1", "live-2"}
	dead := []string{"dead-0", "dead-1", "dead-2"}
	const finished = "done-0"
	spec := map[string]map[string]string{finished: {"app": "live"}}
	for _, n := range live {
		spec[n] = map[string]string{"app": "live"}
	}
	for _, n := range dead {
		spec[n] = map[string]string{"app": "dead"}
	}
	all := append(append([]string{finished}, live...), dead...)
	e.createPods(spec)
	pods := e.waitRunning(all, 60*time.Second)
	ceps := e.waitCEPs(pods, 30*time.Second)
	liveID := ceps[live[0]].Status.Identity.ID
	deadID := ceps[dead[0]].Status.Identity.ID
	liveUIDs := map[string]types.UID{}
	for _, n := range live {
		liveUIDs[n] = ceps[n].UID
	}
	sbs := e.sandboxes()

	// Nothing live is deleted while everything runs, for several passes.
	checkLive := func() error {
		cur, err := e.ceps()
		if err != nil {
			return err
		}
		for n, uid := range liveUIDs {
			if cur[n] == nil || cur[n].UID != uid {
				return fmt.Errorf("live CEP %s was deleted or replaced (%v)", n, cur[n])
			}
		}
		if _, err := e.cilium.CiliumV2().CiliumIdentities().Get(e.ctx, strconv.FormatInt(liveID, 10), metavOpts); err != nil {
			return fmt.Errorf("identity %d of the live pods: %w", liveID, err)
		}
		return nil
	}
	for range 4 {
		time.Sleep(time.Second)
		if err := checkLive(); err != nil {
			t.Fatal(err)
		}
	}

	if err := e.node.StopKubelet(); err != nil {
		t.Fatal(err)
	}
	if err := e.node.StopAgent(); err != nil {
		t.Fatal(err)
	}
	zero := int64(0)
	e.deletePods(dead, &zero)
	if _, err := e.cs.CoreV1().Pods(e.ns).Patch(e.ctx, finished, types.MergePatchType,
		[]byte(`{"status":{"phase":"Failed"}}`), metav1.PatchOptions{}, "status"); err != nil {
		t.Fatal(err)
	}

	eventually(t, 30*time.Second, "the operator deleting the CEPs of gone and finished pods", func() error {
		cur, err := e.ceps()
		if err != nil {
			return err
		}
		for _, n := range append([]string{finished}, dead...) {
			if cur[n] != nil {
				return fmt.Errorf("CEP %s still there", n)
			}
		}
		return checkLive()
	})
	eventually(t, 30*time.Second, fmt.Sprintf("the operator deleting identity %d, unused", deadID), func() error {
		_, err := e.cilium.CiliumV2().CiliumIdentities().Get(e.ctx, strconv.FormatInt(deadID, 10), metavOpts)
		if !apierrors.IsNotFound(err) {
			return fmt.Errorf("identity %d still there (%v)", deadID, err)
		}
		return checkLive()
	})
	for range 4 {
		time.Sleep(time.Second)
		if err := checkLive(); err != nil {
			t.Fatal(err)
		}
	}

	// The node comes back: the gone pods leave nothing, the finished
	// one's sandbox is torn down, the live CEPs stay the same objects.
	if err := e.node.StartAgent(e.ctx); err != nil {
		t.Fatal(err)
	}
	if err := e.node.StartKubelet(); err != nil {
		t.Fatal(err)
	}
	e.waitGone(dead, sbs, 60*time.Second)
	eventually(t, 30*time.Second, "the finished pod's sandbox and endpoint gone", func() error {
		if _, ok := e.sandboxes()[finished]; ok {
			return fmt.Errorf("sandbox still there")
		}
		eps, err := e.endpoints()
		if err != nil {
			return err
		}
		if _, ok := eps[finished]; ok {
			return fmt.Errorf("endpoint still there")
		}
		allocs, err := e.allocations()
		if err != nil {
			return err
		}
		if owner, ok := allocs[sbs[finished].IP]; ok {
			return fmt.Errorf("IP %s still allocated to %s", sbs[finished].IP, owner)
		}
		return nil
	})
	livePods := map[string]*corev1.Pod{}
	for _, n := range live {
		livePods[n] = pods[n]
	}
	e.waitCEPs(livePods, 30*time.Second)
	if err := checkLive(); err != nil {
		t.Error(err)
	}
	cur, err := e.ceps()
	if err != nil {
		t.Fatal(err)
	}
	if cur[finished] != nil {
		t.Errorf("a CEP for the finished pod came back: %+v", cur[finished].Status)
	}
}
