package devkubelet

import (
	"context"
	"crypto/rand"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/cellium/cellium/test/privileged"
)

func eventually(t testing.TB, timeout time.Duration, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s: %v", timeout, what, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// testKubelet runs a Kubelet until stopped.
type testKubelet struct {
	*Kubelet
	cancel context.CancelFunc
	done   chan error
}

func startKubelet(t *testing.T, cfg Config, cs kubernetes.Interface) *testKubelet {
	t.Helper()
	cfg.Logger = slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
	k, err := New(cfg, cs)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	tk := &testKubelet{Kubelet: k, cancel: cancel, done: make(chan error, 1)}
	go func() { tk.done <- k.Run(ctx) }()
	return tk
}

func (k *testKubelet) stop(t *testing.T) {
	t.Helper()
	k.cancel()
	if err := <-k.done; err != nil {
		t.Errorf("Run: %v", err)
	}
}

func testNodeName() string { return "kubelet-test-" + strings.ToLower(rand.Text()[:6]) }

func newPod(ns, name, node string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{"app": "test"}},
		Spec: corev1.PodSpec{
			NodeName:   node,
			Containers: []corev1.Container{{Name: "app", Image: "registry.k8s.io/pause:3.10"}},
		},
	}
}

// TestPrivilegedKubelet drives the kubelet through a pod's life against
// the real API server with a fake CNI plugin that logs its calls: node
// registration and readiness, ADD with the runtime's CNI_ARGS and the
// pod's status, failed ADDs undone and retried, restart with adoption and
// teardown of what went away meanwhile, graceful deletion, a pod
// replaced under the same name, and Cleanup.
func TestPrivilegedKubelet(t *testing.T) {
	privileged.Require(t)
	c := cluster.Get(t)
	cs := c.Clientset()
	ctx := t.Context()
	namespace := c.TestNamespace(t)
	dir := t.TempDir()
	net := newFakeNetwork(t, dir)
	node := testNodeName()
	cfg := Config{
		NodeName:   node,
		NodeIP:     netip.MustParseAddr("127.0.0.42"),
		CNIConfDir: net.confDir,
		CNIBinDirs: []string{net.binDir},
		StateDir:   filepath.Join(dir, "state"),
		Workers:    4,
	}
	k := startKubelet(t, cfg, cs)
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			k.stop(t)
		}
		cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := k.Cleanup(cctx); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})

	// The node registers at once, NotReady while there is no network.
	nodeCondition := func() (corev1.ConditionStatus, error) {
		n, err := cs.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return "", err
		}
		if len(n.Status.Addresses) == 0 || n.Status.Addresses[0].Type != corev1.NodeInternalIP || n.Status.Addresses[0].Address != "127.0.0.42" {
			return "", fmt.Errorf("node addresses %v", n.Status.Addresses)
		}
		for _, cond := range n.Status.Conditions {
			if cond.Type == corev1.NodeReady {
				return cond.Status, nil
			}
		}
		return "", fmt.Errorf("no Ready condition")
	}
	eventually(t, 10*time.Second, "node registered NotReady", func() error {
		s, err := nodeCondition()
		if err != nil {
			return err
		}
		if s != corev1.ConditionFalse {
			return fmt.Errorf("Ready=%s", s)
		}
		return nil
	})

	pods := cs.CoreV1().Pods(namespace)
	create := func(name, nodeName string) *corev1.Pod {
		t.Helper()
		p, err := pods.Create(ctx, newPod(namespace, name, nodeName), metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	running := func(name string) *corev1.Pod {
		t.Helper()
		var pod *corev1.Pod
		eventually(t, 20*time.Second, "pod "+name+" Running", func() error {
			p, err := pods.Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if p.Status.Phase != corev1.PodRunning || p.Status.PodIP == "" {
				return fmt.Errorf("phase %s ip %q", p.Status.Phase, p.Status.PodIP)
			}
			pod = p
			return nil
		})
		return pod
	}
	sandboxOf := func(name string) *Sandbox {
		for _, sb := range k.Sandboxes() {
			if sb.Key() == namespace+"/"+name {
				return &sb
			}
		}
		return nil
	}

	// Without a network the pod waits; another node's pod is not ours.
	p1 := create("p1", node)
	create("elsewhere", "some-other-node")
	time.Sleep(time.Second)
	if calls := net.calls(t); len(calls) != 0 {
		t.Fatalf("plugin called before the network was configured: %v", calls)
	}

	// The network appears: the node gets Ready, the pod runs.
	net.install(t)
	eventually(t, 10*time.Second, "node Ready", func() error {
		s, err := nodeCondition()
		if err == nil && s != corev1.ConditionTrue {
			err = fmt.Errorf("Ready=%s", s)
		}
		return err
	})
	got := running("p1")
	sb := sandboxOf("p1")
	if sb == nil {
		t.Fatal("no sandbox for p1")
	}
	if got.Status.PodIP != fakeIP(sb.ID).String() || got.Status.HostIP != "127.0.0.42" || len(got.Status.PodIPs) != 1 {
		t.Errorf("p1 status: podIP %s podIPs %v hostIP %s; want podIP %s from the CNI result and hostIP 127.0.0.42",
			got.Status.PodIP, got.Status.PodIPs, got.Status.HostIP, fakeIP(sb.ID))
	}
	ready := false
	for _, cond := range got.Status.Conditions {
		ready = ready || cond.Type == corev1.PodReady && cond.Status == corev1.ConditionTrue
	}
	if !ready || len(got.Status.ContainerStatuses) != 1 || got.Status.ContainerStatuses[0].State.Running == nil {
		t.Errorf("p1 not reported ready and running: %+v", got.Status)
	}
	if !netnsExists(sb.NetnsPath) || filepath.Dir(sb.NetnsPath) != DefaultNetnsDir {
		t.Errorf("p1's netns %s does not exist under %s", sb.NetnsPath, DefaultNetnsDir)
	}
	calls := net.calls(t)
	if len(calls) != 1 || calls[0].Command != "ADD" || calls[0].ContainerID != sb.ID || calls[0].IfName != "eth0" || calls[0].Netns != sb.NetnsPath {
		t.Fatalf("plugin calls %+v; want one ADD for sandbox %s", calls, sb.ID)
	}
	wantArgs := fmt.Sprintf("IgnoreUnknown=1;K8S_POD_NAMESPACE=%s;K8S_POD_NAME=p1;K8S_POD_INFRA_CONTAINER_ID=%s;K8S_POD_UID=%s",
		namespace, sb.ID, p1.UID)
	if calls[0].Args != wantArgs {
		t.Errorf("CNI_ARGS %q, want %q", calls[0].Args, wantArgs)
	}
	if p, _ := pods.Get(ctx, "elsewhere", metav1.GetOptions{}); p.Status.Phase == corev1.PodRunning {
		t.Error("the pod of another node was run")
	}

	// A failing ADD is undone (DEL, netns removed), reported, and retried.
	if err := os.WriteFile(net.failAdd, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	create("p2", node)
	var failedID string
	eventually(t, 10*time.Second, "a failed ADD for p2 undone", func() error {
		for _, c := range net.calls(t) {
			if c.Command == "ADD-FAILED" && strings.Contains(c.Args, "K8S_POD_NAME=p2;") {
				failedID = c.ContainerID
			}
		}
		if failedID == "" {
			return fmt.Errorf("no failed ADD yet")
		}
		if cmds := net.callsFor(t, failedID); !slices.Contains(cmds, "DEL") {
			return fmt.Errorf("calls for the failed sandbox: %v; want a DEL", cmds)
		}
		return nil
	})
	eventually(t, 10*time.Second, "FailedCreatePodSandBox event", func() error {
		evs, err := cs.CoreV1().Events(namespace).List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		for _, e := range evs.Items {
			if e.InvolvedObject.Name == "p2" && e.Reason == "FailedCreatePodSandBox" && strings.Contains(e.Message, "told to fail") {
				return nil
			}
		}
		return fmt.Errorf("none among %d events", len(evs.Items))
	})
	if err := os.Remove(net.failAdd); err != nil {
		t.Fatal(err)
	}
	running("p2")
	if sb2 := sandboxOf("p2"); sb2 == nil || sb2.ID == failedID {
		t.Errorf("p2 runs in sandbox %v; want a new one, not the failed %s", sb2, failedID)
	}
	failedNetns := filepath.Join(DefaultNetnsDir, netnsName(namespace, "p2", failedID))
	if _, err := os.Stat(failedNetns); !os.IsNotExist(err) {
		t.Errorf("netns of the failed attempt still there: %v", err)
	}

	// Restart: p1 is adopted as it is; p2, deleted for good meanwhile, is
	// torn down.
	k.stop(t)
	stopped = true
	p1sb, p2sb := sandboxOf("p1"), sandboxOf("p2")
	zero := int64(0)
	if err := pods.Delete(ctx, "p2", metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		t.Fatal(err)
	}
	k = startKubelet(t, cfg, cs)
	stopped = false
	eventually(t, 10*time.Second, "p2's sandbox torn down after the restart", func() error {
		if cmds := net.callsFor(t, p2sb.ID); !slices.Contains(cmds, "DEL") {
			return fmt.Errorf("calls %v", cmds)
		}
		if netnsExists(p2sb.NetnsPath) {
			return fmt.Errorf("netns %s still there", p2sb.NetnsPath)
		}
		if sandboxOf("p2") != nil {
			return fmt.Errorf("still has a sandbox")
		}
		return nil
	})
	if sb := sandboxOf("p1"); sb == nil || sb.ID != p1sb.ID {
		t.Errorf("p1 after restart: sandbox %v, want the adopted %s", sb, p1sb.ID)
	}
	if cmds := net.callsFor(t, p1sb.ID); !slices.Equal(cmds, []string{"ADD"}) {
		t.Errorf("calls for p1's sandbox after restart: %v; want the one ADD", cmds)
	}

	// Graceful deletion: DEL, netns gone, then the kubelet confirms.
	if err := pods.Delete(ctx, "p1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 15*time.Second, "p1 deleted for good", func() error {
		_, err := pods.Get(ctx, "p1", metav1.GetOptions{})
		if !apierrors.IsNotFound(err) {
			return fmt.Errorf("pod still there (%v)", err)
		}
		return nil
	})
	if cmds := net.callsFor(t, p1sb.ID); !slices.Equal(cmds, []string{"ADD", "DEL"}) {
		t.Errorf("calls for p1's sandbox: %v; want ADD, DEL", cmds)
	}
	if netnsExists(p1sb.NetnsPath) {
		t.Errorf("p1's netns %s still there", p1sb.NetnsPath)
	}

	// A pod replaced under the same name gets a new sandbox.
	old := create("p3", node)
	running("p3")
	oldSB := sandboxOf("p3")
	if err := pods.Delete(ctx, "p3", metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		t.Fatal(err)
	}
	fresh := create("p3", node)
	eventually(t, 20*time.Second, "p3 re-created and running in a new sandbox", func() error {
		p, err := pods.Get(ctx, "p3", metav1.GetOptions{})
		if err != nil {
			return err
		}
		sb := sandboxOf("p3")
		if p.UID != fresh.UID || p.Status.Phase != corev1.PodRunning || sb == nil || sb.UID != fresh.UID {
			return fmt.Errorf("phase %s sandbox %+v", p.Status.Phase, sb)
		}
		if p.Status.PodIP != fakeIP(sb.ID).String() {
			return fmt.Errorf("pod IP %s is not the new sandbox's", p.Status.PodIP)
		}
		return nil
	})
	if cmds := net.callsFor(t, oldSB.ID); !slices.Equal(cmds, []string{"ADD", "DEL"}) || old.UID == fresh.UID {
		t.Errorf("calls for the replaced pod's sandbox: %v; want ADD, DEL", cmds)
	}

	// Timings were recorded.
	var p1t *PodTiming
	for _, tm := range k.Timings() {
		if tm.UID == p1.UID {
			p1t = &tm
		}
	}
	if p1t == nil || p1t.Del <= 0 || p1t.Gone.IsZero() {
		t.Errorf("timing of p1 after the restart: %+v; want its DEL", p1t)
	}

	// Cleanup tears everything down and unregisters the node.
	k.stop(t)
	stopped = true
	last := sandboxOf("p3")
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := k.Cleanup(cctx); err != nil {
		t.Fatal(err)
	}
	if netnsExists(last.NetnsPath) || len(k.Sandboxes()) != 0 {
		t.Errorf("after Cleanup: netns %s exists=%v, sandboxes %v", last.NetnsPath, netnsExists(last.NetnsPath), k.Sandboxes())
	}
	if cmds := net.callsFor(t, last.ID); !slices.Equal(cmds, []string{"ADD", "DEL"}) {
		t.Errorf("calls for p3's sandbox: %v", cmds)
	}
	if _, err := cs.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("node after Cleanup: %v", err)
	}
	if recs, _ := LoadSandboxes(cfg.StateDir); len(recs) != 0 {
		t.Errorf("records left: %v", recs)
	}
}

