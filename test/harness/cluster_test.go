package harness

import (
	"context"
	"encoding/base64"
	"errors"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

// verifyNoLeaks checks for leaked goroutines once the test and its cleanups
// (which stop the cluster) are done. Call it before ForTest.
func verifyNoLeaks(t *testing.T) {
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, ignore) })
}

func TestCluster(t *testing.T) {
	verifyNoLeaks(t)
	ctx := t.Context()
	c := ForTest(t, Options{})

	if err := c.Ready(ctx); err != nil {
		t.Fatal(err)
	}
	v, err := c.Clientset().Discovery().ServerVersion()
	if err != nil {
		t.Fatal(err)
	}
	if v.GitVersion != c.Binaries().KubernetesVersion {
		t.Errorf("server version %s, want %s", v.GitVersion, c.Binaries().KubernetesVersion)
	}

	// The kubeconfig file works on its own.
	cfg, err := clientcmd.BuildConfigFromFlags("", c.Kubeconfig())
	if err != nil {
		t.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().Namespaces().Get(ctx, "kube-system", metav1.GetOptions{}); err != nil {
		t.Fatalf("get kube-system through the kubeconfig: %v", err)
	}

	// Pods can be created without the controller-manager: in "default"
	// (ServiceAccount made by Start) and in a test namespace.
	ns := c.TestNamespace(t)
	for _, ns := range []string{metav1.NamespaceDefault, ns} {
		created, err := c.Clientset().CoreV1().Pods(ns).Create(ctx, testPod("web"), metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("create pod in %s: %v", ns, err)
		}
		got, err := c.Clientset().CoreV1().Pods(ns).Get(ctx, "web", metav1.GetOptions{})
		if err != nil || got.UID != created.UID {
			t.Fatalf("get pod in %s: %v", ns, err)
		}
		if got.Spec.ServiceAccountName != "default" {
			t.Errorf("pod in %s has service account %q, want default", ns, got.Spec.ServiceAccountName)
		}
	}

	// Without the controller-manager, nobody collects garbage: a deleted
	// owner leaves its dependents.
	pod, err := c.Clientset().CoreV1().Pods(ns).Get(ctx, "web", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	createDependent(t, c, pod)
	if err := c.Clientset().CoreV1().Pods(ns).Delete(ctx, "web", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond)
	if _, err := c.Clientset().CoreV1().ConfigMaps(ns).Get(ctx, "dependent", metav1.GetOptions{}); err != nil {
		t.Errorf("dependent of a deleted pod is gone without the controller-manager: %v", err)
	}

	stopAndCheck(t, c, true)
}

func TestClusterControllerManager(t *testing.T) {
	verifyNoLeaks(t)
	ctx := t.Context()
	c := ForTest(t, Options{ControllerManager: true})
	cs := c.Clientset()

	// The ServiceAccount controller gives a new namespace its "default".
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "cm-test"}}
	if _, err := cs.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "default service account in cm-test", func() error {
		_, err := cs.CoreV1().ServiceAccounts("cm-test").Get(ctx, "default", metav1.GetOptions{})
		return err
	})
	pod, err := cs.CoreV1().Pods("cm-test").Create(ctx, testPod("web"), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}

	// The garbage collector deletes the dependents of a deleted owner.
	createDependent(t, c, pod)
	if err := cs.CoreV1().Pods("cm-test").Delete(ctx, "web", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "garbage collection of the pod's dependent", func() error {
		_, err := cs.CoreV1().ConfigMaps("cm-test").Get(ctx, "dependent", metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return errors.New("still there")
	})

	// The namespace controller finalizes a deleted namespace.
	if err := cs.CoreV1().Namespaces().Delete(ctx, "cm-test", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "namespace deletion", func() error {
		_, err := cs.CoreV1().Namespaces().Get(ctx, "cm-test", metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return errors.New("still there")
	})

	stopAndCheck(t, c, true)
}

// TestShared also covers a work directory given by the caller: a second
// cluster cannot start there, and Stop keeps it.
func TestShared(t *testing.T) {
	verifyNoLeaks(t)
	dir := t.TempDir()
	s := NewShared(Options{Dir: dir})
	if err := s.Stop(); err != nil {
		t.Fatalf("Stop before Get: %v", err)
	}
	var c *Cluster
	t.Run("first", func(t *testing.T) {
		c = s.Get(t)
		c.TestNamespace(t)
	})
	t.Run("second", func(t *testing.T) {
		c2 := s.Get(t)
		if c2 != c {
			t.Fatal("second Get started another cluster")
		}
		if err := c2.Ready(t.Context()); err != nil {
			t.Fatal(err)
		}
		_, err := Start(t.Context(), Options{Dir: dir})
		if !errors.Is(err, ErrAlreadyRunning) {
			t.Fatalf("second cluster in %s: %v; want ErrAlreadyRunning", dir, err)
		}
	})
	if err := s.Stop(); err != nil {
		t.Fatal(err)
	}
	assertStopped(t, c, false)
	if _, err := os.Stat(c.Kubeconfig()); err != nil {
		t.Errorf("the given work directory was cleaned: %v", err)
	}
}

// TestAPIServerRestart: the API server alone stops and comes back on the
// same port with the same etcd: objects survive, the clientset made before
// works again, and the misuses fail with their sentinels.
func TestAPIServerRestart(t *testing.T) {
	verifyNoLeaks(t)
	ctx := t.Context()
	c := ForTest(t, Options{})
	ns := c.TestNamespace(t)
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "survivor", Namespace: ns}}
	created, err := c.Clientset().CoreV1().ConfigMaps(ns).Create(ctx, cm, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.StartAPIServer(ctx); !errors.Is(err, ErrAPIServerRunning) {
		t.Fatalf("StartAPIServer while running: %v; want ErrAPIServerRunning", err)
	}
	etcdBefore := c.Processes()[0]

	if err := c.StopAPIServer(); err != nil {
		t.Fatal(err)
	}
	if err := c.StopAPIServer(); err != nil {
		t.Fatalf("second StopAPIServer: %v", err)
	}
	if err := c.Ready(ctx); err == nil {
		t.Fatal("the API server answers after StopAPIServer")
	}
	for _, p := range c.Processes() {
		if p.Name() == KubeAPIServer {
			t.Errorf("kube-apiserver (pid %d) still listed after StopAPIServer", p.Pid())
		}
	}

	if err := c.StartAPIServer(ctx); err != nil {
		t.Fatal(err)
	}
	got, err := c.Clientset().CoreV1().ConfigMaps(ns).Get(ctx, "survivor", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get through the old clientset after the restart: %v", err)
	}
	if got.UID != created.UID {
		t.Errorf("object replaced across the restart: UID %s, was %s", got.UID, created.UID)
	}
	if p := c.Processes()[0]; p != etcdBefore || p.Err() != nil {
		t.Errorf("etcd was restarted or stopped too")
	}

	if err := c.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := c.StartAPIServer(ctx); !errors.Is(err, ErrClusterStopped) {
		t.Errorf("StartAPIServer after Stop: %v; want ErrClusterStopped", err)
	}
	if err := c.StopAPIServer(); !errors.Is(err, ErrClusterStopped) {
		t.Errorf("StopAPIServer after Stop: %v; want ErrClusterStopped", err)
	}
}

