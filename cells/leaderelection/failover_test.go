package leaderelection_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/cells/hive/hivetest"
	"github.com/cellium/cellium/cells/k8s"
	"github.com/cellium/cellium/cells/leaderelection"
	"github.com/cellium/cellium/test/harness"
)

// cluster is the real etcd and kube-apiserver, started on first use.
var cluster = harness.NewShared(harness.Options{})

func TestMain(m *testing.M) {
	code := m.Run()
	if err := cluster.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		code = 1
	}
	if code == 0 {
		if err := goleak.Find(goleak.IgnoreAnyFunction("k8s.io/klog/v2.(*loggingT).flushDaemon")); err != nil {
			fmt.Fprintln(os.Stderr, "goroutines left behind:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// proxy forwards loopback TCP connections to the API server until cut,
// which closes every connection: the replica behind it is as good as
// crashed for the cluster (it can no longer renew its Lease).
type proxy struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	conns  []net.Conn
	wg     sync.WaitGroup
}

func newProxy(t *testing.T, target string) *proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{ln: ln, target: target}
	p.wg.Go(p.accept)
	t.Cleanup(p.cut)
	return p
}

func (p *proxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		up, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, c, up)
		p.mu.Unlock()
		p.wg.Go(func() { _, _ = io.Copy(up, c); up.Close() })
		p.wg.Go(func() { _, _ = io.Copy(c, up); c.Close() })
	}
}

// cut stops accepting and closes every connection.
func (p *proxy) cut() {
	p.ln.Close()
	p.mu.Lock()
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
	p.mu.Unlock()
	p.wg.Wait()
}

// kubeconfigVia writes a copy of the cluster's kubeconfig whose server is
// the proxy.
func kubeconfigVia(t *testing.T, c *harness.Cluster, p *proxy) string {
	t.Helper()
	cfg, err := clientcmd.LoadFromFile(c.Kubeconfig())
	if err != nil {
		t.Fatal(err)
	}
	for _, cl := range cfg.Clusters {
		u, err := url.Parse(cl.Server)
		if err != nil {
			t.Fatal(err)
		}
		u.Host = p.ln.Addr().String()
		cl.Server = u.String()
	}
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// replica is one operator replica: the election and one leader job that
// records when it runs.
type replica struct {
	name    string
	h       *hive.Hive
	lead    leaderelection.Leadership
	started chan time.Time // when the leader job started
	mu      sync.Mutex
	ended   time.Time // when the leader job's ctx ended
}

func startReplica(t *testing.T, name, kubeconfig, ns string) *replica {
	t.Helper()
	r := &replica{name: name, started: make(chan time.Time, 1)}
	r.h = hivetest.New(t, []string{
		"--k8s-kubeconfig-path=" + kubeconfig,
		"--leader-election-namespace=" + ns,
		"--leader-election-lease-duration=3s",
		"--leader-election-renew-deadline=2s",
		"--leader-election-retry-period=200ms",
	},
		k8s.ClientCell,
		hive.Provide(func() k8s.UserAgent { return k8s.UserAgent("failover-" + name) }),
		leaderelection.Cell,
		hive.Provide(func() leaderelection.LeaderJobsOut {
			return leaderelection.LeaderJobsOut{Jobs: []leaderelection.LeaderJob{{Name: "record", Run: func(ctx context.Context) error {
				r.started <- time.Now()
				<-ctx.Done()
				r.mu.Lock()
				r.ended = time.Now()
				r.mu.Unlock()
				return nil
			}}}}
		}),
		hivetest.Capture(&r.lead),
	)
	if err := r.h.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	return r
}

func (r *replica) stop(t *testing.T) {
	t.Helper()
	if err := r.h.Stop(context.Background()); err != nil {
		t.Logf("stop %s: %v", r.name, err)
	}
}

func (r *replica) waitLeading(t *testing.T, within time.Duration) time.Time {
	t.Helper()
	select {
	case at := <-r.started:
		if !r.lead.IsLeader() {
			t.Fatalf("%s runs the leader job but IsLeader is false", r.name)
		}
		return at
	case <-time.After(within):
		t.Fatalf("%s did not start leading within %s", r.name, within)
		return time.Time{}
	}
}

func holder(t *testing.T, c *harness.Cluster, ns string) string {
	t.Helper()
	l, err := c.Clientset().CoordinationV1().Leases(ns).Get(t.Context(), leaderelection.LeaseName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if l.Spec.HolderIdentity == nil {
		return ""
	}
	return *l.Spec.HolderIdentity
}

// Two replicas against the real API server: one leads, the other waits;
// when the leader stops, the other takes over at once (the Lease is
// released); when a leader crashes (its connection to the API server is
// cut, so it cannot renew or release), the other takes over after the
// lease duration, and the crashed one's controllers stopped before.
func TestFailover(t *testing.T) {
	if testing.Short() {
		t.Skip("starts etcd and kube-apiserver")
	}
	c := cluster.Get(t)
	ns := c.TestNamespace(t)

	// Graceful: a stops, b takes over.
	a := startReplica(t, "a", c.Kubeconfig(), ns)
	a.waitLeading(t, 30*time.Second)
	b := startReplica(t, "b", c.Kubeconfig(), ns)
	defer b.stop(t)
	// b is a candidate: the Lease names a, and b does not lead.
	if got := holder(t, c, ns); got != a.lead.Identity() {
		t.Fatalf("Lease held by %q, want a (%s)", got, a.lead.Identity())
	}
	if b.lead.IsLeader() {
		t.Fatal("b leads while a holds the Lease")
	}
	t0 := time.Now()
	a.stop(t)
	b.waitLeading(t, 10*time.Second)
	t.Logf("graceful failover took %s", time.Since(t0).Round(time.Millisecond))
	if got := holder(t, c, ns); got != b.lead.Identity() {
		t.Fatalf("Lease held by %q after failover, want b", got)
	}

	// Crash: c1 leads through a proxy that is then cut.
	b.stop(t)
	p := newProxy(t, mustHost(t, c.APIServerURL()))
	c1 := startReplica(t, "c1", kubeconfigVia(t, c, p), ns)
	defer c1.stop(t)
	c1.waitLeading(t, 30*time.Second)
	c2 := startReplica(t, "c2", c.Kubeconfig(), ns)
	defer c2.stop(t)
	t0 = time.Now()
	p.cut()
	took := c2.waitLeading(t, 30*time.Second)
	t.Logf("failover after a crash took %s", took.Sub(t0).Round(time.Millisecond))
	c1.mu.Lock()
	ended := c1.ended
	c1.mu.Unlock()
	if ended.IsZero() || ended.After(took) {
		t.Fatalf("the crashed replica's controllers ran until %v, after the new leader started at %v", ended, took)
	}
	if c1.lead.IsLeader() {
		t.Fatal("the crashed replica still says it leads")
	}
	if got := holder(t, c, ns); got != c2.lead.Identity() {
		t.Fatalf("Lease held by %q, want c2", got)
	}
}

func mustHost(t *testing.T, raw string) string {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	return u.Host
}
