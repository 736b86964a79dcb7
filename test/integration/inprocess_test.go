package integration

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/cilium/statedb"
	"go.uber.org/goleak"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cellium/cellium/cells/hive/hivetest"
	"github.com/cellium/cellium/cells/k8s"
	"github.com/cellium/cellium/daemon"
	k8stables "github.com/cellium/cellium/statedb/k8s"
)

// TestAgentHiveInProcess composes the real agent graph in this process
// against the real apiserver, waits for a pod to reach the pods table,
// stops it, and checks that no goroutine it started is left behind.
func TestAgentHiveInProcess(t *testing.T) {
	c := cluster.Get(t)
	ns := c.TestNamespace(t)
	// The agent's ServiceAccount, as installed by the chart (before goleak's
	// snapshot: applying the RBAC objects may leave idle connections).
	kubeconfig, err := c.AgentKubeconfig(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	ignore := goleak.IgnoreCurrent() // the harness and earlier tests
	t.Setenv("K8S_NODE_NAME", "node-inproc")

	var (
		db   *statedb.DB
		pods statedb.Table[*corev1.Pod]
		cs   k8s.Clientset
	)
	h := hivetest.New(t, []string{
		"--k8s-kubeconfig-path=" + kubeconfig,
		"--socket-path=" + filepath.Join(t.TempDir(), "cellium.sock"),
		"--state-dir=" + t.TempDir(),
		"--write-cni-conf-when-ready=",
	}, daemon.Agent, hivetest.Capture(&db), hivetest.Capture(&pods), hivetest.Capture(&cs))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := h.Start(ctx); err != nil {
		t.Fatal(err)
	}
	stopped := false
	defer func() {
		if !stopped {
			_ = h.Stop(context.Background())
		}
	}()

	if _, err := c.Clientset().CoreV1().Pods(ns).Create(ctx, pod("inproc", "node-inproc"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "the pod in the table", func() error {
		_, _, ok := pods.Get(db.ReadTxn(), k8stables.NameIndex[*corev1.Pod]().Query(ns+"/inproc"))
		if !ok {
			return fmt.Errorf("not there yet")
		}
		return nil
	})
	// Consumers wait on the initialized marker.
	if init, _ := pods.Initialized(db.ReadTxn()); !init {
		t.Error("pods table not initialized after the first list")
	}

	if err := h.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	stopped = true
	// The client cell closes its idle connections at stop, but a
	// connection whose cancelled watches are still being torn down is not
	// idle yet then: close again until goleak (which retries for a while
	// itself) finds nothing, or give up after a few rounds.
	for range 5 {
		k8s.CloseIdleConnections(cs)
		if err = goleak.Find(ignore, goleak.IgnoreAnyFunction("k8s.io/klog/v2.(*loggingT).flushDaemon")); err == nil {
			return
		}
	}
	t.Fatalf("goroutines left after stop: %v", err)
}