func TestStartPortInUse(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	port := l.Addr().(*net.TCPAddr).Port
	dir := t.TempDir()
	_, err = Start(t.Context(), Options{Dir: dir, APIServerPort: port})
	if !errors.Is(err, ErrPortInUse) || !strings.Contains(err.Error(), strconv.Itoa(port)) {
		t.Fatalf("Start on a busy port: %v; want ErrPortInUse naming the port", err)
	}
}

// TestStartFailure: a component that fails to start fails Start with its
// log's tail, and leaves nothing running and no temporary directory.
func TestStartFailure(t *testing.T) {
	verifyNoLeaks(t)
	parent := t.TempDir()
	t.Setenv("TMPDIR", parent)
	_, err := Start(t.Context(), Options{APIServerArgs: []string{"--no-such-flag"}})
	if err == nil {
		t.Fatal("Start with a bad API server flag succeeded")
	}
	if !strings.Contains(err.Error(), "kube-apiserver exited") || !strings.Contains(err.Error(), "unknown flag: --no-such-flag") {
		t.Errorf("error does not explain the failure:\n%v", err)
	}
	if entries, _ := os.ReadDir(parent); len(entries) != 0 {
		t.Errorf("work directory left behind: %v", entries)
	}
}

// stopAndCheck stops c and checks that its processes are gone and, if
// removed, that its work directory is.
func stopAndCheck(t *testing.T, c *Cluster, removed bool) {
	t.Helper()
	start := time.Now()
	if err := c.Stop(); err != nil {
		t.Fatal(err)
	}
	t.Logf("stopped in %s", time.Since(start).Round(time.Millisecond))
	assertStopped(t, c, removed)
}