// TestPrivilegedRemoveLeftovers: without any plugin call, the netns of a
// kubelet that is gone are removed from its records.
func TestPrivilegedRemoveLeftovers(t *testing.T) {
	privileged.Require(t)
	c := cluster.Get(t)
	cs := c.Clientset()
	namespace := c.TestNamespace(t)
	dir := t.TempDir()
	net := newFakeNetwork(t, dir)
	net.install(t)
	node := testNodeName()
	cfg := Config{NodeName: node, NodeIP: netip.MustParseAddr("127.0.0.43"), CNIConfDir: net.confDir,
		CNIBinDirs: []string{net.binDir}, StateDir: filepath.Join(dir, "state")}
	k := startKubelet(t, cfg, cs)
	t.Cleanup(func() {
		_ = cs.CoreV1().Nodes().Delete(context.Background(), node, metav1.DeleteOptions{})
	})
	if _, err := cs.CoreV1().Pods(namespace).Create(t.Context(), newPod(namespace, "p", node), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var sb Sandbox
	eventually(t, 20*time.Second, "a ready sandbox", func() error {
		sbs := k.Sandboxes()
		if len(sbs) != 1 || sbs[0].State != SandboxReady {
			return fmt.Errorf("sandboxes %v", sbs)
		}
		sb = sbs[0]
		return nil
	})
	k.stop(t)
	removed, err := RemoveLeftovers(cfg.StateDir)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(removed, "netns "+sb.NetnsName()) || netnsExists(sb.NetnsPath) {
		t.Errorf("removed %v; netns %s exists=%v", removed, sb.NetnsPath, netnsExists(sb.NetnsPath))
	}
	if recs, _ := LoadSandboxes(cfg.StateDir); len(recs) != 0 {
		t.Errorf("records left: %v", recs)
	}
	if _, err := RemoveLeftovers(cfg.StateDir); err != nil {
		t.Errorf("second RemoveLeftovers: %v", err)
	}
}