func assertStopped(t *testing.T, c *Cluster, removed bool) {
	t.Helper()
	if len(c.Processes()) < 2 {
		t.Errorf("cluster had %d processes", len(c.Processes()))
	}
	for _, p := range c.Processes() {
		if err := syscall.Kill(p.Pid(), 0); !errors.Is(err, syscall.ESRCH) {
			t.Errorf("%s (pid %d) still exists after Stop: %v", p.Name(), p.Pid(), err)
		}
	}
	if _, err := os.Stat(c.Dir()); removed != os.IsNotExist(err) {
		t.Errorf("work directory %s: removed=%v, want %v", c.Dir(), os.IsNotExist(err), removed)
	}
}

func testPod(name string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"app": name}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{
			Name:  "main",
			Image: "registry.k8s.io/pause:3.10", // never pulled: there is no kubelet
		}}},
	}
}

// createDependent creates a ConfigMap "dependent" owned by pod.
func createDependent(t *testing.T, c *Cluster, pod *corev1.Pod) {
	t.Helper()
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{
		Name:      "dependent",
		Namespace: pod.Namespace,
		OwnerReferences: []metav1.OwnerReference{{
			APIVersion: "v1", Kind: "Pod", Name: pod.Name, UID: pod.UID,
		}},
	}}
	if _, err := c.Clientset().CoreV1().ConfigMaps(pod.Namespace).Create(t.Context(), cm, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func eventually(t *testing.T, what string, cond func() error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	start := time.Now()
	for {
		err := cond()
		if err == nil {
			t.Logf("%s after %s", what, time.Since(start).Round(time.Millisecond))
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%s: not within 30s: %v", what, err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// TestEtcdAddress: with EtcdAddress etcd also serves its clients on that
// address (127.0.0.2 here, another loopback address) with the port it has
// on 127.0.0.1, both ways reach the same data, and the API server works
// as before; a wildcard address is refused before anything starts.
func TestEtcdAddress(t *testing.T) {
	if _, err := Start(t.Context(), Options{Dir: t.TempDir(), EtcdAddress: netip.MustParseAddr("0.0.0.0")}); err == nil || !strings.Contains(err.Error(), "wildcard") {
		t.Errorf("Start with EtcdAddress 0.0.0.0: %v; want a refusal", err)
	}
	verifyNoLeaks(t)
	ctx := t.Context()
	c := ForTest(t, Options{EtcdAddress: netip.MustParseAddr("127.0.0.2")})
	u, err := url.Parse(c.EtcdURL())
	if err != nil {
		t.Fatal(err)
	}
	if want := "http://127.0.0.2:" + u.Port(); c.EtcdAddressURL() != want {
		t.Fatalf("EtcdAddressURL %q, want %q", c.EtcdAddressURL(), want)
	}
	// A key written through one address is read through the other (etcd's
	// JSON gateway: keys and values in base64).
	kv := func(base, op, body string) string {
		t.Helper()
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v3/kv/"+op, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		resp, err := (&http.Client{Transport: &http.Transport{DisableKeepAlives: true}}).Do(req)
		if err != nil {
			t.Fatalf("%s through %s: %v", op, base, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s through %s: %s: %s", op, base, resp.Status, b)
		}
		return string(b)
	}
	key, val := base64.StdEncoding.EncodeToString([]byte("cilium/state/test")), base64.StdEncoding.EncodeToString([]byte("on both"))
	kv(c.EtcdAddressURL(), "put", `{"key":"`+key+`","value":"`+val+`"}`)
	if got := kv(c.EtcdURL(), "range", `{"key":"`+key+`"}`); !strings.Contains(got, `"value":"`+val+`"`) {
		t.Errorf("range through %s: %s; want the value put through %s", c.EtcdURL(), got, c.EtcdAddressURL())
	}
	if _, err := c.Clientset().CoreV1().Namespaces().Get(ctx, "kube-system", metav1.GetOptions{}); err != nil {
		t.Errorf("the API server: %v", err)
	}
	// Without the option: none.
	if (&Cluster{}).EtcdAddressURL() != "" {
		t.Error("EtcdAddressURL without EtcdAddress is not empty")
	}
}
